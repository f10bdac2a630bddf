"""What the simulator's model says about a configuration, for code that is not a trial: one load point
predicted in virtual time, and decode-step estimates (communication share, memory-bound floor).

Each call works on its own scratch directory (the simulated engine reads its hardware profile and
any shrunk model from files) and leaves nothing behind. Everything here is a model's number, never a
measurement: callers say so where a person reads it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from analysis.diagnose import ENV_PREFIX, StepEstimate
from orchestrator.config.schema import ParasweepConf, plays_vllm
from orchestrator.config.validate import validate
from orchestrator.engines.virtual import pd_layout, prediction_argv, virtual_trials
from orchestrator.errors import ConfigError
from orchestrator.points.plan import load_points, request_spec
from simulator.predict_disagg import PDLayout
from simulator.sim_config import SimConfig
from vocab.load import LoadPoint
from vocab.records import PointResult
from vocab.values import int_or_none


def step_costs_label(cfg: ParasweepConf) -> str:
    """What prices the simulator's steps for ``cfg`` (``simulator.step_costs`` on its hardware), in one
    line: "measured (aiconfigurator-core 0.12.0: h100_sxm, SGLang 0.5.14)" or "roofline
    (why)". Every run, prediction and predicted effect carries it."""
    return step_costs_of(cfg.simulator.step_costs, cfg.hardware.kernel_tables, plays_vllm(cfg),
                         cfg.vllm.release, cfg.hardware.collective_tables)


def step_costs_of(mode: str, table_set: str | None, vllm: bool, vllm_release: str | None,
                  collective_tables: str | None = None) -> str:
    """The step-cost label of ``mode`` on ``table_set`` (and the profile's ``collective_tables``) for the
    engine the simulator plays: vLLM's tables at ``vllm_release`` (the newest played where None) where
    ``vllm``, else SGLang's; ``simulator.step_costs.StepCostsError`` for a mode it cannot honour."""
    from simulator.step_costs import describe_step_costs

    if vllm:
        from simulator.vllm.releases import NEWEST

        return describe_step_costs(mode, table_set, vllm_release or NEWEST, "vllm", collective_tables).label()
    return describe_step_costs(mode, table_set, collective_tables=collective_tables).label()


def apply_change(cfg: ParasweepConf, change: Mapping[str, Any]) -> tuple[ParasweepConf, dict[str, str]]:
    """The config with ``change`` applied (config keys, or a group's option: ``pd=1p3d``) and the engine
    environment it adds; raises
    ``UserError`` (via validation) when the changed config is not possible, e.g. a layout that needs
    more GPUs than the node has."""
    from omegaconf.errors import OmegaConfBaseException

    # typed: each changed group goes through OmegaConf, so a value of the wrong type fails, naming the
    # key; the rest is copied as it is (the whole config through OmegaConf costs ~35 ms a candidate, and
    # a search changes thousands)
    changed = copy.deepcopy(cfg)
    groups: dict[str, Any] = {}
    env: dict[str, str] = {}
    # a group's option first (``pd=1p3d``: the group as that file composes it), then keys inside groups
    for key, value in sorted(change.items(), key=lambda kv: "." in kv[0] or kv[0].startswith(ENV_PREFIX)):
        if key.startswith(ENV_PREFIX):
            env[key.removeprefix(ENV_PREFIX)] = str(value)
            continue
        group, _, rest = key.partition(".")
        if not dataclasses.is_dataclass(getattr(changed, group, None)):
            raise ConfigError(key, value, "a key inside a config group (tp.size, server.cuda_graph, ...)")
        if not rest:
            groups[group] = group_option(group, type(getattr(changed, group)), value)
            continue
        try:
            if group not in groups:
                groups[group] = OmegaConf.structured(getattr(changed, group))
            OmegaConf.update(groups[group], rest, value, merge=False)
        except OmegaConfBaseException as exc:
            raise ConfigError(key, value, "a value of the key's type",
                              why=str(exc).splitlines()[0]) from None
    for group, conf in groups.items():
        setattr(changed, group, OmegaConf.to_object(conf))
    # predicted on the simulated engine playing the trial's engine, whatever the trial ran on
    changed.engine.name = "sim-vllm" if plays_vllm(changed) else "sim"
    changed.engine.time_scale = 1.0
    changed.predict = True  # in virtual time: a deployment wider than one node is judged too
    validate(changed)
    return changed, env


def group_option(group: str, schema: type, option: Any) -> Any:
    """Config group ``group`` as its option ``option`` (``conf/<group>/<option>.yaml``) composes it over
    the schema's defaults, as Hydra does for ``group=option``: an option's ``defaults`` naming other
    options of the same group are composed first. Raises a ``ConfigError`` naming the options there are."""
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    from vocab.assets import conf_dir, group_options

    def load(name: str, seen: tuple[str, ...]) -> list[dict[str, Any]]:
        path = conf_dir() / group / f"{name}.yaml"
        text = path.read_text() if path.is_file() and name not in seen else ""
        if not text or "# @package _global_" in text:  # a preset of several groups: not one group's
            raise ConfigError(group, option, ", ".join(group_options(group)) or f"an option of {group}")
        body = yaml.safe_load(text) or {}
        defaults = body.pop("defaults", None) or ["_self_"]
        layers: list[dict[str, Any]] = []
        for entry in defaults:
            layers += [body] if entry == "_self_" else load(str(entry), (*seen, name))
        return layers

    conf = OmegaConf.structured(schema)
    try:
        for layer in load(str(option), ()):
            conf = OmegaConf.merge(conf, layer)
    except OmegaConfBaseException as exc:
        raise ConfigError(group, option, "an option whose keys fit the group",
                          why=str(exc).splitlines()[0]) from None
    return conf


@contextlib.contextmanager
def engine_env(env: Mapping[str, str]) -> Iterator[None]:
    """The simulator reads SGLang's environment variables (e.g. the PP layer partition) at start-up,
    as SGLang does; a prediction of a changed environment sets them for its duration only."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def predict_at(cfg: ParasweepConf, env: Mapping[str, str], point: LoadPoint | None) -> dict[str, float]:
    """The prediction of one load point (``None``: the config's first point) in virtual time."""
    from simulator.predict import run_points

    point = point or load_points(cfg)[0]
    with tempfile.TemporaryDirectory(prefix="parasweep-predict-") as tmp, engine_env(env):
        return run_points(virtual_trials(cfg, Path(tmp)), [point], request_spec(cfg))[0].metrics


def configured_engine(cfg: ParasweepConf, env: Mapping[str, str]) -> SimConfig:
    """The simulated engine configured as ``cfg`` would start it (flags resolved, cost model built).
    Raises what the engine raises for a config it cannot run (e.g. weights that do not fit: a
    ``ValueError``)."""
    from simulator.predict import load_config

    with tempfile.TemporaryDirectory(prefix="parasweep-predict-") as tmp, engine_env(env):
        return load_config(prediction_argv(cfg, Path(tmp)))


def configured_deployment(cfg: ParasweepConf, env: Mapping[str, str]) -> PDLayout:
    """A disaggregated deployment configured as ``cfg`` would start it (each role's flags resolved once;
    ``fresh()`` makes a deployment to run points on). Raises as ``configured_engine``."""
    with tempfile.TemporaryDirectory(prefix="parasweep-predict-") as tmp, engine_env(env):
        return pd_layout(cfg, Path(tmp))


def point_predictor(cfg: ParasweepConf, env: Mapping[str, str]) -> Callable[[LoadPoint], PointResult]:
    """Predict many load points of one config cheaply: the simulated engine is configured once and
    each point runs on a fresh engine in virtual time. Raises as ``configured_engine``."""
    with tempfile.TemporaryDirectory(prefix="parasweep-predict-") as tmp, engine_env(env):
        fresh = virtual_trials(cfg, Path(tmp))
    spec = request_spec(cfg)
    return lambda point: fresh().run_point(point, spec)


def modelled_steps(cfg: ParasweepConf, concurrency: Mapping[str, int], resolved: Mapping[str, Any]
                   ) -> tuple[dict[str, StepEstimate], tuple[int, ...]]:
    """The cost model's decode step at each closed-loop point (the requests of one micro-batch: the
    concurrency of one DP replica spread over micro-batches of at most the resolved cap, at the mean
    context length),
    and the layers per PP stage as the engine splits them (honouring SGLANG_PP_LAYER_PARTITION)."""
    from simulator.estimates import decode_step
    from simulator.predict import load_config

    sim_cfg = apply_change(cfg, {})[0]
    with tempfile.TemporaryDirectory(prefix="parasweep-estimate-") as tmp:
        argv = prediction_argv(sim_cfg, Path(tmp))
        model = load_config(argv)
        # experts over an EP group without EPLB: the same model with the ranks' shares evened out
        balanced = (load_config([*argv, "--enable-eplb"]) if model.ep > 1 and not model.par.eplb
                    else None)
    cap = int_or_none(resolved.get("pp_max_micro_batch_size")) or model.pp_max_micro_batch_size
    context = cfg.workload.input_len + cfg.workload.output_len // 2
    slots = cfg.pp.size + cfg.pp.async_depth
    steps = {}
    for label, c in concurrency.items():
        # requests are spread over the DP replicas or attention-DP ranks; caps are per replica or rank
        c = math.ceil(c / (cfg.dp.size * cfg.dp.attention))
        batch = max(1, min(cap, math.ceil(c / min(slots, math.ceil(c / cap)))))
        step = decode_step(model, batch, context)
        even = decode_step(balanced, batch, context).step_s if balanced is not None else 0.0
        steps[label] = StepEstimate(step.batch, step.step_s, step.comm_s, step.memory_bound_s,
                                    step.spec_step_s, step.verify_s, step.spec_tokens, even)
    return steps, tuple(model.cost.stage_layers)




def with_measured_acceptance(cfg: ParasweepConf, resolved: Mapping[str, Any],
                             measured: Sequence[float]) -> ParasweepConf:
    """A speculative trial that measured its accept length (``measured``: the points' means) predicts its
    changes with it: ``spec.acceptance`` becomes the per-position rate that accepts the measured mean at
    the depth the engine ran, so a change of depth reads the same draft's acceptance on the same traffic.
    Unchanged without speculation, or without a measurement."""
    from simulator.speculative.acceptance import rate_for_length

    steps = int_or_none(resolved.get("speculative_num_steps"))
    tokens = int_or_none(resolved.get("speculative_num_draft_tokens"))
    values = [m for m in measured if m and math.isfinite(m)]
    if cfg.spec.algorithm == "none" or not values or not steps or not tokens:
        return cfg
    depth = max(1, min(steps, tokens - 1))
    mean = min(max(sum(values) / len(values), 1.0), depth + 1.0)
    changed = copy.deepcopy(cfg)
    changed.spec.acceptance = [round(rate_for_length(mean, depth), 4)]
    return changed
