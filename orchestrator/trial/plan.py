"""Stage 1, *plan*: a validated config becomes everything a trial will do, before anything starts.

Pure data in, pure data out (no Hydra, no processes): the engine adapter, the load points, the request
spec, the resolved config and its hash, and the trial's identity (number, label, directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.identity import config_hash, resolved_config_dict
from orchestrator.config.schema import PD_ROLES, SWEEP_WIDE_KEYS, ParasweepConf, role_config, world_size
from orchestrator.engines.base import FIRST_NODE, Engine, NodePlace
from orchestrator.engines.registry import get_engine
from orchestrator.engines.router import PDLaunch, RoutedLaunch
from orchestrator.points.plan import load_points, request_spec
from vocab.load import LoadPoint, RequestSpec

SINGLE_RUN_LABEL = "single run"  # the label of the one trial of `python run.py key=value ...` (no -m)


def is_sweep_wide(override: str) -> bool:
    """A sweep-wide key, or Hydra's own settings: not part of what distinguishes a trial."""
    key = override.lstrip("+~").split("=", 1)[0]
    return key in SWEEP_WIDE_KEYS or key.startswith("hydra.")


def trial_label(overrides: tuple[str, ...] | list[str], common: frozenset[str] = frozenset()) -> str:
    """What a person reads for a trial: its overrides, less those every trial of the sweep shares
    (``common``) and the sweep-wide ones. Secrets are masked."""
    from orchestrator.redact import redact_override

    kept = [redact_override(o) for o in overrides if o not in common and not is_sweep_wide(o)]
    return " ".join(kept) or "defaults"


def checked_engine(cfg: ParasweepConf) -> str:
    """Validate a job and preflight its engine (a flag the installed engine would refuse stops here):
    the concrete engine name. Raises a one-line ConfigError/UserError."""
    return checked_engine_with_reason(cfg)[0]


def checked_engine_with_reason(cfg: ParasweepConf) -> tuple[str, str]:
    """``checked_engine``, and why that engine (``engine=auto: no NVIDIA GPU on this node``, ...)."""
    from orchestrator.config.validate import validate_with_reason

    engine_name, reason = validate_with_reason(cfg)
    get_engine(engine_name).preflight(cfg)
    return engine_name, reason


@dataclass(frozen=True)
class TrialIdentity:
    """Who the trial is. ``label`` is what a person reads: the overrides that vary between the sweep's
    trials (never sweep-wide ones such as ``tracking.uri``); ``overrides`` are all of the trial's own."""

    num: int
    label: str
    trial_dir: Path
    overrides: tuple[str, ...] = ()

    @property
    def run_name(self) -> str:
        return f"#{self.num} {self.label}"


@dataclass
class TrialPlan:
    cfg: ParasweepConf
    identity: TrialIdentity
    engine: Engine
    points: list[LoadPoint]
    spec: RequestSpec
    resolved_cfg: dict[str, Any] = field(default_factory=dict)  # the config with engine=auto resolved
    config_hash: str = ""

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def world_size(self) -> int:
        return world_size(self.cfg)

    def argv(self, port: int, node: NodePlace = FIRST_NODE) -> list[str]:
        return self.engine.argv(self.cfg, port, self.identity.trial_dir, node)


def make_plan(cfg: ParasweepConf, engine_name: str, identity: TrialIdentity) -> TrialPlan:
    """``engine_name`` is the concrete engine validation chose (``sim`` or ``sglang``, never ``auto``)."""
    engine = get_engine(engine_name)
    resolved = resolved_config_dict(cfg, engine_name)
    return TrialPlan(cfg, identity, engine, load_points(cfg), request_spec(cfg), resolved,
                     config_hash(resolved, engine.version(cfg)))


def pd_plan_lines(plan: TrialPlan, launch: PDLaunch) -> list[str]:
    """What a dry run prints for a disaggregated trial: the deployment on one line, each server's
    command with its GPUs (``argv[prefill server 0]: ...``), the router's, and what they were checked
    against."""
    cfg, ident = plan.cfg, plan.identity
    roles = " ".join(f"{role}={getattr(cfg.pd, role).workers}x(tp={one.tp.size} pp={one.pp.size} "
                     f"ep={one.ep.size} dp={one.dp.size})"
                     for role, one in ((r, role_config(cfg, r)) for r in PD_ROLES))
    lines = [f"trial {ident.num} [{ident.label}]: engine={plan.engine_name} model={cfg.model.name} "
             f"hardware={cfg.hardware.name} disaggregated {roles} transfer={cfg.pd.transfer_backend} "
             f"world_size={world_size(cfg)} GPUs={world_size(cfg)}"]
    lines += [f"argv[{s.name}]: " + json.dumps(s.argv) for s in launch.servers]
    lines += [f"router argv: {json.dumps(launch.router)}",
              "server GPUs (positions in the trial's CUDA_VISIBLE_DEVICES): "
              + ", ".join(f"{s.name} → {s.gpus}" for s in launch.servers)]
    lines += [f"env[{s.name}]: " + " ".join(f"{k}={v}" for k, v in s.env.items()) for s in launch.servers
              if s.env]
    return [*lines, *plan.engine.plan_notes(role_config(cfg, "decode"))]


def plan_lines(plan: TrialPlan, argvs: list[list[str]], routed: RoutedLaunch | None = None) -> list[str]:
    """What a dry run prints for one trial: the layout on one line, the exact command on its own line
    (``argv: <JSON list>``; across nodes one per node, ``argv[node N]: ...``, rank 0 serving HTTP;
    behind the router package one per DP replica, ``argv[replica N]: ...`` with the GPUs it gets, then
    ``router argv: ...``), then what the commands were checked against."""
    cfg, ident = plan.cfg, plan.identity
    gpus = world_size(cfg)
    nodes = f" nodes={len(argvs)}" if len(argvs) > 1 and routed is None else ""
    if routed is not None:
        commands = [f"argv[replica {rank}]: " + json.dumps(argv) for rank, argv in enumerate(argvs)]
        commands += [f"router argv: {json.dumps(routed.router)}",
                     "replica GPUs (positions in the trial's CUDA_VISIBLE_DEVICES): "
                     + ", ".join(f"replica {rank} → {gpus}"
                                 for rank, (_, gpus) in enumerate(routed.replicas))]
    else:
        commands = (["argv: " + json.dumps(argvs[0])] if len(argvs) == 1 else
                    [f"argv[node {rank}]: " + json.dumps(argv) for rank, argv in enumerate(argvs)])
    return [f"trial {ident.num} [{ident.label}]: engine={plan.engine_name} model={cfg.model.name} "
            f"hardware={cfg.hardware.name} tp={cfg.tp.size} pp={cfg.pp.size} ep={cfg.ep.size} "
            f"dp={cfg.dp.size} world_size={gpus} GPUs={gpus}{nodes}",
            *commands, *plan.engine.plan_notes(cfg)]
