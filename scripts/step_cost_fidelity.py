"""Static-batch step times: parasweep's model (measured step costs and the roofline) beside
AIConfigurator's own static estimate for the same model, GPU, layout and batch.

AIConfigurator's numbers are the fixture ``tests/fixtures/aiconfigurator/static-0.12.0.json`` (recorded once
by ``scripts/aiconfigurator_static.py``; how it computes them: that folder's README). parasweep's are one
prefill forward of the whole batch and one decode step at the mean context AIConfigurator averages over
(prompt + half the output), each through every stage with nothing queued: ``simulator/estimates.py``.

    .venv/bin/python scripts/step_cost_fidelity.py [--pipeline]   # the Markdown tables of docs/simulator.md
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from simulator.costs import decode_shape, prefill_shape
from simulator.estimates import decode_step, static_prefill_s
from simulator.predict import load_config, predict_point
from simulator.sim_config import SimConfig
from vocab.load import LoadPoint, RequestSpec
from vocab.telemetry import STAGE_ACTIVITY_MEAN

REPO = Path(__file__).resolve().parent.parent

FIXTURE = REPO / "tests" / "fixtures" / "aiconfigurator" / "static-0.12.0.json"
# AIConfigurator's model and system -> parasweep's model folder and hardware profile
MODELS = {"moonshotai/Kimi-K2-Instruct": "kimi-k2", "meta-llama/Meta-Llama-3.1-70B": "llama-3.1-70b",
          "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b"}
HARDWARE = {"rtx_pro_6000_server": "rtx-pro-6000-pcie-x8", "h200_sxm": "h200-nvlink-x8",
            "h100_sxm": "h100-sxm-x8"}


@dataclass(frozen=True)
class Row:
    name: str  # "kimi-k2 tp8 rtx_pro_6000_server"
    batch: int
    phase: str  # prefill | decode
    aiconfigurator_ms: float
    measured_ms: float  # parasweep, measured step costs
    roofline_ms: float  # parasweep, roofline step costs
    host_bound: bool  # parasweep: some stage's eager dispatch outlasts its GPU work (host cost dominates)
    kernels_ms: float = 0.0  # parasweep's kernels and collectives alone (measured step costs): what
    # AIConfigurator prices; the step adds the host's dispatch of an eager forward to them

    @property
    def diff(self) -> float:
        """The kernels' time against AIConfigurator's (which prices no host)."""
        return self.kernels_ms / self.aiconfigurator_ms - 1.0


def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def _kernels_ms(cfg: SimConfig, shape) -> float:  # type: ignore[no-untyped-def]
    """Every stage's kernels and collectives for ``shape`` and the hops between stages, in ms."""
    parts = [cfg.cost.breakdown(s, shape) for s in range(cfg.par.pp)]
    return 1e3 * (sum(p["gpu"] + p["comm"] for p in parts) + sum(cfg.cost.hop_times(shape)))


def _host_bound(cfg: SimConfig, shape) -> bool:  # type: ignore[no-untyped-def]
    """Some stage's eager dispatch outlasts its GPU work: the host sets that stage's time."""
    parts = [cfg.cost.breakdown(s, shape) for s in range(cfg.par.pp)]
    return any(p["eager"] and p["host"] > p["gpu"] + p["comm"] for p in parts)


def argv_of(c: dict) -> list[str]:
    return ["--model-path", str(REPO / "models" / MODELS[c["model"]]),
            "--sim-hardware", HARDWARE[c["system"]], "--tp-size", str(c["tp"]), "--pp-size", str(c["pp"]),
            "--ep-size", str(c["moe_ep"] or 1)]


def rows() -> list[Row]:
    data = fixture()
    isl, osl = int(data["isl"]), int(data["osl"])
    out = []
    for c in data["configs"]:
        argv = argv_of(c)
        measured = load_config([*argv, "--sim-step-costs", "measured"])
        roofline = load_config([*argv, "--sim-step-costs", "roofline"])
        b = int(c["batch"])
        prefill = prefill_shape([(isl, 0)] * b)
        out.append(Row(c["name"], b, "prefill", float(c["prefill_ms"]),
                       1e3 * static_prefill_s(measured, b, isl), 1e3 * static_prefill_s(roofline, b, isl),
                       _host_bound(measured, prefill), _kernels_ms(measured, prefill)))
        ctx = isl + osl // 2
        step, decode = decode_step(measured, b, ctx).step_s, decode_shape([ctx] * b)
        host = _host_bound(measured, decode)  # a decode step replayed from a graph is the GPU's
        out.append(Row(c["name"], b, "decode", float(c["decode_step_ms"]),
                       1e3 * step, 1e3 * decode_step(roofline, b, ctx).step_s,
                       host, _kernels_ms(measured, decode) if host else 1e3 * step))
    return out


def pipeline_rows() -> list[str]:
    """Where the two must differ: AIConfigurator's PP throughput (a perfect pipeline: the batch's tokens
    per TPOT, times pp) against the discrete-event model's closed loop of the same batch, with how busy
    each stage was."""
    data = fixture()
    lines = ["| configuration | batch | AIConfigurator tok/s | parasweep tok/s (virtual time) | "
             "stage busy (mean) | micro-batches in flight |", "|---|---|---|---|---|---|"]
    for c in data["configs"]:
        if c["pp"] == 1:
            continue
        b = int(c["batch"])
        m = predict_point([*argv_of(c), "--sim-step-costs", "measured"],
                          LoadPoint(num_requests=2 * b, concurrency=b, warmup_requests=b),
                          RequestSpec(api="generate", input_len=int(data["isl"]),
                                      output_len=int(data["osl"]))).metrics
        lines.append(f"| {c['name']} | {b} | {c['tokens_per_s']:.0f} | {m['output_tok_s']:.0f} | "
                     f"{m[STAGE_ACTIVITY_MEAN]:.2f} | {m['sim_peak_microbatches_in_flight']:.0f} |")
    return lines


def main() -> None:
    print("| configuration | batch | phase | AIConfigurator ms | parasweep measured ms | diff | "
          "parasweep roofline ms | host-bound |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows():
        print(f"| {r.name} | {r.batch} | {r.phase} | {r.aiconfigurator_ms:.2f} | {r.measured_ms:.2f} | "
              f"{100 * r.diff:+.0f}% | {r.roofline_ms:.2f} | {'yes' if r.host_bound else ''} |")
    if "--pipeline" in sys.argv:
        print()
        print("\n".join(pipeline_rows()))


if __name__ == "__main__":
    main()
