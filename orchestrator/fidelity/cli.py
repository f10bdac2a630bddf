"""``python -m orchestrator fidelity [--published FILE | --silicon [CSV] | --forward [FILE]] [--json OUT]``:
every published entry predicted the way it was measured, predicted against measured per metric, and the
error per family. ``--silicon`` replays the served SGLang runs aiconfigurator-core ships, beside
AIConfigurator's own estimate of each; ``--forward`` the published forward-only step timings.

Every entry is either compared or skipped with its reason. The prediction is the simulated engine's,
in virtual time: nothing is launched and nothing here is a measurement of this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.fidelity.catalog import NotModelled
from orchestrator.fidelity.compare import CHECKS, RELATIVE, Row, Summary, by_family, rows_for
from orchestrator.fidelity.corpus import Entry, read_corpus

DEFAULT_CORPUS = "data/published/sglang.jsonl"  # the shipped corpus (also found outside a checkout)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchestrator fidelity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--published", default=DEFAULT_CORPUS, metavar="FILE",
                   help=f"JSON lines of measured runs (default: {DEFAULT_CORPUS}; format: docs/fidelity.md)")
    p.add_argument("--silicon", nargs="?", const="", default=None, metavar="CSV",
                   help="replay the served SGLang runs of aiconfigurator-core's silicon_sample.csv (default: "
                        "the installed file) beside AIConfigurator's estimate of each (docs/fidelity.md)")
    p.add_argument("--backend", choices=["sglang", "vllm"], default="sglang",
                   help="with --silicon: the engine whose served rows are replayed (vllm: on the simulated "
                        "engine playing vLLM)")
    p.add_argument("--no-aiconfigurator", action="store_true",
                   help="with --silicon: leave AIConfigurator's estimates out (faster)")
    p.add_argument("--forward", nargs="?", const="", default=None, metavar="FILE",
                   help="replay published forward-only step timings (SGLang bench_one_batch; default: the "
                        "shipped data/published/forward.jsonl)")
    p.add_argument("--pairs", nargs="?", const="", default=None, metavar="FILE",
                   help="replay published pairs of layouts (PP against TP) and judge the predicted order "
                        "(default: the shipped data/published/vllm_pp.jsonl, vLLM's)")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="write the comparison as JSON to OUT")
    p.add_argument("--only", action="append", default=[], metavar="ID",
                   help="replay only the entries whose id contains ID (repeatable)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes replaying entries side by side (default: one per CPU)")
    return p


def _one(entry: Entry) -> tuple[str, object]:
    """("ok", (rows, checks, notes)) or ("skip", reason), for a worker process."""
    from orchestrator.fidelity.replay import predict

    try:
        plan, predicted = predict(entry)
        if entry.relative_to:  # a ratio to another run: that run replayed too, and the ratio predicted
            reference = entry.reference()
            ref_plan, ref = predict(reference)
            predicted |= {k: predicted[base] / ref[base] for k in RELATIVE
                          if (base := k.removesuffix("_relative")) in predicted and ref.get(base)}
            p = reference.parallelism
            plan.notes.append(f"relative to {entry.relative_to.get('id', 'another run')}: TP{p.tp} PP{p.pp} "
                              f"on {ref_plan.hardware}, replayed the same way")
    except NotModelled as e:
        return "skip", str(e)
    except (ValueError, RuntimeError) as e:  # e.g. lengths the workload cannot draw, a run that never drains
        return "skip", f"the replay failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    rows = rows_for(entry, predicted, plan.family, plan.layout, plan.hardware)
    measured = entry.numbers()
    checks = [{"id": entry.id, "metric": k, "measured": measured[k], "predicted": predicted[k]}
              for k in CHECKS if k in measured and k in predicted]
    if not rows:
        return "skip", "no published number the replay computes (" + ", ".join(sorted(measured)) + ")"
    return "ok", (rows, checks, plan.notes)


def replay_all(entries: Sequence[Entry], workers: int | None = None
               ) -> tuple[list[Row], list[dict], list[dict], dict[str, list[str]]]:
    """(rows, checks, skipped, notes per id) for every entry, replayed on ``workers`` processes."""
    rows: list[Row] = []
    checks: list[dict] = []
    skipped: list[dict] = []
    notes: dict[str, list[str]] = {}
    if workers == 1:
        results = [_one(e) for e in entries]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_one, entries))
    for entry, (kind, value) in zip(entries, results, strict=True):
        if kind == "skip":
            skipped.append({"id": entry.id, "reason": value})
            continue
        r, c, n = value  # type: ignore[misc]
        rows += r
        checks += c
        if n:
            notes[entry.id] = n
    return rows, checks, skipped, notes


def _pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.0f} %"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def table(rows: Sequence[Row]) -> str:
    lines = [f"{'entry':58} {'metric':22} {'measured':>11} {'predicted':>11} {'error':>7}"]
    for r in rows:
        mark = " *" if r.headline else ""
        lines.append(f"{r.id[:58]:58} {r.metric:22} {_num(r.measured):>11} {_num(r.predicted):>11} "
                     f"{100 * r.error:+6.0f}%{mark}")
    return "\n".join(lines)


def summary_table(summaries: Sequence[Summary]) -> str:
    lines = [f"{'family':40} {'entries':>7} {'metrics':>7} {'median |err|':>12} {'headline median':>15} "
             f"{'headline max':>12}"]
    for s in summaries:
        lines.append(f"{s.label[:40]:40} {s.entries:>7} {s.metrics:>7} {_pct(s.median_abs_error):>12} "
                     f"{_pct(s.headline_median_abs_error):>15} {_pct(s.headline_max_abs_error):>12}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers {args.workers}: invalid; valid: 1 or more processes")
    if args.json_out and not Path(args.json_out).resolve().parent.is_dir():
        parser.error(f"--json {args.json_out}: invalid; valid: a file in an existing folder")
    if sum(x is not None for x in (args.silicon, args.forward, args.pairs)) > 1:
        parser.error("--silicon, --forward and --pairs: one at a time")
    if args.pairs is not None:
        from orchestrator.fidelity.pairs import run_pairs

        try:
            return run_pairs(args.pairs or None, args.json_out)
        except UserError as e:
            print(f"fidelity: {e}", file=sys.stderr)
            return 2
    if args.silicon is not None:
        from orchestrator.fidelity.served_cli import run_silicon

        return run_silicon(args.silicon or None, args.only, args.workers, not args.no_aiconfigurator,
                           args.json_out, args.backend)
    if args.forward is not None:
        from orchestrator.fidelity.forward import main as forward_main

        return forward_main(([args.forward] if args.forward else [])
                            + (["--json", args.json_out] if args.json_out else []))
    if args.published == DEFAULT_CORPUS and not Path(DEFAULT_CORPUS).is_file():
        from vocab.assets import published_dir

        args.published = str(published_dir() / "sglang.jsonl")
    try:
        entries = read_corpus(args.published)
    except UserError as e:
        print(f"fidelity: {e}", file=sys.stderr)
        return 2
    if args.only:
        entries = [e for e in entries if any(s in e.id for s in args.only)]
        if not entries:
            print(f"fidelity: --only {' '.join(args.only)}: no entry of {args.published} matches",
                  file=sys.stderr)
            return 2
    print(f"fidelity: replaying {len(entries)} published run(s) of {args.published} on the simulated engine "
          "(predictions in virtual time, not measurements)", flush=True)
    rows, checks, skipped, notes = replay_all(entries, args.workers)
    print(table(rows))
    print("(* = the entry's headline metric; error = predicted / measured - 1)")
    if checks:
        worst = max(abs(c["predicted"] / c["measured"] - 1) for c in checks)
        print(f"replay check: the published token totals of {len({c['id'] for c in checks})} run(s) "
              f"reproduced within {100 * worst:.1f} %")
    for ident, why in ((s["id"], s["reason"]) for s in skipped):
        print(f"skipped {ident}: {why}")
    for ident, ns in notes.items():
        for n in ns:
            print(f"assumed for {ident}: {n}")
    print()
    print(summary_table(by_family(rows)))
    if args.json_out:
        out = {"compared": [r.as_json() for r in rows], "skipped": skipped, "checks": checks,
               "notes": notes, "summary": [s.__dict__ for s in by_family(rows)]}
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"written: {args.json_out}")
    return 0
