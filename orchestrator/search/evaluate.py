"""One candidate of a search, judged in prediction: is it possible on this node, what is the highest
closed-loop load at which it meets every SLO, and what does it score there.

* **Possible.** The changed config is validated as a trial's would be, and the simulated engine
  configured with it; a layout that cannot run is *rejected* with the first line of the reason (does
  not fit in memory, tp does not divide the heads, more GPUs than the node has, ...).
* **Steady state.** Each load point C sends C warm-up requests first, the opening wave of C
  simultaneous prefills, and judges only the 2·C (at least 16) requests after them, which arrive as
  earlier ones finish. A closed loop's opening burst is a benchmark's artefact, not its steady state:
  on a 128-request point it can dominate the TTFT p99. Every number is the simulator's prediction in
  virtual time.
* **Highest load within the SLOs.** Concurrency doubles from 1 while every SLO holds, then is bisected
  between the last point that held and the first that did not, to within an eighth. Feasibility is
  taken to fall with load (latency grows with it). A candidate that misses an SLO at concurrency 1 is
  *over the SLOs*, with how far it missed (the worst ratio of metric to bound).
* **Score.** ``output_tok_s_per_gpu``: output tokens per second per GPU at that load (the default), or
  ``goodput_req_s_per_gpu``: requests per second per GPU that meet every per-request bound the SLOs
  imply (TTFT, TPOT, E2E; a percentile bound taken as a per-request one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError, UserError
from vocab.load import LoadPoint
from vocab.records import PointResult
from workloads.metrics import STATS

OBJECTIVES = ("output_tok_s_per_gpu", "goodput_req_s_per_gpu")
# the latency statistics every load point reports (workloads/metrics.py), per-token ITL only
SLO_METRICS = tuple(f"{lat}_{stat}_ms" for lat in ("ttft", "itl", "tpot", "e2e") for stat in STATS)
MIN_MEASURED = 16  # measured requests of the smallest point
RESOLUTION = 8  # bisection stops within an eighth of the load

OK, REJECTED, OVER_SLO = "ok", "rejected", "over the SLOs"


@dataclass(frozen=True)
class Settings:
    objective: str
    slo: Mapping[str, float]
    max_concurrency: int


@dataclass
class Outcome:
    change: dict[str, Any]
    status: str  # OK | REJECTED | OVER_SLO
    reason: str = ""  # why rejected, or which SLO it missed at concurrency 1
    gpus: int = 0
    concurrency: int | None = None  # the highest load that met every SLO
    score: float | None = None  # the objective there
    metrics: dict[str, float] = field(default_factory=dict)  # predicted at that load
    miss: float | None = None  # over the SLOs: the worst metric / bound at concurrency 1 (> 1)
    category: str = ""  # rejected: the reason without this candidate's numbers, to count them by
    predictions: int = 0


def check_settings(cfg: ParasweepConf) -> Settings:
    """The search's objective and SLOs, or a ``ConfigError`` naming the key."""
    s = cfg.search
    if s.objective not in OBJECTIVES:
        raise ConfigError("search.objective", s.objective, ", ".join(OBJECTIVES))
    for metric, bound in s.slo.items():
        if metric not in SLO_METRICS:
            raise ConfigError(f"search.slo.{metric}", bound,
                              f"a bound on one of {', '.join(SLO_METRICS)}", why="unknown metric")
        if not (isinstance(bound, int | float) and bound > 0 and math.isfinite(bound)):
            raise ConfigError(f"search.slo.{metric}", bound, "a positive number of milliseconds")
    if s.max_concurrency < 1:
        raise ConfigError("search.max_concurrency", s.max_concurrency, "an integer >= 1")
    return Settings(s.objective, dict(s.slo), s.max_concurrency)


def rejection_category(exc: Exception) -> str:
    """What a rejection has in common with others of its kind: a config key and what is valid for it
    (``tp.size*pp.size*dp.size: at most 8 (hardware h100-sxm-x8 has 8 GPUs)``), or the engine's
    message up to its specifics (``Not enough memory. Please try to increase --mem-fraction-static.``)."""
    if isinstance(exc, ConfigError):
        return f"{exc.key}: valid {exc.valid}"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return first.split(" (", 1)[0].removeprefix("ValueError: ").strip()


def closed_point(c: int) -> LoadPoint:
    """Concurrency ``c`` in steady state: the opening wave is warm-up (module docstring)."""
    return LoadPoint(concurrency=c, num_requests=max(MIN_MEASURED, 2 * c), warmup_requests=c)


def worst_ratio(metrics: Mapping[str, float], slo: Mapping[str, float]) -> tuple[str, float] | None:
    """The SLO missed by the most (metric, metric / bound), or None when all hold. A metric the point
    has no sample of (no ITL when every request has one token) has nothing to violate."""
    worst = None
    for metric, bound in slo.items():
        value = metrics.get(metric)
        if value is None or not math.isfinite(value):
            continue
        ratio = value / bound
        if worst is None or ratio > worst[1]:
            worst = (metric, ratio)
    return worst


def _goodput(result: PointResult, slo: Mapping[str, float]) -> float:
    from workloads import SLO, summarize

    bounds = {name: next((v for k, v in slo.items() if k.startswith(f"{lat}_")), None)
              for name, lat in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("e2e_ms", "e2e"))}
    if all(v is None for v in bounds.values()):  # no per-request bound: every completed request counts
        return result.metrics.get("request_s", 0.0)
    return summarize(result.records, result.point, slo=SLO(**bounds)).get("goodput_req_s", 0.0)


def evaluate(base: ParasweepConf, change: Mapping[str, Any], settings: Settings) -> Outcome:
    """One candidate, start to end (module docstring). Never raises for a candidate that cannot run."""
    from orchestrator.trial.modelled import apply_change, point_predictor

    outcome = Outcome(dict(change), OK)
    try:
        cfg, env = apply_change(base, change)
        predict = point_predictor(cfg, env)
    except (UserError, ValueError) as exc:
        outcome.status = REJECTED
        outcome.reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        outcome.category = rejection_category(exc)
        return outcome
    outcome.gpus = cfg.tp.size * cfg.pp.size * cfg.dp.size
    results: dict[int, PointResult] = {}

    def holds(c: int) -> bool:
        if c not in results:
            results[c] = predict(closed_point(c))
            outcome.predictions += 1
        worst = worst_ratio(results[c].metrics, settings.slo)
        return worst is None or worst[1] <= 1.0

    best = highest_load(holds, settings.max_concurrency)
    if best is None:
        metric, ratio = worst_ratio(results[1].metrics, settings.slo) or ("?", math.inf)
        outcome.status, outcome.miss = OVER_SLO, ratio
        outcome.reason = (f"{metric} {results[1].metrics[metric]:,.1f} ms against "
                          f"{settings.slo[metric]:,.1f} at concurrency 1")
        return outcome
    result = results[best]
    outcome.concurrency, outcome.metrics = best, dict(result.metrics)
    per_gpu = 1.0 / max(1, outcome.gpus)
    outcome.score = per_gpu * (result.metrics.get("output_tok_s", 0.0)
                               if settings.objective == "output_tok_s_per_gpu"
                               else _goodput(result, settings.slo))
    return outcome


def highest_load(holds: Callable[[int], bool], limit: int) -> int | None:
    """The highest concurrency in [1, limit] at which ``holds``, searched by doubling then bisection to
    within 1/RESOLUTION; None when it fails at 1."""
    if not holds(1):
        return None
    lo = 1
    hi = None
    while lo < limit:
        nxt = min(2 * lo, limit)
        if holds(nxt):
            lo = nxt
        else:
            hi = nxt
            break
    if hi is None:
        return lo
    while hi - lo > max(1, lo // RESOLUTION):
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo
