"""Candidate terms of a step held to the served SGLang rows out of sample: is a term physical, and does it
help on measurements it did not come from?

For each candidate term (a constant of the cost model with a unit) and each model x GPU group of the
silicon rows: the term's value is fitted on every other group (the least absolute relative error of the
metric it acts on, through its first-order effect on each row), and the held-out group is predicted
again with that value by the simulated engine itself (the whole replay, not the linear estimate). A term
is kept only when its fitted value holds across folds (largest / smallest at most 2: else it is not one
physical quantity) and the held-out errors improve overall without making a group worse than its own
baseline by more than the threshold; otherwise it is dropped, and the table says why.

    .venv/bin/python benchmarks/fidelity_terms.py --from run.json [--term allreduce_wait_us] [--workers N]

``run.json``: the model's current predictions, from ``python -m orchestrator fidelity --silicon --json``.
Every number printed is a prediction of the simulated engine, none a measurement of this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from orchestrator.fidelity.served import Served, predict_row
from orchestrator.fidelity.silicon import SiliconRow, default_csv, read_silicon, to_entry
from simulator.model_spec import load_model_spec
from vocab.assets import models_dir

MAX_SWING = 2.0  # largest / smallest fold value of a physical term
WORSE_BY = 0.02  # a held-out group's median |error| may not grow by more than this (absolute)


@dataclass(frozen=True)
class Term:
    param: str  # the CostParams field
    unit: str
    metric: str  # the served metric it acts on
    what: str
    # first-order change of the metric (ms) per unit of the term, for one row; 0 where it does not act
    sensitivity: Callable[[SiliconRow, int], float]


def _allreduce_sensitivity(row: SiliconRow, layers: int) -> float:
    # two all-reduces a layer, each sigma x sqrt(2 ln tp) longer: a decode step, so TPOT, grows by that
    return 2 * layers * math.sqrt(2 * math.log(row.tp)) / 1000.0 if row.tp > 1 else 0.0


TERMS = {
    "allreduce_wait_us": Term("allreduce_wait_us", "µs", "tpot_ms",
                              "each TP all-reduce inside a forward waits for the slowest rank: "
                              "sigma x sqrt(2 ln tp)", _allreduce_sensitivity),
    "request_path_us": Term("request_path_us", "µs", "ttft_ms",
                            "a request's way from the client to the scheduler and its first token's way "
                            "back", lambda row, layers: 1.0 / 1000.0),
}


def _layers(row: SiliconRow) -> int:
    entry, _ = to_entry(row)
    return load_model_spec(str(models_dir() / entry.parasweep["model"])).num_layers


def fit(rows: list[tuple[SiliconRow, Served, float]], metric: str) -> float:
    """The value (at least 0) minimising the sum of |relative error| of ``metric`` to first order: the
    weighted median of each row's own value (measured - predicted) / sensitivity, each weighted by its
    sensitivity over its measurement. The absolute error, not its square: a group the model misses for
    another reason (a launch not recorded, a client not published) then weighs as little as any other."""
    own = sorted((max((p.measured[metric] - p.parasweep[metric]) / s, 0.0), s / p.measured[metric])
                 for _, p, s in rows)
    half, acc = sum(w for _, w in own) / 2.0, 0.0
    for value, weight in own:
        acc += weight
        if acc >= half:
            return value
    return math.nan


def _median_abs(values: list[float]) -> float:
    return statistics.median(abs(v) for v in values) if values else math.nan


def evaluate(term: Term, served: dict[str, Served], rows: list[SiliconRow], workers: int | None) -> None:
    acting = [(r, served[r.id], term.sensitivity(r, _layers(r))) for r in rows if r.id in served]
    acting = [x for x in acting if x[2] > 0]
    groups = sorted({r.group for r, _, _ in acting})
    folds = {g: fit([x for x in acting if x[0].group != g], term.metric) for g in groups}
    print(f"\n{term.param} ({term.unit}): {term.what}; acts on {term.metric.removesuffix('_ms').upper()} of "
          f"{len(acting)} rows in {len(groups)} groups; all rows: {fit(acting, term.metric):.2f} {term.unit}")
    jobs = [(r, folds[r.group]) for r, _, _ in acting]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        again = list(pool.map(_rerun, [(term.param, v, r) for r, v in jobs], chunksize=4))
    after: dict[str, list[float]] = {}
    before: dict[str, list[float]] = {}
    for (row, _), (kind, value) in zip(jobs, again, strict=True):
        if kind != "ok":
            continue
        s = value  # type: ignore[assignment]
        after.setdefault(row.group, []).append(s.error("parasweep", term.metric))  # type: ignore[union-attr]
        before.setdefault(row.group, []).append(served[row.id].error("parasweep", term.metric) or 0.0)
    print(f"{'held-out group':36} {'rows':>4} {'fitted on the others':>21}   "
          "held-out median |error| before → after")
    worse = []
    for g in groups:
        b, a = _median_abs(before.get(g, [])), _median_abs(after.get(g, []))
        if a > b + WORSE_BY:
            worse.append(g)
        print(f"{g:36} {len(after.get(g, [])):>4} {folds[g]:>17.2f} {term.unit:3}   "
              f"{100 * b:5.1f} % → {100 * a:5.1f} %")
    every_before = [e for v in before.values() for e in v]
    every_after = [e for v in after.values() for e in v]
    values = [v for v in folds.values() if v > 0]
    swing = max(values) / min(values) if values and min(values) > 0 else math.inf
    print(f"{'all':36} {len(every_after):>4} {'':>21}   {100 * _median_abs(every_before):5.1f} % → "
          f"{100 * _median_abs(every_after):5.1f} %")
    reasons = []
    if swing > MAX_SWING:
        reasons.append(f"its fitted value swings {swing:.1f}x across folds")
    if _median_abs(every_after) >= _median_abs(every_before):
        reasons.append("the held-out errors do not improve overall")
    if worse:
        reasons.append(f"it makes {', '.join(worse)} worse")
    print("verdict: " + ("kept" if not reasons else "dropped: " + "; ".join(reasons)))


def _rerun(args: tuple[str, float, SiliconRow]) -> tuple[str, object]:
    param, value, row = args
    return predict_row(row, with_aic=False, params={param: value})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="from_json", required=True, metavar="RUN.json",
                   help="the current predictions (python -m orchestrator fidelity --silicon --json)")
    p.add_argument("--term", action="append", choices=sorted(TERMS), help="the terms to try (default: all)")
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args()
    keep = {f for f in Served.__dataclass_fields__}
    served = {r["id"]: Served(**{k: v for k, v in r.items() if k in keep})
              for r in json.loads(Path(args.from_json).read_text())["compared"]}
    rows, _ = read_silicon(default_csv())
    for name in args.term or sorted(TERMS):
        evaluate(TERMS[name], served, rows, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
