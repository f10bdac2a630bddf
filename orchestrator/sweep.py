"""The sweep's parent MLflow run. A Hydra callback notes the sweep in the driver before any trial;
the run itself is created once the trials' configs have passed validation (so a typo leaves no empty
sweep behind), and ``run.py`` closes it with the overall status once every trial has ended."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from orchestrator.process.guardian import start_guardian
from orchestrator.redact import redact_argv
from orchestrator.store.stale import close_stale_runs, driver_tags
from orchestrator.store.sync import sync_pending
from orchestrator.store.tracking import Tracker, check_store, tracking_uri
from vocab.status import RunKind, Tag, TrialStatus


@dataclass
class SweepState:
    uri: str
    experiment: str
    sweep_dir: str
    multirun: bool
    mode: str = "measure"  # or "prediction" (predict=true), or "search" (search=NAME: set by the search)
    run_id: str | None = None
    experiment_id: str | None = None
    step_costs: str = ""  # what prices the simulator's steps for the sweep's base config
    plots: bool = True  # report.plots: the trials' and the sweep's plots at the end
    html: bool = True  # report.html: the sweep's HTML report at the end


ACTIVE: SweepState | None = None


def note_sweep(config: DictConfig, multirun: bool) -> None:
    global ACTIVE
    if config.get("dry_run"):
        return
    sweep_dir = str(config.hydra.sweep.dir if multirun else config.hydra.run.dir)
    ACTIVE = SweepState(tracking_uri(config.tracking.uri), config.tracking.experiment,
                        os.path.abspath(sweep_dir), multirun,
                        mode="prediction" if config.get("predict") else "measure",
                        step_costs=_step_costs(config), plots=bool(config.report.plots),
                        html=bool(config.report.html))


def _step_costs(config: DictConfig) -> str:
    """The step-cost label of the base config ("" when it is invalid: validation says why later); each
    trial's run carries its own (a sweep over engines prices each engine with its own tables)."""
    from orchestrator.config.schema import VLLM_ENGINES
    from orchestrator.prediction.modelled import step_costs_of
    from simulator.step_costs import StepCostsError

    try:
        return step_costs_of(str(config.simulator.step_costs), config.hardware.get("kernel_tables"),
                             config.engine.name in VLLM_ENGINES, config.vllm.release,
                             config.hardware.get("collective_tables"))
    except StepCostsError:
        return ""


def ensure_started() -> str | None:
    """The parent run id, creating the run on first use (driver process only). Every path that tracks
    passes here once, after the trials' configs are validated and before anything launches (a single
    run and ``-m`` alike; dry runs never do), so the store is checked here: a Hydra callback cannot
    stop a run, Hydra turns its exceptions into warnings."""
    state = ACTIVE
    if state is None:
        return None
    if state.run_id is None:
        check_store(state.uri)
        # writes spooled while the tracking server was away (orchestrator/store/spool.py) land first, so a
        # killed driver's runs are judged below on everything they wrote
        for line in sync_pending(state.uri):
            print(f"parasweep: spool: {line}", flush=True)
        tracker = Tracker(state.uri, state.experiment)
        close_stale_runs(tracker)  # what a driver killed outright left "running" (store/stale.py)
        state.run_id = _start_sweep_run(tracker, state)
        state.experiment_id = tracker.experiment_id
        # from here on engines and Ray may start: if this driver is killed outright, its guardian
        # stops what it leaves running (orchestrator/process/guardian.py)
        start_guardian(Path(state.sweep_dir))
    return state.run_id


def _start_sweep_run(tracker: Tracker, state: SweepState) -> str:
    argv = redact_argv(sys.argv[1:])
    args = " ".join(argv)
    # the name says what is swept (the rest is in the command tag), so runs tables stay readable
    swept = [a for a in argv if "=" in a and "," in a.split("=", 1)[1]] or [a for a in argv if "=" in a]
    kind = state.mode if state.mode in ("prediction", "search") else "sweep"
    return tracker.start_run(
        f"{kind} {' '.join(swept) or 'defaults'}",
        tags={Tag.KIND: RunKind.SWEEP.value, Tag.MODE: state.mode, Tag.STATUS: TrialStatus.RUNNING.value,
              Tag.STARTED: time.strftime("%Y-%m-%d %H:%M:%S"),
              Tag.COMMAND: f"python run.py {args}".strip(),
              Tag.SWEEP_DIR: state.sweep_dir, **driver_tags(),
              **({Tag.STEP_COSTS: state.step_costs} if state.step_costs else {})})


class SweepCallback(Callback):
    """Registered in conf/config.yaml under hydra.callbacks; runs in the driver process."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        note_sweep(config, multirun=True)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        note_sweep(config, multirun=False)
