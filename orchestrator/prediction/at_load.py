"""Changes of one configuration predicted at given loads, the way a search predicts a candidate, for
the diagnosis (each finding's changes at its load point) and the end of a sweep (the configurations it
did not run, at its loads).

* **Possible.** Each change is applied and validated as a trial's config is, and the simulated engine
  configured with it; one that cannot run is not predicted, and says why (the first line of the
  reason: does not fit in memory, tp does not divide the heads, more GPUs than the node has, ...).
* **Steady state.** A closed-loop load of C streams has its streams enter one by one over one
  predicted request duration (``orchestrator.points.ramp``) and runs until its throughput is known to
  ``workload.predicted.candidate_ci_target`` or its virtual-time budget ends
  (``orchestrator.points.virtual``); it is judged on its steady window, as a search's points and a
  trial's measured points are. An open-loop load is the trial's own point, run the same way.
* **Once.** Every prediction is keyed by what the simulated engine can tell apart (its resolved
  flags, hardware, model and environment), the requests and the load, and kept in a cache on disk:
  the trials of a sweep and the sweep's end share it, so the same engine at the same load is
  predicted once per sweep.
* **On every core.** The changes are predicted on a pool of worker processes, forked after the
  caller has configured the base engine (the kernel tables it read are then shared).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ParasweepConf, PredictedPointConf, world_size
from orchestrator.errors import UserError
from vocab.load import LoadPoint
from vocab.records import PointResult

log = logging.getLogger("parasweep")

MIN_MEASURED = 8  # measured requests of the smallest point (as a trial's load plan: points/plan.py)
REQUESTS_PER_STREAM = 4  # a point's requests per stream: one ramp, about three durations of window
# what is kept of each prediction: the numbers a verdict, an SLO or a noise judgement reads
KEPT = ("output_tok_s", "output_tok_s_ci95_rel", "request_s", "j_per_output_token", "budget_hit",
        "ttft_p99_ms_ci95_lo", "ttft_p99_ms_ci95_hi", "itl_p99_ms_ci95_lo", "itl_p99_ms_ci95_hi")


def shared_cache(sweep_dir: Path) -> Path:
    """Where a sweep keeps the predictions its trials' diagnoses and its end share."""
    return sweep_dir / ".predictions" / "shared"


def closed_point(c: int) -> LoadPoint:
    """Concurrency ``c`` as a prediction judges it, before its ramp is known (module docstring)."""
    return LoadPoint(concurrency=c, num_requests=max(MIN_MEASURED, REQUESTS_PER_STREAM * c),
                     warmup_requests=0)


def ramped_point(c: int, predict: Callable[[LoadPoint], PointResult]) -> LoadPoint:
    """:func:`closed_point` with its ramp: over the request duration ``predict`` gives (as a measured
    trial runs it)."""
    from orchestrator.points.ramp import ramped

    return ramped(closed_point(c), predict)


def steady_point(c: int, predict: Callable[[LoadPoint], PointResult],
                 predicted: PredictedPointConf | None = None) -> LoadPoint:
    """:func:`ramped_point` as a candidate's point runs in virtual time: until its throughput is known
    to ``predicted`` (``workload.predicted``; its defaults when None) or its budget is spent
    (``orchestrator.points.virtual``: candidates are compared on their throughput's footing)."""
    from orchestrator.points.virtual import in_virtual_time

    return in_virtual_time(ramped_point(c, predict), predicted or PredictedPointConf(), latency=False)


def engine_key(engine: Any, env: Mapping[str, str]) -> str:
    """The resolved engine's flags, hardware, model and environment: two configs with the same key
    are the same engine to the simulator (a micro-batch cap left to its default and the same cap
    given)."""
    return _key(engine, env)


def _key(engine: Any, env: Mapping[str, str], ignored: tuple[str, ...] = ()) -> str:
    args = dict(vars(engine.args))
    args["pp_max_micro_batch_size"] = engine.pp_max_micro_batch_size  # null and its resolved value alike
    # files the engine was configured from live in a scratch directory per config: their contents
    for path_arg in ("sim_hardware", "model_path", *ignored):
        args.pop(path_arg)
    return repr((sorted(args.items()), engine.hw, engine.spec, sorted(env.items())))


def deployment_key(layout: Any, env: Mapping[str, str]) -> str:
    """A disaggregated deployment's key: each role's :func:`engine_key`, the server counts, the router's
    pairing (equal for deployments the simulated engine cannot tell apart). Mixed chunked prefill acts
    in neither role (a prefill server runs no decodes, a decode server no prefills): it is left out."""
    roles = [_key(c, env, ("enable_mixed_chunk",)) if c is not None else ""
             for c in (layout.prefill, layout.decode)]
    return repr((roles, layout.prefill_workers, layout.decode_workers, layout.policy))


def replica_key(engine: Any, env: Mapping[str, str]) -> str:
    """:func:`engine_key` of one of the engine's DP replicas, where its replicas are interchangeable:
    equal for engines that differ only in how many replicas they run. Identical replicas fed round-robin
    are, in the simulated engine, each one replica at its share of the load, so ``dp`` replicas at
    concurrency ``dp·c`` score per GPU what one replica scores at ``c`` (its latencies, and ``dp`` times
    its throughput). A router that picks replicas by what they hold (``cache_aware``) breaks that
    symmetry: such an engine is only its own key."""
    if engine.dp > 1 and engine.router != "round_robin":
        return engine_key(engine, env)
    return _key(engine, env, ("dp_size", "sim_router"))


@dataclass(frozen=True)
class Configured:
    """A config as the simulated engine would start it, once: fresh virtual trials of it, its keys, and
    the engine a cost-model bound reads."""

    fresh: Callable[[], Any]  # a fresh engine (or deployment) to run load points on
    key: str  # engine_key / deployment_key: equal for configs the simulated engine cannot tell apart
    family: str  # replica_key: equal for configs that differ only in their count of like replicas
    engine: Any  # the engine's SimConfig, or one decode server's for a disaggregated deployment


def configure(cfg: ParasweepConf, env: Mapping[str, str]) -> Configured:
    """``cfg`` configured once, an engine or a disaggregated deployment (its servers are not replicas of
    one engine: its family is itself). Raises as the engine would refuse to start (``ValueError``)."""
    from orchestrator.prediction.modelled import configured_deployment, configured_engine
    from simulator.predict import VirtualTrial

    if cfg.pd.enabled:
        layout = configured_deployment(cfg, env)
        key = deployment_key(layout, env)
        return Configured(layout.fresh, key, key, layout.decode)
    engine = configured_engine(cfg, env)
    return Configured(lambda: VirtualTrial(engine), engine_key(engine, env), replica_key(engine, env), engine)


@dataclass(frozen=True)
class Load:
    """A load to predict at: a closed loop of ``concurrency`` streams (steady, ramped), or an open
    loop's own point."""

    label: str
    concurrency: int | None = None
    point: LoadPoint | None = None  # open loop: the point as the trial ran it

    @classmethod
    def of(cls, point: LoadPoint) -> Load:
        if point.concurrency is not None:
            return cls(point.label, concurrency=point.concurrency)
        return cls(point.label, point=point)

    @classmethod
    def closed(cls, c: int) -> Load:
        return cls.of(closed_point(c))

    def key(self) -> str:
        return f"c{self.concurrency}" if self.concurrency is not None else repr(self.point)


@dataclass
class Predicted:
    """One change predicted at each load: ``metrics`` by load label, or ``reason`` (why not)."""

    change: dict[str, Any]
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    reason: str = ""
    gpus: int = 0
    engine: str = ""  # engine_key: equal for changes the simulated engine cannot tell apart

    @property
    def ok(self) -> bool:
        return not self.reason


def _kept(metrics: Mapping[str, Any]) -> dict[str, float]:
    from orchestrator.config.slo import SLO_METRICS

    return {k: float(v) for k, v in metrics.items()
            if (k in KEPT or k in SLO_METRICS) and isinstance(v, int | float)}


def _cache(folder: Path | None) -> Any:
    if folder is None:
        return None
    import diskcache

    return diskcache.Cache(str(folder))


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def predict_change(base: ParasweepConf, change: Mapping[str, Any], loads: Sequence[Load],
                   cache_dir: Path | None = None) -> Predicted:
    """``change`` applied to ``base``, predicted at each of ``loads`` (module docstring). Never raises
    for a change that cannot run: its ``reason`` says why."""
    from orchestrator.points.plan import request_spec
    from orchestrator.points.virtual import in_virtual_time
    from orchestrator.prediction.modelled import apply_change

    out = Predicted(dict(change))
    try:
        cfg, env = apply_change(base, change)
        configured = configure(cfg, env)
        out.engine = configured.key
    except (UserError, ValueError) as exc:
        out.reason = f"not possible: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        return out
    out.gpus = world_size(cfg)
    spec = request_spec(cfg)
    cache = _cache(cache_dir)
    try:
        def predict(point: LoadPoint) -> PointResult:
            return configured.fresh().run_point(point, spec)

        for load in loads:
            key = _digest(out.engine, repr(spec), load.key(), repr(cfg.workload.predicted))
            hit = cache.get(key) if cache is not None else None
            if hit is None:
                point = (steady_point(load.concurrency, predict, cfg.workload.predicted)
                         if load.concurrency is not None
                         else in_virtual_time(load.point, cfg.workload.predicted, latency=False))
                assert point is not None
                hit = _kept(predict(point).metrics)
                if cache is not None:
                    cache.set(key, hit)
            out.metrics[load.label] = hit
    except Exception as exc:  # a model failure costs this change, not the diagnosis
        log.debug("could not predict %s", dict(change), exc_info=True)
        first = str(exc).splitlines()[0] if str(exc) else ""
        out.reason = f"prediction failed: {type(exc).__name__}: {first}"
        out.metrics = {}
    finally:
        if cache is not None:
            cache.close()
    return out


def _one(args: tuple[ParasweepConf, dict[str, Any], list[Load], Path | None]) -> Predicted:
    return predict_change(*args)


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def predict_many(jobs: Sequence[tuple[ParasweepConf, Mapping[str, Any]]], loads: Sequence[Load],
                 cache_dir: Path | None = None, workers: int | None = None) -> list[Predicted]:
    """Each (config, change) of ``jobs`` predicted at every load, in their order (a job given twice is
    predicted once), on ``workers`` processes (default: one per CPU) when there is more than one."""
    unique: dict[str, tuple[ParasweepConf, dict[str, Any]]] = {}
    keys = []
    for cfg, change in jobs:
        key = repr((id(cfg), sorted(change.items())))
        keys.append(key)
        unique.setdefault(key, (cfg, dict(change)))
    args = [(cfg, change, list(loads), cache_dir) for cfg, change in unique.values()]
    workers = min(workers or default_workers(), len(args))
    if workers <= 1:
        results = [_one(a) for a in args]
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_one, args))
    by_key = dict(zip(unique, results, strict=True))
    return [dataclasses.replace(by_key[k]) for k in keys]


def predict_changes(base: ParasweepConf, changes: Sequence[Mapping[str, Any]], loads: Sequence[Load],
                    cache_dir: Path | None = None, workers: int | None = None) -> list[Predicted]:
    """Each of ``changes`` of ``base`` predicted at every load, in the changes' order (``predict_many``)."""
    return predict_many([(base, c) for c in changes], loads, cache_dir, workers)
