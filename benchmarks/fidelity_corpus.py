"""The corpus's error, before and after a change to the model: every published entry replayed now
(``python -m orchestrator fidelity``'s replay) against the errors recorded in
``data/published/errors.json`` (the last accepted model, whose errors every prediction quotes), per
family, and every headline that moved by more than two points. ``--update`` records the current errors
there.

    .venv/bin/python benchmarks/fidelity_corpus.py [--update]

A change to the model is kept when the corpus as a whole agrees better and no family gets worse by more
than another gains (docs/fidelity.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.fidelity.cli import replay_all, summary_table
from orchestrator.fidelity.compare import Row, by_family
from orchestrator.fidelity.corpus import read_corpus

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "data" / "published" / "sglang.jsonl"
BASELINE = REPO / "data" / "published" / "errors.json"  # also what predictions quote their error from


def _rows(data: list[dict]) -> list[Row]:
    return [Row(r["id"], r["metric"], r["measured"], r["predicted"], r["headline"], r["family"], r["layout"],
                r["hardware"]) for r in data]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--update", action="store_true", help="record the current errors as the baseline")
    args = p.parse_args()
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
