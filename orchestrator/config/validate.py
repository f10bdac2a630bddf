"""Cross-field checks that a schema cannot express, run before anything launches.

Each failure is a :class:`ConfigError` whose message names the key, the value and what is valid.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from orchestrator.config.disagg import validate_pd
from orchestrator.config.lengths import length_bounds
from orchestrator.config.model_info import model_info
from orchestrator.config.moe_layout import validate_moe_layout
from orchestrator.config.schema import (
    VLLM_ENGINES,
    ParasweepConf,
    SimFaultConf,
    joins_cluster,
    plays_vllm,
    router_process,
    trial_nodes,
    world_size,
)
from orchestrator.config.slo import check_slo
from orchestrator.config.traffic import validate_traffic
from orchestrator.errors import ConfigError
from orchestrator.gpus import local_gpu_count, sglang_installed
from simulator.kernel_lanes import VLLM_MOE_BACKENDS
from vocab.load import LengthDist
from vocab.model import DP_ROUTER_IMPLS, DP_ROUTERS, ROUTER_PACKAGE, SCHEDULE_POLICIES
from vocab.status import simulated

ENGINES = ("auto", "sim", "sglang", "vllm", "sim-vllm")
APIS = ("generate", "completions", "chat")
MAX_ASYNC_DEPTH = 64


def _validate_router(cfg: ParasweepConf, engine: str) -> None:
    """``dp.router`` and who runs it: SGLang's DP controller only spreads requests round-robin; the
    router package (``smg``) runs either policy as its own process in front of one server per replica."""
    if cfg.dp.router_impl not in DP_ROUTER_IMPLS:
        raise ConfigError("dp.router_impl", cfg.dp.router_impl, ", ".join(DP_ROUTER_IMPLS))
    if cfg.dp.router_impl == "engine" and cfg.dp.router == "cache_aware" and engine == "sglang":
        raise ConfigError("dp.router_impl", "engine", "auto or smg with dp.router=cache_aware on SGLang",
                          why="SGLang's own DP controller has no cache-aware policy; the router package does")
    if cfg.dp.router == "total_requests" and router_process(cfg, engine):
        raise ConfigError("dp.router", "total_requests", "round_robin or cache_aware with dp.router_impl=smg",
                          why="total_requests is SGLang's own DP controller's method (dp.router_impl=engine)")
    if cfg.dp.router_impl == "smg" and cfg.dp.size < 2:
        raise ConfigError("dp.router_impl", "smg", "engine or auto with dp.size=1",
                          why="a router needs at least two replicas behind it (dp.size >= 2)")
    if not router_process(cfg, engine):
        return
    if trial_nodes(cfg) > 1:
        raise ConfigError("dp.router_impl", cfg.dp.router_impl, "engine, with replicas that fit one node",
                          why=f"the router and its {cfg.dp.size} replicas run on one node; a world size of "
                              f"{world_size(cfg)} spans {trial_nodes(cfg)}")
    if cfg.workload.api == "completions":
        raise ConfigError("workload.api", "completions",
                          "generate or chat behind the router (dp.router_impl)",
                          why="the router refuses the token-id prompts parasweep sends to /v1/completions")
    if importlib.util.find_spec("smg") is None:
        raise ConfigError("dp.router_impl", cfg.dp.router_impl, "engine, or install the router: "
                          f"pip install {ROUTER_PACKAGE}",
                          why=f"the {engine} trial needs the router package, which this Python lacks")


def typed_config(cfg: DictConfig | ParasweepConf) -> ParasweepConf:
    """The task config (without Hydra's own node) as resolved, typed dataclasses."""
    if isinstance(cfg, ParasweepConf):
        return cfg
    plain = {k: OmegaConf.to_container(cfg[k], resolve=True) if isinstance(cfg[k], DictConfig) else cfg[k]
             for k in cfg if k != "hydra"}
    merged = OmegaConf.merge(OmegaConf.structured(ParasweepConf), plain)
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def resolve_engine(cfg: ParasweepConf) -> str:
    """``auto`` becomes ``sglang`` on a node with GPUs and SGLang, else ``sim``; a named engine becomes
    the simulated engine playing it where there are no GPUs (``sim``, ``sim-vllm``)."""
    return resolve_engine_reason(cfg)[0]


# the simulated engine's tag when it plays a named engine
PLAYED_BY = {"sglang": "sim", "vllm": "sim-vllm"}


def gpus_anywhere(cfg: ParasweepConf) -> bool:
    """GPUs this sweep could run a real engine on: this node's (NVML), declared ones (``ray.num_gpus``,
    e.g. to see a cluster's command lines in a dry run) or a Ray cluster's."""
    return cfg.ray.num_gpus is not None or joins_cluster(cfg.ray.address) or local_gpu_count() > 0


def resolve_engine_reason(cfg: ParasweepConf) -> tuple[str, str]:
    """The engine ``resolve_engine`` picks and why, in words for the end-of-sweep header (so a number
    from the simulated engine is never read as a measurement without saying how it came to be)."""
    name = cfg.engine.name
    if name in PLAYED_BY:
        if not gpus_anywhere(cfg):
            return PLAYED_BY[name], (f"engine={name}: no NVIDIA GPU on this node and none declared "
                                     f"(ray.num_gpus, ray.address), so the simulated engine plays {name}")
        return name, f"engine={name} in the config"
    if name != "auto":
        return name, f"engine={name} in the config"
    gpus = local_gpu_count()
    if gpus == 0:
        return "sim", "engine=auto: no NVIDIA GPU on this node"
    if cfg.engine.python:
        return "sglang", f"engine=auto: {gpus} GPU(s) on this node and engine.python set"
    if sglang_installed():
        return "sglang", f"engine=auto: {gpus} GPU(s) and SGLang on this node"
    return "sim", f"engine=auto: {gpus} GPU(s) on this node but SGLang is not installed (engine.python unset)"


def available_gpus(cfg: ParasweepConf, engine: str) -> tuple[int, str]:
    """GPUs a trial may use, and where that number comes from (for the error message)."""
    hw = cfg.hardware
    if simulated(engine) or (hw.nodes > 1 and (cfg.predict or cfg.dry_run)):
        if hw.nodes > 1:  # a cluster profile: its nodes together
            return hw.cluster_gpus, f"hardware {hw.name} is {hw.nodes} nodes of {hw.num_gpus} GPUs"
        return hw.num_gpus, f"hardware {hw.name} has {hw.num_gpus} GPUs"
    if cfg.ray.num_gpus is not None:
        return cfg.ray.num_gpus, f"ray.num_gpus declares {cfg.ray.num_gpus} GPUs"
    if joins_cluster(cfg.ray.address):
        return 1 << 30, "a Ray cluster decides"  # placement is checked against the cluster itself
    n = local_gpu_count()
    return n, f"this node has {n} GPUs (NVML)"


# NVML refreshes power about every 100 ms at best; faster sampling only repeats values and costs CPU
MAX_GPU_HZ = 50.0


def _validate_across_nodes(cfg: ParasweepConf, ws: int) -> None:
    """A trial wider than one node of its hardware profile: whole nodes, one model replica (SGLang
    0.5.23 refuses data-parallel replicas across nodes), and, measured, a Ray cluster to run on."""
    per_node, nodes = cfg.hardware.num_gpus, trial_nodes(cfg)
    if nodes == 1:
        return
    if ws % per_node and not cfg.pd.enabled:
        raise ConfigError("tp.size*pp.size*dp.size", ws,
                          f"a multiple of {per_node} (whole nodes of hardware {cfg.hardware.name})",
                          why=f"a trial across {nodes} nodes takes whole nodes")
    if cfg.dp.size > 1:
        raise ConfigError("dp.size", cfg.dp.size, "1 for a trial across nodes",
                          why="SGLang refuses data-parallel replicas across nodes (attention DP instead)")
    if not (cfg.predict or cfg.dry_run or joins_cluster(cfg.ray.address)):
        raise ConfigError(world_key(cfg), ws, f"at most {per_node} GPUs (one node) on the "
                          "sweep's own local Ray; across nodes: ray.address=auto or host:port of a Ray "
                          "cluster, or predict=true / dry_run=true",
                          why=f"spans {nodes} nodes of hardware {cfg.hardware.name}, one engine process "
                              "per node, and a local Ray is one node")


def world_key(cfg: ParasweepConf) -> str:
    """The keys a trial's world size is made of, for a message about it."""
    if cfg.pd.enabled:
        return "pd.prefill.workers*(tp*pp*dp)+pd.decode.workers*(tp*pp*dp)"
    return "tp.size*pp.size*dp.size"


def _positive(key: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value < 1:
        raise ConfigError(key, value, "an integer >= 1" + (" or null" if allow_none else ""))


def _validate_vllm_keys(cfg: ParasweepConf, engine: str, reason: str) -> None:
    """``vllm.*`` are vLLM's own flags: refused on any other engine, and checked for their type here."""
    for f in dataclasses.fields(cfg.vllm):
        value = getattr(cfg.vllm, f.name)
        if value is None:
            continue
        key = f"vllm.{f.name}"
        if engine not in VLLM_ENGINES:
            raise ConfigError(key, value, f"null with engine={engine} ({reason})", why="a flag of vLLM only")
        if f.name == "release":  # checked against the recorded releases by the engine's adapter
            continue
        if f.name == "async_scheduling" and not isinstance(value, bool):
            raise ConfigError(key, value, "true, false or null")
        if f.name == "scheduling_policy" and value not in ("fcfs", "priority"):
            raise ConfigError(key, value, "fcfs, priority or null")
        if f.name == "moe_backend":  # the release's choices are checked by the engine's adapter
            modelled = ", ".join(VLLM_MOE_BACKENDS)
            if engine == "sim-vllm" and value not in VLLM_MOE_BACKENDS:
                raise ConfigError(key, value, f"{modelled} or null on the simulated engine",
                                  why="the MoE kernels the simulated engine prices")
            continue
        if f.name not in ("async_scheduling", "scheduling_policy"):
            _positive(key, value)


def _validate_ray(cfg: ParasweepConf) -> None:
    """A joined cluster's resources are its own: declaring GPUs or CPUs is for a local Ray only."""
    if not joins_cluster(cfg.ray.address):
        return
    for key, value in (("ray.num_gpus", cfg.ray.num_gpus), ("ray.num_cpus", cfg.ray.num_cpus)):
        if value is not None:
            raise ConfigError(key, value, f"null with ray.address={cfg.ray.address}",
                              why="a cluster that is joined keeps the resources its nodes declared")


def validate(cfg: ParasweepConf) -> str:
    """Check one trial's config; return the engine it will run on (``sim`` or ``sglang``)."""
    return validate_with_reason(cfg)[0]


def validate_with_reason(cfg: ParasweepConf) -> tuple[str, str]:
    """Check one trial's config; the engine it will run on and why (``resolve_engine_reason``)."""
    if cfg.engine.name not in ENGINES:
        raise ConfigError("engine.name", cfg.engine.name, ", ".join(ENGINES))
    if not isinstance(cfg.repeats, int) or cfg.repeats < 1:
        raise ConfigError("repeats", cfg.repeats, "an integer >= 1 (each trial run that many times)")
    if not isinstance(cfg.repeat, int) or not 0 <= cfg.repeat < max(cfg.repeats, 1):
        raise ConfigError("repeat", cfg.repeat, f"0 to {cfg.repeats - 1} (set by the launcher from repeats)")
    engine, reason = resolve_engine_reason(cfg)
    _validate_sim_faults(cfg, engine, reason)
    _validate_vllm_keys(cfg, engine, reason)
    if not simulated(engine) and cfg.engine.name in ("auto", *PLAYED_BY):
        # the simulated engine's pace (engine=auto and a named engine play it faster than real time where
        # the simulated engine stands in): where the real engine runs, it runs in real time
        cfg.engine.time_scale = 1.0
    if cfg.engine.time_scale <= 0 or (not simulated(engine) and cfg.engine.time_scale != 1.0):
        raise ConfigError("engine.time_scale", cfg.engine.time_scale,
                          f"> 0 for the simulated engine; 1.0 for {engine}")

    for key, value in (("tp.size", cfg.tp.size), ("pp.size", cfg.pp.size), ("ep.size", cfg.ep.size),
                       ("dp.size", cfg.dp.size)):
        _positive(key, value)
    if cfg.server.schedule_policy not in SCHEDULE_POLICIES:
        why = ("SGLang accepts it on the command line and its scheduler then fails at start-up"
               if cfg.server.schedule_policy == "priority" else "")
        raise ConfigError("server.schedule_policy", cfg.server.schedule_policy, ", ".join(SCHEDULE_POLICIES),
                          why=why)
    if cfg.server.schedule_policy == "shortest-prefill-first" and not cfg.server.radix_cache:
        raise ConfigError("server.schedule_policy", cfg.server.schedule_policy,
                          "a policy other than shortest-prefill-first with server.radix_cache=false",
                          why="SGLang's shortest-prefill-first requires prefix caching")
    if cfg.dp.router not in DP_ROUTERS:
        raise ConfigError("dp.router", cfg.dp.router, ", ".join(DP_ROUTERS))
    _validate_router(cfg, engine)
    validate_pd(cfg, engine)
    if not isinstance(cfg.server.radix_cache, bool):
        raise ConfigError("server.radix_cache", cfg.server.radix_cache, "true or false")
    gpus, where = available_gpus(cfg, engine)
    ws = world_size(cfg)
    if ws > gpus:
        fits = "the cluster" if cfg.hardware.nodes > 1 else "a node"
        layout = ("the deployment" if cfg.pd.enabled
                  else f"world size {cfg.tp.size}x{cfg.pp.size}x{cfg.dp.size}")
        raise ConfigError(world_key(cfg), ws, f"at most {gpus} ({where})",
                          why=f"{layout} needs {ws} GPUs: does not fit {fits}")
    _validate_across_nodes(cfg, ws)

    model = model_info(cfg.model.path)
    if cfg.pp.size > model.num_layers:
        raise ConfigError("pp.size", cfg.pp.size, f"1..{model.num_layers}",
                          why=f"model {cfg.model.name} has {model.num_layers} layers")
    if model.num_heads and model.num_heads % cfg.tp.size:
        divisors = [d for d in range(1, min(model.num_heads, 64) + 1) if model.num_heads % d == 0]
        raise ConfigError("tp.size", cfg.tp.size, f"a divisor of {model.num_heads}: {divisors}",
                          why=f"model {cfg.model.name} has {model.num_heads} attention heads to shard")
    validate_moe_layout(cfg, model)
    if simulated(engine) and cfg.ep.two_batch_overlap:
        raise ConfigError("ep.two_batch_overlap", True, "false on the simulated engine (SGLang runs it)",
                          why="the simulated engine does not model two-batch overlap")
    if cfg.ep.size > 1:
        if not model.is_moe:
            raise ConfigError("ep.size", cfg.ep.size, "1", why=f"model {cfg.model.name} has no experts")
        # vLLM's experts span every GPU of its TP and DP groups: its own rule (vllm_compat/command.py)
        if cfg.tp.size % cfg.ep.size and not plays_vllm(cfg):
            divisors = [d for d in range(1, cfg.tp.size + 1) if cfg.tp.size % d == 0]
            raise ConfigError("ep.size", cfg.ep.size, f"a divisor of tp.size={cfg.tp.size}: {divisors}",
                              why="expert parallelism lives inside the TP group")

    if not 0 <= cfg.pp.async_depth <= MAX_ASYNC_DEPTH:
        raise ConfigError("pp.async_depth", cfg.pp.async_depth, f"0..{MAX_ASYNC_DEPTH}")
    if cfg.pp.async_depth > 0 and cfg.pp.size == 1:
        raise ConfigError("pp.async_depth", cfg.pp.async_depth, "0 when pp.size=1",
                          why="async depth only exists in the pipeline-parallel loop")
    _positive("pp.micro_batch_size", cfg.pp.micro_batch_size, allow_none=True)
    mrr = cfg.server.max_running_requests
    _positive("server.max_running_requests", mrr, allow_none=True)
    if cfg.pp.micro_batch_size is not None and mrr is not None and cfg.pp.micro_batch_size > mrr:
        raise ConfigError("pp.micro_batch_size", cfg.pp.micro_batch_size,
                          f"1..{mrr} (server.max_running_requests) or null")
    cps = cfg.server.chunked_prefill_size
    if cps is not None and cps != -1 and cps < 1:
        raise ConfigError("server.chunked_prefill_size", cps, "an integer >= 1, -1 (off) or null")
    mfs = cfg.server.mem_fraction_static
    if mfs is not None and not 0 < mfs < 1:
        raise ConfigError("server.mem_fraction_static", mfs, "a fraction in (0, 1) or null")
    _positive("server.decode_log_interval", cfg.server.decode_log_interval, allow_none=True)

    _validate_workload(cfg)
    check_slo(cfg.search.slo)  # a sweep's SLOs judge its suggestions too, not only a search's candidates
    _validate_calibration(cfg)
    _validate_step_costs(cfg)
    _validate_ray(cfg)
    if not 0 <= cfg.telemetry.gpu_hz <= MAX_GPU_HZ:
        raise ConfigError("telemetry.gpu_hz", cfg.telemetry.gpu_hz,
                          f"0 (off) to {MAX_GPU_HZ:g} samples per second")
    if not cfg.telemetry.metrics_period_s > 0:
        raise ConfigError("telemetry.metrics_period_s", cfg.telemetry.metrics_period_s, "seconds > 0")
    context = model.max_context
    if context and cfg.workload.input_len + cfg.workload.output_len > context:
        raise ConfigError("workload.input_len+workload.output_len",
                          cfg.workload.input_len + cfg.workload.output_len, f"at most {context}",
                          why=f"model {cfg.model.name} has a {context}-token context")
    input_max, output_max = length_bounds(cfg, context)
    if input_max is not None and output_max is not None and input_max < cfg.workload.input_len:
        raise ConfigError("workload.output_dist", cfg.workload.output_dist,
                          f"outputs of at most {context - cfg.workload.input_len - 1} tokens",
                          why=f"its longest output ({output_max}) leaves less than workload.input_len "
                              f"in model {cfg.model.name}'s {context}-token context")
    if cfg.ray.num_gpus is not None and cfg.ray.num_gpus < 0:
        raise ConfigError("ray.num_gpus", cfg.ray.num_gpus, "an integer >= 0 or null")
    remote = joins_cluster(cfg.ray.address) and cfg.ray.address != "auto" and not str(
        cfg.ray.address).startswith(("127.", "localhost"))
    if remote and (cfg.tracking.uri or "sqlite").startswith("sqlite"):
        raise ConfigError("tracking.uri", cfg.tracking.uri, "an MLflow tracking server URL (http://...)",
                          why="trials on a remote Ray cluster cannot write a local sqlite file; start "
                              "one with: mlflow server --host <address the nodes reach> --port 5000")
    return engine, reason


# engine.sim_faults fields that are shares of requests; the rest are request counts, switches and seconds
_FAULT_FRACTIONS = ("stall_stream_fraction", "http_error_fraction", "malformed_sse_fraction",
                    "cut_stream_fraction")


def _validate_sim_faults(cfg: ParasweepConf, engine: str, reason: str) -> None:
    """Injected faults exist only in the simulated engine: on any other engine a set one is refused
    (a fault drill must never run against real GPUs by mistake); then each value's range."""
    faults = cfg.engine.sim_faults
    if not simulated(engine):
        for f in dataclasses.fields(SimFaultConf):
            value = getattr(faults, f.name)
            if value != f.default:
                unset = "null" if f.default is None else str(f.default).lower()
                raise ConfigError(f"engine.sim_faults.{f.name}", value,
                                  f"only for engine=sim or another engine the simulated engine plays "
                                  f"(leave it at {unset} otherwise)",
                                  why=f"the trial runs on {engine}: {reason}")
    for name in _FAULT_FRACTIONS:
        value = getattr(faults, name)
        if not 0 <= value <= 1:  # NaN fails too
            raise ConfigError(f"engine.sim_faults.{name}", value, "a fraction in [0, 1]")
    _positive("engine.sim_faults.crash_after_requests", faults.crash_after_requests, allow_none=True)
    _positive("engine.sim_faults.hang_after_requests", faults.hang_after_requests, allow_none=True)
    if not (math.isfinite(faults.startup_delay_s) and faults.startup_delay_s >= 0):
        raise ConfigError("engine.sim_faults.startup_delay_s", faults.startup_delay_s, "seconds >= 0")


def _validate_step_costs(cfg: ParasweepConf) -> None:
    """``simulator.step_costs`` names a mode, and ``measured`` needs tables for the hardware's GPU."""
    from simulator.step_costs import MODES, unavailable

    mode = cfg.simulator.step_costs
    if mode not in MODES:
        raise ConfigError("simulator.step_costs", mode, ", ".join(MODES))
    why = unavailable(cfg.hardware.kernel_tables) if mode == "measured" else ""
    if why:
        raise ConfigError("simulator.step_costs", mode, "auto or roofline", why=why)


def _validate_calibration(cfg: ParasweepConf) -> None:
    """A calibration profile fits one hardware profile, and its entries must be usable by the model."""
    cal = cfg.calibration
    if not cal.name:
        return
    if cal.hardware != cfg.hardware.name:
        raise ConfigError("calibration", cal.name, f"a profile fitted for hardware={cfg.hardware.name}",
                          why=f"it was fitted for hardware={cal.hardware}")
    from omegaconf import OmegaConf

    from simulator.calibration import CalibrationError, calibration_from_dict

    try:
        calibration_from_dict(OmegaConf.to_container(OmegaConf.structured(cal), resolve=True))
    except CalibrationError as exc:
        raise ConfigError("calibration", cal.name, "a profile written by python -m orchestrator calibrate",
                          why=str(exc)) from exc


def _validate_workload(cfg: ParasweepConf) -> None:
    w = cfg.workload
    if w.api not in APIS:
        raise ConfigError("workload.api", w.api, ", ".join(APIS))
    validate_traffic(cfg)
    if not w.concurrency and not w.rate and str(w.arrival) != "trace":
        raise ConfigError("workload.concurrency", "[]", "a non-empty list of integers >= 1",
                          why="no load points (workload.rate is empty too)")
    for c in w.concurrency:
        if not isinstance(c, int) or c < 1:
            raise ConfigError("workload.concurrency", list(w.concurrency), "a list of integers >= 1")
    for r in w.rate:
        if not (isinstance(r, int | float) and math.isfinite(r) and r > 0):
            raise ConfigError("workload.rate", list(w.rate), "a list of request rates > 0 (req/s)")
    _positive("workload.input_len", w.input_len)
    _positive("workload.output_len", w.output_len)
    for key, text, n in (("workload.input_dist", w.input_dist, w.input_len),
                         ("workload.output_dist", w.output_dist, w.output_len)):
        try:
            LengthDist.parse(str(text), max(1, n))
        except ValueError as exc:
            raise ConfigError(key, text, "fixed, uniform:R (0..1), normal:CV, exponential or lognormal:SIGMA",
                              why=str(exc)) from None
    _positive("workload.requests_per_point", w.requests_per_point, allow_none=True)
    _positive("workload.requests_per_concurrency", w.requests_per_concurrency)
    if w.warmup_requests < 0:
        raise ConfigError("workload.warmup_requests", w.warmup_requests, "an integer >= 0")
    if w.warmup_per_concurrency is not None and not (0 <= w.warmup_per_concurrency < math.inf):
        raise ConfigError("workload.warmup_per_concurrency", w.warmup_per_concurrency,
                          "a number >= 0 of warm-up requests per stream, or null")
    if not (math.isfinite(w.stall_timeout_s) and w.stall_timeout_s > 0):
        raise ConfigError("workload.stall_timeout_s", w.stall_timeout_s, "seconds > 0")
    if w.point_timeout_s is not None and not (math.isfinite(w.point_timeout_s) and w.point_timeout_s > 0):
        raise ConfigError("workload.point_timeout_s", w.point_timeout_s, "seconds > 0, or null for no limit")
    ramp_ok = w.ramp == "auto" or (isinstance(w.ramp, int | float) and not isinstance(w.ramp, bool)
                                   and math.isfinite(w.ramp) and w.ramp >= 0)
    if not ramp_ok:
        raise ConfigError("workload.ramp", w.ramp, "auto, or seconds >= 0 (0: every stream at once)")
    if w.ci_target is not None and not 0 < w.ci_target < 1:
        raise ConfigError("workload.ci_target", w.ci_target,
                          "a fraction between 0 and 1 (e.g. 0.03: ±3 %), or null for a fixed request count")
    if w.max_point_s is not None and not (math.isfinite(w.max_point_s) and w.max_point_s > 0):
        raise ConfigError("workload.max_point_s", w.max_point_s, "seconds > 0, or null for no limit")
    for key in ("ci_target", "latency_ci_target", "candidate_ci_target"):
        value = getattr(w.predicted, key)
        if not (isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1):
            raise ConfigError(f"workload.predicted.{key}", value,
                              "a fraction between 0 and 1 (e.g. 0.02: ±2 %)")
    if not (isinstance(w.predicted.budget_s, int | float) and math.isfinite(w.predicted.budget_s)
            and w.predicted.budget_s > 0):
        raise ConfigError("workload.predicted.budget_s", w.predicted.budget_s,
                          "seconds > 0 of the engine's virtual time")
