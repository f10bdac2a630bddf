"""The search's answer for disaggregated deployments beside a static rate match (the way offline
estimators such as AIConfigurator price them: ``simulator/disagg/rate_match.py``), for Llama-3.1-70B on
the two-node H100 profile, 2,000-token prompts and 200-token outputs, TTFT p99 under 2 s and ITL p99
under 40 ms by default (``--ttft-ms``, ``--itl-ms``; the ``search-llama-70b-2nodes-pd`` preset's question).

For each deployment: the search's highest load within the SLOs and its output tokens per GPU there
(discrete-event, in virtual time, queues and KV transfer included), the rate match's tokens per GPU
(each role alone at a static batch, the smaller side derated), and their ratio. The best aggregated
layout of the same search is printed for reference (the rate match has no aggregated counterpart here).
Everything is the simulator's prediction, not a measurement.

    .venv/bin/python benchmarks/pd_rate_match.py [--chunk 2048] [--ttft-ms 2000] [--itl-ms 40]
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from orchestrator.config.schema import ParasweepConf, world_size
from orchestrator.prediction.modelled import apply_change, configured_deployment
from orchestrator.search.evaluate import Outcome, Screened, check_settings, evaluate, screen
from orchestrator.search.runner import search_base
from simulator.disagg.rate_match import rate_match
from vocab.hardware import load_hardware

DEPLOYMENTS = [("1p1d", 4), ("1p1d", 8), ("1p3d", 4), ("2p1d", 4), ("3p1d", 4)]
AGGREGATED = [{"pd": "none", "tp.size": tp, "pp.size": pp, "server.extra_args.enable-mixed-chunk": mixed,
               "server.chunked_prefill_size": chunk}
              for tp, pp in ((4, 1), (8, 1), (8, 2)) for mixed in (False, True) for chunk in (512, 2048)]


def base(slo: dict[str, float]) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = "llama-3.1-70b", "models/llama-3.1-70b"
    cfg.hardware = load_hardware("h100-sxm-x8-2nodes-ib")
    cfg.tp.size = 8
    cfg.workload = dataclasses.replace(cfg.workload, input_len=2000, output_len=200)
    cfg.search.slo, cfg.search.max_concurrency = dict(slo), 256
    return search_base(cfg)


def judged(cfg: ParasweepConf, change: dict[str, Any]) -> Outcome:
    settings = check_settings(cfg)
    screened = screen(cfg, change, settings)
    if not isinstance(screened, Screened):
        return screened
    return evaluate(cfg, screened, settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk", type=int, default=2048, help="server.chunked_prefill_size of every server")
    parser.add_argument("--ttft-ms", type=float, default=2000.0, help="the bound on TTFT p99")
    parser.add_argument("--itl-ms", type=float, default=40.0, help="the bound on ITL p99")
    args = parser.parse_args()
    slo = {"ttft_p99_ms": args.ttft_ms, "itl_p99_ms": args.itl_ms}
    cfg = base(slo)
    print(f"Llama-3.1-70B, two 8xH100 nodes, 2,000 in / 200 out, TTFT p99 <= {args.ttft_ms:g} ms, "
          f"ITL p99 <= {args.itl_ms:g} ms, chunked prefill {args.chunk}; simulator's predictions\n")
    print("| deployment | GPUs | search: tok/s/GPU at load (held by) | rate match: tok/s/GPU (bound by; "
          "prefill batch, decode batch, assumed TTFT) | rate match / search |")
    print("|---|---|---|---|---|")
    for option, tp in DEPLOYMENTS:
        change = {"pd": option, "tp.size": tp, "server.chunked_prefill_size": args.chunk}
        changed, env = apply_change(cfg, change)
        layout = configured_deployment(changed, env)
        assert layout.prefill is not None
        gpus = world_size(changed)
        match = rate_match(layout.prefill, layout.decode, layout.prefill_workers, layout.decode_workers,
                           2000, 200, args.ttft_ms / 1000, args.itl_ms / 1000)
        outcome = judged(cfg, change)
        found = (f"{outcome.score:,.1f} at c{outcome.concurrency} ({outcome.limit})"
                 if outcome.score is not None else outcome.status + ": " + outcome.reason)
        ratio = f"{match.output_tok_s / gpus / outcome.score:.2f}" if outcome.score else "n/a"
        print(f"| {option.upper()} TP{tp} | {gpus} | {found} | {match.output_tok_s / gpus:,.1f} "
              f"({match.bound_by}; {match.prefill_batch}, {match.decode_batch}, "
              f"{match.ttft_s * 1000:,.0f} ms) | {ratio} |")
    best = max((o for o in (judged(cfg, c) for c in AGGREGATED) if o.score is not None),
               key=lambda o: o.score or 0.0)
    print(f"\nBest aggregated of {len(AGGREGATED)} tried: {best.change} on {best.gpus} GPUs: "
          f"{best.score:,.1f} tok/s/GPU at c{best.concurrency} ({best.limit})")


if __name__ == "__main__":
    main()
