"""Candidate terms of a step held to the served SGLang rows out of sample: is a term physical, and does it
help on measurements it did not come from?

For each candidate term (a constant of the cost model with a unit) and each model x GPU group of the
silicon rows: the term's value is fitted on every other group (the least absolute relative error of the
metric it acts on, through its first-order effect on each row), and the held-out group is predicted
again with that value by the simulated engine itself (the whole replay, not the linear estimate). A term
is kept only when its fitted value holds across folds (largest / smallest at most 2: else it is not one
physical quantity) and the held-out errors improve overall, no group getting worse by more than another
gains (the rule every change of the model follows, docs/fidelity.md); otherwise it is dropped, and the
table says why.

    .venv/bin/python benchmarks/fidelity_terms.py --from run.json [--term allreduce_wait_us] [--workers N]

``run.json``: the model's current predictions, from ``python -m orchestrator fidelity --silicon --json``.
Every number printed is a prediction of the simulated engine, none a measurement of this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from orchestrator.fidelity.cli import replay_all
from orchestrator.fidelity.corpus import read_corpus
from orchestrator.fidelity.served import Served, calibration_file, predict_row
from orchestrator.fidelity.silicon import SiliconRow, default_csv, read_silicon, to_entry
from orchestrator.fidelity.trust import THROUGHPUT, TPOT, TTFT, kind_of
from simulator.model_spec import load_model_spec
from vocab.assets import models_dir

MAX_SWING = 2.0  # largest / smallest fold value of a physical term


CORPUS = Path(__file__).resolve().parent.parent / "data" / "published" / "sglang.jsonl"
CORPUS_WORSE_BY = 0.02  # a kept term may not make a kind of the corpus's numbers worse by more than this


def _losers(changes: dict[str, float]) -> list[str]:
    """The groups whose held-out error grew (``changes``: after - before) by more than the largest gain
    of another group."""
    gain = max((-c for c in changes.values()), default=0.0)
    return [g for g, c in changes.items() if c > max(gain, 0.0)]


@dataclass(frozen=True)
class Term:
    param: str  # the CostParams field
    unit: str
    metric: str  # the served metric it acts on ("" : both, judged on their sum of medians)
    what: str
    # first-order change of the metric (ms) per unit of the term, for one row; 0 where it does not act
    sensitivity: Callable[[SiliconRow, int], float] | None = None
    # a term whose effect is not linear (a max of host and GPU time) is tried at each of these values with
    # the whole replay, every row, and each fold takes the value best on the other groups
    grid: tuple[float, ...] = ()


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
    "prefill_overlap_loss": Term("prefill_overlap_loss", "", "",
                               "the share of an eager prefill's shorter side (host dispatch or GPU work) "
                               "that does not overlap the other", grid=(0.0, 0.25, 0.5, 0.75, 1.0)),
    "host_op_us": Term("host_op_us", "µs", "",
                       "the host's time per kernel of an eager forward (a prefill, a decode beyond the "
                       "captured graphs) beyond the driver's launch", grid=(20.0, 40.0, 70.0, 110.0, 160.0)),
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


def _score(results: list[Served]) -> float:
    """Median |error| of TTFT plus that of TPOT."""
    return sum(_median_abs([s.error("parasweep", m) or 0.0 for s in results]) for m in ("ttft_ms", "tpot_ms"))


def evaluate_grid(term: Term, served: dict[str, Served], rows: list[SiliconRow], workers: int | None) -> None:
    todo = [r for r in rows if r.id in served]
    at: dict[float, dict[str, Served]] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for value in term.grid:
            out = pool.map(_rerun, [(term.param, value, r) for r in todo], chunksize=4)
            at[value] = {r.id: s for r, (kind, s) in zip(todo, out, strict=True) if kind == "ok"}  # type: ignore[misc]
    groups = sorted({r.group for r in todo})
    by_group = {g: [r.id for r in todo if r.group == g] for g in groups}
    print(f"\n{term.param} ({term.unit}): {term.what}; tried at {', '.join(f'{v:g}' for v in term.grid)} "
          f"on all {len(todo)} rows (the whole replay at each)")
    print(f"{'held-out group':36} {'rows':>4} {'best on the others':>19}   "
          "held-out median |error| TTFT, TPOT: before → after")
    folds: dict[str, float] = {}
    changes: dict[str, float] = {}
    every_before: list[Served] = []
    every_after: list[Served] = []
    for g in groups:
        others = [i for h in groups if h != g for i in by_group[h]]
        folds[g] = min(term.grid, key=lambda v: _score([at[v][i] for i in others if i in at[v]]))
        before = [served[i] for i in by_group[g]]
        after = [at[folds[g]][i] for i in by_group[g] if i in at[folds[g]]]
        every_before += before
        every_after += after
        b = [_median_abs([s.error("parasweep", m) or 0.0 for s in before]) for m in ("ttft_ms", "tpot_ms")]
        a = [_median_abs([s.error("parasweep", m) or 0.0 for s in after]) for m in ("ttft_ms", "tpot_ms")]
        changes[g] = sum(a) - sum(b)
        print(f"{g:36} {len(after):>4} {folds[g]:>15g} {term.unit:3}   "
              f"{100 * b[0]:5.1f} %, {100 * b[1]:4.1f} % → {100 * a[0]:5.1f} %, {100 * a[1]:4.1f} %")
    b = [_median_abs([s.error("parasweep", m) or 0.0 for s in every_before]) for m in ("ttft_ms", "tpot_ms")]
    a = [_median_abs([s.error("parasweep", m) or 0.0 for s in every_after]) for m in ("ttft_ms", "tpot_ms")]
    print(f"{'all':36} {len(every_after):>4} {'':>19}   {100 * b[0]:5.1f} %, {100 * b[1]:4.1f} % → "
          f"{100 * a[0]:5.1f} %, {100 * a[1]:4.1f} %")
    values = sorted(folds.values())
    worse = _losers(changes)
    reasons = []
    if values[-1] / values[0] > MAX_SWING:
        reasons.append(f"its value swings {values[-1] / values[0]:.1f}x across folds")
    if sum(a) >= sum(b):
        reasons.append("the held-out errors do not improve overall")
    if worse:
        reasons.append(f"it makes {', '.join(worse)} worse by more than another group gains")
    if not reasons and not corpus_check(term.param, statistics.median(values), workers):
        reasons.append("the published corpus disagrees")
    print("verdict: " + ("kept" if not reasons else "dropped: " + "; ".join(reasons)))


def evaluate(term: Term, served: dict[str, Served], rows: list[SiliconRow], workers: int | None) -> None:
    if term.grid:
        evaluate_grid(term, served, rows, workers)
        return
    assert term.sensitivity is not None
    sensitivity = term.sensitivity
    acting = [(r, served[r.id], sensitivity(r, _layers(r))) for r in rows if r.id in served]
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
    changes: dict[str, float] = {}
    for g in groups:
        b, a = _median_abs(before.get(g, [])), _median_abs(after.get(g, []))
        changes[g] = a - b
        print(f"{g:36} {len(after.get(g, [])):>4} {folds[g]:>17.2f} {term.unit:3}   "
              f"{100 * b:5.1f} % → {100 * a:5.1f} %")
    every_before = [e for v in before.values() for e in v]
    every_after = [e for v in after.values() for e in v]
    worse = _losers(changes)
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
        reasons.append(f"it makes {', '.join(worse)} worse by more than another group gains")
    value = fit(acting, term.metric)
    bound = _smallest(term.metric, [p for _, p, _ in acting])
    effect = max(s * value for _, _, s in acting)
    if effect > bound[0]:
        what = term.metric.removesuffix("_ms").upper()
        reasons.append(f"it would add {effect:.0f} ms to a {what} measured at {bound[0]:.1f} ms in all "
                       f"({bound[1]})")
    if not reasons and not corpus_check(term.param, value, workers):
        reasons.append("the published corpus disagrees")
    print("verdict: " + ("kept" if not reasons else "dropped: " + "; ".join(reasons)))


def _rerun(args: tuple[str, float, SiliconRow]) -> tuple[str, object]:
    param, value, row = args
    return predict_row(row, with_aic=False, params={param: value})


def _smallest(metric: str, served: list[Served]) -> tuple[float, str]:
    """The smallest measured value of ``metric`` in the served rows and the published corpus (its mean or
    median), and whose: no term may add more than that to a row, which measured all of it."""
    kind = TTFT if "ttft" in metric else TPOT
    found = [(s.measured[metric], s.id) for s in served]
    for e in read_corpus(CORPUS):
        found += [(v, e.id) for k, v in e.numbers().items()
                  if k.startswith(("mean_", "median_")) and k.endswith("_ms") and kind_of(k) == kind]
    return min(found)


def corpus_check(param: str, value: float, workers: int | None) -> bool:
    """The published corpus (measurements the term did not come from either) replayed with ``value``:
    the median |error| of each kind of number before and after; True when no kind gets worse by more than
    ``CORPUS_WORSE_BY``."""
    entries = read_corpus(CORPUS)
    before = replay_all(entries, workers)[0]
    with tempfile.TemporaryDirectory(prefix="parasweep-terms-") as tmp:
        cal = calibration_file(Path(tmp), "any", {param: value})
        for e in entries:
            e.parasweep["calibration"] = str(cal)
        after = replay_all(entries, workers)[0]
    ok = True
    print(f"the published corpus with {param} = {value:g}: median |error| before → after")
    for kind in (THROUGHPUT, TTFT, TPOT):
        b = _median_abs([r.error for r in before if kind_of(r.metric) == kind])
        a = _median_abs([r.error for r in after if kind_of(r.metric) == kind])
        ok &= a <= b + CORPUS_WORSE_BY
        print(f"  {kind:10} {100 * b:5.1f} % → {100 * a:5.1f} %")
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="from_json", required=True, metavar="RUN.json",
                   help="the current predictions (python -m orchestrator fidelity --silicon --json)")
    p.add_argument("--term", action="append", choices=sorted(TERMS), help="the terms to try (default: all)")
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args()
    keep = {f for f in Served.__dataclass_fields__}
    # rows scored apart (measured without warm-up, slower than on a lesser GPU) judge no term either
    served = {r["id"]: Served(**{k: v for k, v in r.items() if k in keep})
              for r in json.loads(Path(args.from_json).read_text())["compared"] if not r.get("apart")}
    rows, _ = read_silicon(default_csv())
    for name in args.term or sorted(TERMS):
        evaluate(TERMS[name], served, rows, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
