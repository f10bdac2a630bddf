"""Predicted throughput of Kimi K2 on the PCIe box: PP8 at C = 1, 8 and 32, pp_async_batch_depth 0 and 8,
CUDA graphs on and off, with every stage's busy fraction over the steady window, and TP8 beside it.

Virtual time only (``predict_point``), measured step costs (the box's kernel tables), 4·C requests of
1,024 prompt and 256 output tokens each, sent at once. The "after" columns of docs/simulator.md,
"Per-stage host costs: before and after", are this script's output:

    .venv/bin/python benchmarks/pp_predictions.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.predict import predict_point
from vocab.load import LoadPoint, RequestSpec
from vocab.telemetry import per_stage

REPO = Path(__file__).resolve().parent.parent
SPEC = RequestSpec(api="generate", input_len=1024, output_len=256, seed=0)
CONCURRENCY = (1, 8, 32)


def argv(layout: str, depth: int, graphs: bool) -> list[str]:
    out = ["--model-path", str(REPO / "models" / "kimi-k2"), "--sim-hardware", "rtx-pro-6000-pcie-x8",
           "--sim-step-costs", "measured"]
    out += ["--tp-size", "8"] if layout == "tp8" else ["--pp-size", "8", "--pp-async-batch-depth", str(depth)]
    return out + ([] if graphs else ["--disable-cuda-graph"])


def row(layout: str, depth: int, graphs: bool, c: int) -> str:
    point = LoadPoint(concurrency=c, num_requests=4 * c, warmup_requests=0, ramp_s=0.0)
    m = predict_point(argv(layout, depth, graphs), point, SPEC).metrics
    pp = 1 if layout == "tp8" else 8
    busy = " ".join(f"{100 * m[per_stage(s, 'activity_mean')]:.0f}" for s in range(pp))
    name = "TP8" if layout == "tp8" else f"PP8 d{depth}"
    return (f"| {name} | {'on' if graphs else 'off'} | {c} | {m['output_tok_s']:.0f} | "
            f"{m['tpot_mean_ms']:.1f} | {busy} |")


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
                            ).parse_args()
    print("| layout | graphs | C | output tok/s | TPOT ms | stage busy % (0 … 7) |")
    print("|---|---|---|---|---|---|")
    for graphs in (True, False):
        for depth in (0, 8):
            for c in CONCURRENCY:
                print(row("pp8", depth, graphs, c), flush=True)
        for c in CONCURRENCY:
            print(row("tp8", 0, graphs, c), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
