"""The corpus's error, before and after a change to the model: every published entry replayed now
(``python -m orchestrator fidelity``'s replay) against the errors recorded in
``data/published/errors.json`` (the last accepted model, whose errors every prediction quotes), per
family, and every headline that moved by more than two points. ``--update`` records the current errors
there.

    .venv/bin/python benchmarks/fidelity_corpus.py [--update]
    .venv/bin/python benchmarks/fidelity_corpus.py --silicon [--backend vllm] [--from OUT.json] [--update]

``--silicon``: the served SGLang rows of aiconfigurator-core's silicon CSV instead, parasweep's median
|error| beside AIConfigurator's on the same rows, TTFT and TPOT, per GPU and overall (the disaggregated
rows per model x GPU group), before (the rows recorded in ``data/published/silicon_errors.json``) and
now; ``--from`` reads a run already written by ``python -m orchestrator fidelity --silicon --json
OUT.json`` instead of replaying every row again (a quarter of an hour on two cores). ``--backend vllm``:
the served vLLM rows, recorded in ``data/published/silicon_vllm_errors.json`` (what a vLLM trial's
bands quote).

A change to the model is kept when the corpus as a whole agrees better and no family gets worse by more
than another gains (docs/fidelity.md).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from orchestrator.fidelity.cli import replay_all, summary_table
from orchestrator.fidelity.compare import Row, by_family
from orchestrator.fidelity.corpus import read_corpus
from orchestrator.fidelity.served import Served, predict_all, side_by_side
from orchestrator.fidelity.served_cli import side_table
from orchestrator.fidelity.silicon import default_csv, read_silicon
from orchestrator.fidelity.silicon_disagg import read_disagg

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "data" / "published" / "sglang.jsonl"
BASELINE = REPO / "data" / "published" / "errors.json"  # also what predictions quote their error from
SILICON_BASELINE = {"sglang": REPO / "data" / "published" / "silicon_errors.json",
                    "vllm": REPO / "data" / "published" / "silicon_vllm_errors.json"}


def _rows(data: list[dict]) -> list[Row]:
    return [Row(r["id"], r["metric"], r["measured"], r["predicted"], r["headline"], r["family"], r["layout"],
                r["hardware"]) for r in data]


def _served(path: str | None, backend: str = "sglang") -> tuple[list[Served], list[Served]]:
    """(aggregated rows, disaggregated rows): read from a run's JSON, or replayed now."""
    if path:
        keep = {f.name for f in fields(Served)}
        data = json.loads(Path(path).read_text())
        disagg = data.get("disaggregated", [])
        # `fidelity --silicon --json` nests the disaggregated rows with their summary; the baseline lists them
        disagg = disagg["compared"] if isinstance(disagg, dict) else disagg
        return ([Served(**{k: v for k, v in r.items() if k in keep}) for r in data.get("compared", [])],
                [Served(**{k: v for k, v in r.items() if k in keep}) for r in disagg])
    rows, _ = read_silicon(default_csv(), backend)
    disagg_rows = read_disagg(default_csv(), backend)[0]
    return predict_all(rows)[0], predict_all(disagg_rows)[0]


def _silicon(path: str | None, update: bool, backend: str) -> int:
    served, disagg = _served(path, backend)
    baseline = SILICON_BASELINE[backend]
    if baseline.is_file():
        before, before_disagg = _served(str(baseline))
        print(f"before (recorded: {len(before)} rows, {len(before_disagg)} disaggregated)")
        print(side_table(side_by_side(before, lambda s: s.system), "GPU"))
        print(side_table(side_by_side(before_disagg, lambda s: s.group), "disaggregated: model x GPU group"))
        print()
    print(f"now ({len(served)} rows, {len(disagg)} disaggregated)")
    print(side_table(side_by_side(served, lambda s: s.system), "GPU"))
    print(side_table(side_by_side(disagg, lambda s: s.group), "disaggregated: model x GPU group"))
    print("(median |error|; 'rows both': the rows AIConfigurator estimates too, both medians over them)")
    if update:
        baseline.write_text(json.dumps({"compared": [s.as_json() for s in served],
                                        "disaggregated": [s.as_json() for s in disagg]}, indent=0) + "\n")
        print(f"\nbaseline written: {baseline}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--update", action="store_true", help="record the current errors as the baseline")
    p.add_argument("--silicon", action="store_true", help="the served rows of the silicon CSV (module doc)")
    p.add_argument("--backend", choices=sorted(SILICON_BASELINE), default="sglang",
                   help="with --silicon: the engine whose served rows are compared")
    p.add_argument("--from", dest="from_json", metavar="OUT.json",
                   help="with --silicon: a run written by `fidelity --silicon --json` instead of a replay")
    args = p.parse_args()
    if args.silicon:
        return _silicon(args.from_json, args.update, args.backend)
    rows, _, skipped, _ = replay_all(read_corpus(CORPUS))
    print(f"{len({r.id for r in rows})} entries compared, {len(skipped)} skipped\n")
    if BASELINE.is_file():
        before = _rows(json.loads(BASELINE.read_text())["compared"])
        print("before (baseline)")
        print(summary_table(by_family(before)))
        print("\nafter (this model)")
        print(summary_table(by_family(rows)))
        old = {(r.id, r.metric): r for r in before}
        moved = [(r, old[r.id, r.metric]) for r in rows if r.headline and (r.id, r.metric) in old
                 and abs(abs(r.error) - abs(old[r.id, r.metric].error)) > 0.02]
        if moved:
            print("\nheadlines that moved (error before -> after)")
            for now, was in moved:
                print(f"  {now.id:58} {now.metric:18} {100 * was.error:+5.0f}% -> {100 * now.error:+5.0f}%")
    else:
        print(summary_table(by_family(rows)))
    if args.update:
        BASELINE.write_text(json.dumps({"compared": [r.as_json() for r in rows]}, indent=0) + "\n")
        print(f"\nbaseline written: {BASELINE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
