"""One candidate of a search, judged in prediction: is it possible on this node, what is the highest
closed-loop load at which it meets every SLO, and what does it score there.

* **Possible.** The changed config is validated as a trial's would be, and the simulated engine
  configured with it; a layout that cannot run is *rejected* with the first line of the reason (does
  not fit in memory, tp does not divide the heads, more GPUs than the node has, ...).
* **Steady state.** Each load point C sends 4·C requests (at least 8), its streams entering one by one
  over one predicted request duration (``orchestrator.points.ramp``), as a trial's points do, and is judged
  on its steady-state window (``workloads.window``: after the ramp, before the drain), as every
  measured point is. Every number is the simulator's prediction in virtual time.
* **Highest load within the SLOs.** From its starting load the concurrency steps up while every SLO
  holds (or down until they do), up to ``search.max_concurrency`` per DP replica, by strides that
  double, then is bisected between the last point that
  held and the first that did not, to within an eighth. Feasibility is taken to fall with load
  (latency grows with it). A candidate that misses an SLO at concurrency 1 is
  *over the SLOs*, with how far it missed (the worst ratio of metric to bound).
* **Where to start.** The cost model's ceiling (``simulator.estimates.decode_ceiling``) gives the load
  whose micro-batches keep their trip within the ITL bound; the search starts there and steps out by
  growing strides until the SLOs flip, then bisects. Without an ITL bound it doubles from 8.
* **Disaggregated candidates** (``pd.enabled``) are judged the same way: configured as their deployment,
  bounded by their decode servers (each one's ceiling, times their count; the load cap is per decode
  server), their GPUs the whole deployment's.
* **Score.** ``output_tok_s_per_gpu``: output tokens per second per GPU at that load (the default), or
  ``goodput_req_s_per_gpu``: requests per second per GPU that meet every per-request bound the SLOs
  imply (TTFT, TPOT, E2E; a percentile bound taken as a per-request one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from analysis.diagnose import overrides_text
from orchestrator.config.schema import ParasweepConf, world_size
from orchestrator.config.slo import check_slo, worst_ratio
from orchestrator.errors import ConfigError, UserError
from orchestrator.prediction.at_load import configure, steady_point
from vocab.load import LoadPoint
from vocab.records import PointResult

OBJECTIVES = ("output_tok_s_per_gpu", "goodput_req_s_per_gpu")
UNGUESSED_START = 8  # where the load search starts without a guess (highest_load)
RESOLUTION = 8  # bisection stops within an eighth of the load

OK, REJECTED, OVER_SLO, PRUNED = "ok", "rejected", "over the SLOs", "cannot win"


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
    ceiling: float | None = None  # the objective no load of this candidate can beat (cost model)
    limit: str = ""  # what stops a higher load: the SLO it breaks just above, or search.max_concurrency
    limit_at: int | None = None  # the load just above where that SLO broke (None: the cap stopped it)
    max_load: int = 0  # the highest load tried: search.max_concurrency per DP replica
    same_as: str = ""  # a candidate the simulated engine cannot tell from this one, judged in its stead
    replicas_of: str = ""  # a candidate with fewer DP replicas, otherwise the same, judged in its stead
    family: str = ""  # replicas_of's candidate alone (its overrides): the engine this one runs copies of


@dataclass(frozen=True)
class Screened:
    """A candidate that can run, before its loads are predicted."""

    change: dict[str, Any]
    gpus: int
    ceiling: float  # the objective no load can beat (inf where the lengths vary: no bound)
    start: int | None  # where the load search starts (None: doubling from UNGUESSED_START)
    engine_key: str  # equal for candidates the simulated engine cannot tell apart
    replica_key: str  # equal for candidates that differ only in their count of interchangeable replicas
    replicas: int  # dp.size


def check_settings(cfg: ParasweepConf) -> Settings:
    """The search's objective and SLOs, or a ``ConfigError`` naming the key."""
    s = cfg.search
    if s.objective not in OBJECTIVES:
        raise ConfigError("search.objective", s.objective, ", ".join(OBJECTIVES))
    check_slo(s.slo)
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


def ms(value: float) -> str:
    """Milliseconds to read beside a bound: 2,035.6, 52.1, 3.02."""
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def goodput(records: list[Any], point: LoadPoint, slo: Mapping[str, float]) -> float:
    """Requests per second that meet every per-request bound ``slo`` implies (TTFT, TPOT, E2E; a
    percentile bound taken as a per-request one); every completed request without such a bound."""
    from workloads import SLO, summarize

    bounds = {name: next((v for k, v in slo.items() if k.startswith(f"{lat}_")), None)
              for name, lat in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("e2e_ms", "e2e"))}
    if all(v is None for v in bounds.values()):
        return summarize(records, point).get("request_s", 0.0)
    return summarize(records, point, slo=SLO(**bounds)).get("goodput_req_s", 0.0)


def _rejected(change: Mapping[str, Any], exc: Exception) -> Outcome:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return Outcome(dict(change), REJECTED, reason=reason, category=rejection_category(exc))


def screen(base: ParasweepConf, change: Mapping[str, Any], settings: Settings) -> Screened | Outcome:
    """Validate one candidate and bound it from the cost model, without predicting a load: a
    ``Screened`` candidate, or its rejection. Never raises for a candidate that cannot run."""
    from orchestrator.prediction.modelled import apply_change

    try:
        cfg, env = apply_change(base, change)
        configured = configure(cfg, env)  # a disaggregated deployment: bounded by its decode servers
    except (UserError, ValueError) as exc:
        return _rejected(change, exc)
    gpus = world_size(cfg)
    ceiling, start = _ceiling(configured.engine, cfg, settings, gpus, max_load(settings, cfg))
    return Screened(dict(change), gpus, ceiling, start, configured.key, configured.family,
                    cfg.dp.size if not cfg.pd.enabled else 1)


def itl_bounds(slo: Mapping[str, float]) -> list[tuple[float, float]]:
    """(seconds, share of inter-token gaps within it) for each percentile bound on ITL in ``slo``."""
    shares = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "max": 1.0}
    return [(bound / 1000.0, shares[metric.split("_")[1]]) for metric, bound in slo.items()
            if metric.startswith("itl_") and metric.split("_")[1] in shares]


def decoders(cfg: ParasweepConf) -> int:
    """The servers that decode side by side: the DP replicas, or a disaggregated deployment's decode
    servers."""
    return max(1, cfg.pd.decode.workers if cfg.pd.enabled else cfg.dp.size)


def max_load(settings: Settings, cfg: ParasweepConf) -> int:
    """The highest load a candidate is tried at: ``search.max_concurrency`` per DP replica or decode
    server (a cap on the total would hold eight replicas to an eighth of what one replica is allowed)."""
    return settings.max_concurrency * decoders(cfg)


def _ceiling(engine: Any, cfg: ParasweepConf, settings: Settings, gpus: int,
             limit: int) -> tuple[float, int | None]:
    """The objective no load of this candidate can beat, and where its load search starts. Output
    tokens are the decoded ones plus each request's first, which its prefill makes: with fixed lengths
    of ``out`` tokens that is out / (out - 1) times the decoded rate. Varying lengths: no bound."""
    from simulator.estimates import decode_ceiling

    w = cfg.workload
    bounds = itl_bounds(settings.slo) or [(None, 1.0)]
    # a disaggregated deployment's decode servers share the load (``engine`` is one of them); an
    # engine's DP replicas are within ``engine`` already
    servers = cfg.pd.decode.workers if cfg.pd.enabled else 1
    ceilings = [decode_ceiling(engine, w.input_len, max(1, limit // servers), bound, share)
                for bound, share in bounds]
    ceilings = [replace(c, tok_s=c.tok_s * servers,
                        concurrency=None if c.concurrency is None else c.concurrency * servers)
                for c in ceilings]
    # where the ITL bound holds the load down, start there; elsewhere another SLO (or none) decides,
    # and doubling from UNGUESSED_START spends less than stepping down from the top
    starts = [c.concurrency for c in ceilings if c.concurrency is not None]
    start = max(1, min(starts)) if starts and min(starts) < limit else None
    if w.input_dist != "fixed" or w.output_dist != "fixed" or w.output_len < 2:
        return math.inf, start
    decoded = min(c.tok_s for c in ceilings)
    out = decoded * w.output_len / (w.output_len - 1)
    per_gpu = out / max(1, gpus)
    return (per_gpu if settings.objective == "output_tok_s_per_gpu" else per_gpu / w.output_len), start


def _no_bar() -> float:
    return -math.inf


def evaluate(base: ParasweepConf, screened: Screened, settings: Settings,
             bar: Callable[[], float] = _no_bar) -> Outcome:
    """One screened candidate's loads predicted (module docstring). Never raises for a candidate that
    cannot run. ``bar()``: the score a candidate must beat to be among the best predicted so far, as it
    stands (other candidates are judged meanwhile); where there is one, a load that misses the SLOs may
    bound the candidate out (``_cannot_reach``), and without a guess where to start the highest load is
    predicted first."""
    from orchestrator.prediction.modelled import apply_change, point_predictor

    change = screened.change
    outcome = Outcome(dict(change), OK, gpus=screened.gpus, ceiling=screened.ceiling)
    try:
        cfg, env = apply_change(base, change)
        predict = point_predictor(cfg, env)
    except (UserError, ValueError) as exc:
        return _rejected(change, exc)
    results: dict[int, PointResult] = {}
    per_gpu = 1.0 / max(1, outcome.gpus)
    # with a bar to beat, a load that misses the SLOs bounds every lower load's score
    bounds = settings.objective == "output_tok_s_per_gpu"

    def holds(c: int) -> bool:
        if c not in results:
            results[c] = predict(steady_point(c, predict, cfg.workload.predicted))
            outcome.predictions += 1
        worst = worst_ratio(results[c].metrics, settings.slo)
        ok = worst is None or worst[1] <= 1.0
        if not ok and bounds and c > 1:  # (missing at 1 is being over the SLOs, said as such)
            now = bar()
            reach = _cannot_reach(results[c], per_gpu, now)
            if reach is not None:
                raise _CannotWin(reach, c, now)
        return ok

    outcome.max_load = max_load(settings, cfg)
    try:
        # without a guess where to start, the highest load first: where it holds it is the answer
        # (feasibility falls with load), where it does not it may bound the candidate out at once
        if bounds and bar() > -math.inf and screened.start is None and holds(outcome.max_load):
            best: int | None = outcome.max_load
        else:
            best = highest_load(holds, outcome.max_load, screened.start)
    except _CannotWin as out:
        outcome.status = PRUNED
        outcome.reason = (f"{settings.objective} at most {out.reach:,.1f} at any load (predicted at "
                          f"{out.load}, which misses the SLOs, and every load below it), below the best "
                          f"predicted ({out.bar:,.1f} and up)")
        return outcome
    if best is None:
        metric, ratio = worst_ratio(results[1].metrics, settings.slo) or ("?", math.inf)
        outcome.status, outcome.miss = OVER_SLO, ratio
        outcome.reason = (f"{metric} {ms(results[1].metrics[metric])} ms against "
                          f"{ms(settings.slo[metric])} at concurrency 1")
        return outcome
    result = results[best]
    outcome.concurrency, outcome.metrics = best, dict(result.metrics)
    unit = "decode server" if cfg.pd.enabled else "replica"
    outcome.limit, outcome.limit_at = _limit(results, best, settings, outcome.max_load, unit)
    outcome.score = _score(result, per_gpu, settings)
    return outcome


def _score(result: PointResult, per_gpu: float, settings: Settings) -> float:
    return per_gpu * (result.metrics.get("output_tok_s", 0.0) if settings.objective == "output_tok_s_per_gpu"
                      else goodput(result.records, result.point, settings.slo))


def confirmed(base: ParasweepConf, screened: Screened, derived: Outcome, settings: Settings,
              bar: Callable[[], float] = _no_bar) -> Outcome:
    """``derived`` (``replicated``: k replicas judged from one) held to the full simulation of all k
    replicas at its load, one prediction: where that load holds the SLOs, the derived outcome with the
    full simulation's numbers; where it does not, the candidate judged in full (``evaluate``). Round-robin
    deals a replica the requests other replicas' ends set off, so now and then two arrive within one of
    its steps, which one replica alone at its share of the load never sees (its arrivals are its own
    ends): the tail of ITL can be a step with two prefills where the derived one has one."""
    from orchestrator.prediction.modelled import apply_change, point_predictor

    if derived.status != OK or derived.concurrency is None:
        return derived
    cfg, env = apply_change(base, screened.change)
    predict = point_predictor(cfg, env)
    result = predict(steady_point(derived.concurrency, predict, cfg.workload.predicted))
    worst = worst_ratio(result.metrics, settings.slo)
    if worst is not None and worst[1] > 1.0:
        full = evaluate(base, screened, settings, bar)
        return replace(full, predictions=full.predictions + 1)
    return replace(derived, predictions=1, metrics=dict(result.metrics),
                   score=_score(result, 1.0 / max(1, derived.gpus), settings))


class _CannotWin(Exception):
    """A load missed the SLOs with a throughput that bounds the candidate below the bar."""

    def __init__(self, reach: float, load: int, bar: float) -> None:
        super().__init__(reach, load, bar)
        self.reach, self.load, self.bar = reach, load, bar


def _cannot_reach(top: PointResult, per_gpu: float, bar: float) -> float | None:
    """The most a candidate can score at any load, from its prediction at its highest load where that
    misses the SLOs, when that is below ``bar`` (None: it might reach it). A closed loop's throughput
    grows with its load up to saturation and stays there, so no lower load delivers more than the
    highest does; the bound adds the point's own 95 % interval, so that noise cannot hide a winner. A
    point without an interval (too short a window) bounds nothing."""
    rel = top.metrics.get("output_tok_s_ci95_rel", math.nan)
    if not math.isfinite(rel):
        return None
    reach = per_gpu * top.metrics.get("output_tok_s", math.inf) * (1.0 + rel)
    return reach if reach < bar else None


def _limit(results: Mapping[int, PointResult], best: int, settings: Settings, limit: int,
           unit: str = "replica") -> tuple[str, int | None]:
    """What stops a load above ``best``, and the load where it broke (None: the cap)."""
    above = [c for c in results if c > best]
    if not above:
        return _cap_text(settings, limit, unit), None
    c = min(above)
    metric, _ = worst_ratio(results[c].metrics, settings.slo) or ("?", math.nan)
    return _slo_break_text(metric, results[c].metrics[metric], settings.slo[metric], c), c


def _cap_text(settings: Settings, limit: int, unit: str = "replica") -> str:
    """The cap as what held the load: ``search.max_concurrency`` per DP replica (or decode server)."""
    replicas = limit // settings.max_concurrency
    each = f" per {unit} ({limit} in all)" if replicas > 1 else ""
    return f"the cap search.max_concurrency={settings.max_concurrency}{each}, not an SLO"


def _slo_break_text(metric: str, value: float, bound: float, at: int) -> str:
    return f"{metric} {ms(value)} ms > {ms(bound)} at concurrency {at}"


# Metrics of a whole engine that add up over its DP replicas (rates, counts, energy); every other
# metric (latencies, shares, per-GPU and per-request figures) is one replica's and stays as it is.
ADDITIVE = frozenset({
    "output_tok_s", "output_tok_s_ci95", "input_tok_s", "total_tok_s", "request_s", "goodput_req_s",
    "drain_output_tok_s", "ramp_output_tok_s", "achieved_concurrency", "offered_concurrency",
    "peak_concurrency", "completed", "num_requests", "window_requests", "ramp_requests",
    "drain_requests", "input_tokens", "output_tokens", "output_tokens_total", "prefill_cached_tokens",
    "prefill_computed_tokens", "energy_j", "queue_reqs_mean", "errors",
})


def replicated(outcome: Outcome, change: dict[str, Any], factor: int, settings: Settings) -> Outcome:
    """``outcome``, judged for an engine of interchangeable DP replicas fed round-robin, for the same
    engine with ``factor`` times as many replicas (``at_load.replica_key``): every load ``factor`` times
    as high, its additive metrics too, latencies and the score per GPU the same."""
    o = replace(outcome, change=dict(change), gpus=outcome.gpus * factor, predictions=0,
                            max_load=outcome.max_load * factor, same_as="",
                            replicas_of=f"{factor} x ({overrides_text(outcome.change)})",
                            family=overrides_text(outcome.change))
    if outcome.status != OK or outcome.concurrency is None:
        return o
    o.concurrency = outcome.concurrency * factor
    o.metrics = {k: v * factor if k in ADDITIVE or k.startswith("errors_") else v
                 for k, v in outcome.metrics.items()}
    if outcome.limit_at is None:
        o.limit = _cap_text(settings, o.max_load)
    else:
        o.limit_at = outcome.limit_at * factor
        # the same SLO, broken at the same load per replica (_slo_break_text ends with the load)
        broken = outcome.limit.removesuffix(f" at concurrency {outcome.limit_at}")
        o.limit = f"{broken} at concurrency {o.limit_at}"
    return o


def highest_load(holds: Callable[[int], bool], limit: int, start: int | None = None) -> int | None:
    """The highest concurrency in [1, limit] at which ``holds``, to within 1/RESOLUTION; None when it
    fails at 1. From ``start`` (a guess) it steps up (or down) by strides of a quarter of it that double
    until ``holds`` flips, then bisects between the last load that held and the first that did not.
    Without a guess it doubles from ``UNGUESSED_START``: a point below it costs more decode steps, not
    fewer (at least ``MIN_MEASURED`` requests: ``closed_point``). Feasibility is taken
    to fall with load."""
    first = min(max(1, start or UNGUESSED_START), limit)
    stride = max(1, first // 4) if start else first
    if holds(first):
        lo, hi = first, None
        while lo < limit:
            nxt = min(lo + stride, limit)
            if not holds(nxt):
                hi = nxt
                break
            lo, stride = nxt, 2 * stride
        if hi is None:
            return lo
    else:
        hi = first
        while True:
            if hi == 1:
                return None
            nxt = max(1, hi - stride)
            if holds(nxt):
                lo = nxt
                break
            hi, stride = nxt, 2 * stride
    while hi - lo > max(1, lo // RESOLUTION):
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo
