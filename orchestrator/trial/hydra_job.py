"""The Hydra task function's body: a Hydra job becomes a trial plan, then a trial.

The only module of the trial that knows Hydra. A sweep's jobs were validated by the launcher before
any started (it also resolved ``engine=auto`` and set each trial's label and parent run); a single run
(``python run.py``) is validated here. Either way each job is validated and preflighted once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from orchestrator.config.schema import ParasweepConf, router_process, trial_nodes
from orchestrator.config.validate import typed_config
from orchestrator.engines.base import NodePlace
from orchestrator.engines.router import pd_launch, routed_launch
from orchestrator.engines.sglang_compat.disagg import DEFAULT_BOOTSTRAP_PORT
from orchestrator.errors import UserError
from orchestrator.prediction.at_load import shared_cache
from orchestrator.progress import DRIVER_RENDERS_PROGRESS_ENV
from orchestrator.redact import redact_argv
from orchestrator.trial.plan import (
    SINGLE_RUN_LABEL,
    TrialIdentity,
    checked_engine_with_reason,
    make_plan,
    pd_plan_lines,
    plan_lines,
    trial_label,
)
from orchestrator.trial.run import TrialRunSettings, execute_trial
from vocab.status import TrialStatus


def run_trial(raw_cfg: DictConfig) -> dict[str, Any]:
    """Returns ``{"status": ok|failed|killed|skipped, "run_id", "timings"}`` (timings: epoch seconds of
    the task's start, engine launch/ready/stop, load start/end)."""
    task_start = time.time()
    cfg = typed_config(raw_cfg)
    hc = HydraConfig.get()

    if hc.mode == RunMode.RUN:  # a single run: this process validates and says why this engine
        engine_name, cfg.tracking.engine_reason = checked_engine_with_reason(cfg)
        nodes = trial_nodes(cfg)
        if nodes > 1 and not (cfg.predict or cfg.dry_run):  # it runs here, in no placement group
            raise UserError(f"a trial across {nodes} nodes runs as a sweep on the Ray cluster, which "
                            "reserves its nodes: add -m (python run.py -m ...), or predict=true / "
                            "dry_run=true")
    else:  # a sweep's job: the launcher did both on the driver
        engine_name = cfg.engine.name
    overrides = tuple(hc.overrides.task)
    num = int(hc.job.num) if hc.job.get("num") is not None else 0
    # a sweep's launcher labels each trial with what varies between them; a single run has nothing to
    # tell apart (its overrides are in config/overrides.yaml and the sweep run's name)
    label = cfg.tracking.label or (SINGLE_RUN_LABEL if hc.mode == RunMode.RUN else trial_label(overrides))
    identity = TrialIdentity(num, label, Path(hc.runtime.output_dir).resolve(), overrides)
    plan = make_plan(cfg, engine_name, identity)
    if cfg.dry_run:
        from orchestrator.process.server import free_port

        port = free_port()
        if cfg.pd.enabled:  # every prefill and decode server, the router in PD mode in front
            def server(one: ParasweepConf, server_port: int) -> list[str]:
                return redact_argv(plan.engine.argv(one, server_port, identity.trial_dir))

            n = cfg.pd.prefill.workers + cfg.pd.decode.workers
            launch = pd_launch(cfg, server, [free_port() for _ in range(n)],
                               lambda offset, _: DEFAULT_BOOTSTRAP_PORT + offset, port, free_port(), None)
            lines = pd_plan_lines(plan, launch)
        elif router_process(cfg, engine_name):  # one server per DP replica, the router in front
            def replica(one: ParasweepConf, replica_port: int) -> list[str]:
                return redact_argv(plan.engine.argv(one, replica_port, identity.trial_dir))

            launch = routed_launch(cfg, replica, [free_port() for _ in range(cfg.dp.size)], port, free_port(),
                                   None)
            lines = plan_lines(plan, [argv for argv, _ in launch.replicas], launch)
        else:  # across nodes: one process per node, rank 0 serving HTTP
            lines = plan_lines(plan, [redact_argv(plan.argv(port, NodePlace(rank)))
                                      for rank in range(trial_nodes(cfg))])
        for line in lines:
            print(line, flush=True)
        return {"status": TrialStatus.SKIPPED.value, "run_id": None, "timings": {}}

    from orchestrator.sweep import ensure_started

    sweep_dir = hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.runtime.output_dir
    settings = TrialRunSettings(
        tracking_uri=cfg.tracking.uri, experiment=cfg.tracking.experiment,
        parent_run_id=cfg.tracking.parent_run_id or ensure_started(),  # a single run: this process
        reproduces=cfg.reproduce, own_progress_view=not os.environ.get(DRIVER_RENDERS_PROGRESS_ENV),
        predictions_dir=shared_cache(Path(sweep_dir).resolve()))
    return execute_trial(plan, settings, task_start).as_job_return()
