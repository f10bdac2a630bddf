"""``hydra/launcher=parasweep_ray``: one Ray task per Hydra job, asking for the trial's world size in
GPUs (Hydra's stock Ray launcher gives every job the same resources and aborts the sweep when a
worker dies). Every job is composed and validated before the first one starts; trials that already
succeeded with the same resolved config are reused (``resume=false`` re-runs them).

The scheduling itself lives in :mod:`orchestrator.launcher`; this module adapts it to Hydra.

No `from __future__ import annotations` here: Hydra execs plugin modules without registering them
in sys.modules, and dataclasses then cannot resolve string annotations.
"""

import logging
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger("parasweep")


@dataclass
class ParasweepRayLauncherConf:
    _target_: str = "hydra_plugins.parasweep_launcher.ray_launcher.ParasweepRayLauncher"
    cancel_grace_s: float = 20.0  # after Ctrl-C: time for trials to stop their engines before force


ConfigStore.instance().store(group="hydra/launcher", name="parasweep_ray", node=ParasweepRayLauncherConf,
                             provider="parasweep")


def _execute_job(hydra_context: HydraContext, sweep_config: DictConfig, task_function: TaskFunction,
                 singleton_state: dict[Any, Any], in_ray: bool) -> JobReturn:
    """Runs one Hydra job in this process (a Ray worker, or the driver for dry runs)."""
    from orchestrator.progress import DRIVER_RENDERS_PROGRESS_ENV

    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    if in_ray:
        os.environ[DRIVER_RENDERS_PROGRESS_ENV] = "1"
    ret = run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    if in_ray:
        # The driver already holds each job's config: sending it back with every result would keep a
        # second copy per finished trial in the driver (about 130 kB each, measured), so the driver's
        # memory would grow with the sweep. The driver puts its own copy back (_job_return).
        ret.cfg = ret.hydra_cfg = None
    return ret


def job_value(ret: Any) -> dict[str, Any] | None:
    """The trial's ``{"status", "run_id", "timings"}`` from a finished job, None if it raised."""
    if getattr(ret, "status", None) != JobStatus.COMPLETED:
        return None
    value = ret.return_value
    return value if isinstance(value, dict) else None


def short_names(job_overrides: list[list[str]]) -> list[str]:
    """Each job's label: its overrides that differ between jobs, never sweep-wide ones."""
    from orchestrator.trial.plan import trial_label

    common = (frozenset.intersection(*(frozenset(o) for o in job_overrides))
              if len(job_overrides) > 1 else frozenset())
    return [trial_label(overrides, common) for overrides in job_overrides]


def with_repeats(job_overrides: list[list[str]], repeats: int) -> list[list[str]]:
    """Each job ``repeats`` times in a row, as ``repeat=0`` ... ``repeat=N-1`` (a trial each, on a fresh
    engine); unchanged for one repeat."""
    if repeats <= 1:
        return job_overrides
    return [[*overrides, f"repeat={k}"] for overrides in job_overrides for k in range(repeats)]


def _job_return(sc: DictConfig, status: JobStatus, value: Any) -> JobReturn:
    ret = JobReturn(overrides=list(sc.hydra.overrides.task), cfg=sc, hydra_cfg=sc)
    ret.status = status
    ret.return_value = value
    return ret


class ParasweepRayLauncher(Launcher):
    def __init__(self, cancel_grace_s: float = 20.0) -> None:
        self.cancel_grace_s = cancel_grace_s
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.cluster: Any = None  # the Ray the sweep runs on, once started or joined (ClusterInfo)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from orchestrator.config.schema import joins_cluster
        from orchestrator.config.validate import typed_config
        from orchestrator.errors import ConfigError
        from orchestrator.launcher.sweep_jobs import CheckedJob, SweepSettings
        from orchestrator.sweep import ensure_started
        from orchestrator.trial.plan import TrialIdentity, checked_engine_with_reason, make_plan

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()  # resolve ${now:} once, here

        jobs: list[CheckedJob] = []
        job_overrides = with_repeats([list(o) for o in job_overrides], self._repeats(job_overrides))
        names = short_names([list(o) for o in job_overrides])
        for i, (overrides, name) in enumerate(zip(job_overrides, names, strict=True)):
            # compose, validate and preflight every job before starting any
            sc = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            cfg = typed_config(sc)
            if cfg.search.name:  # a search spans its own candidates, in one process
                raise ConfigError("search", cfg.search.name, "a single run (python run.py search=NAME)",
                                  why="a search spans its own candidates: drop -m")
            engine, reason = checked_engine_with_reason(cfg)
            jobs.append(CheckedJob(initial_job_idx + i, sc, cfg, engine, tuple(overrides), name,
                                   engine_reason=reason))
        sweep = SweepSettings.of([j.cfg for j in jobs])
        if not (sweep.dry_run or sweep.predict) and joins_cluster(sweep.ray_address):
            self._start_ray(jobs, sweep)  # a cluster the sweep cannot use is refused before its run is made
        parent_run_id = None if sweep.dry_run else ensure_started()
        for job in jobs:
            sc = job.job_config
            with open_dict(sc):
                sc.tracking.label = job.label
                sc.hydra.job.id = str(job.index)
                sc.hydra.job.num = job.index
                sc.hydra.sweep.dir = str(sweep_dir)  # workers may run with another cwd
                sc.tracking.uri = sweep.tracking_uri
                sc.tracking.parent_run_id = parent_run_id
                sc.engine.name = job.engine  # what "auto" became: the trial does not validate again
                sc.tracking.engine_reason = job.engine_reason  # and why, as the driver saw its node
            job.cfg = typed_config(sc)

        if sweep.dry_run or sweep.predict:
            # plans or virtual-time predictions: nothing is launched, so no Ray and no GPUs
            return [_execute_job(self.hydra_context, j.job_config, self.task_function, Singleton.get_state(),
                                 False) for j in jobs]

        for job in jobs:
            identity = TrialIdentity(job.index, job.label, sweep_dir / str(job.index), job.overrides)
            job.config_hash = make_plan(job.cfg, job.engine, identity).config_hash
        reused = self._reuse(jobs, sweep, parent_run_id, sweep_dir) if sweep.resume else {}
        todo = [j for j in jobs if j.index not in reused]
        results = dict(reused)
        if todo:
            for job, ret in self._run(todo, sweep, sweep_dir):
                results[job.index] = ret
        return [results[j.index] for j in jobs]

    def _repeats(self, job_overrides: Sequence[Sequence[str]]) -> int:
        """``repeats`` of the sweep (a sweep-wide key: the first job's value; the others are checked
        with the rest of the sweep-wide keys)."""
        from orchestrator.config.validate import typed_config

        assert self.config is not None and self.hydra_context is not None
        if not job_overrides:
            return 1
        sc = self.hydra_context.config_loader.load_sweep_config(self.config, list(job_overrides[0]))
        return int(typed_config(sc).repeats)

    def _run(self, todo: list[Any], sweep: Any, sweep_dir: Path) -> list[tuple[Any, JobReturn]]:
        from orchestrator.config.schema import trial_nodes, world_size
        from orchestrator.launcher.estimate import predict_trials
        from orchestrator.launcher.queue import QueuedTrial
        from orchestrator.launcher.ray_runner import TrialJob
        from orchestrator.progress import TrialSlot

        # a sweep of predictions predicts each trial as it runs it: nothing to put beside it, and the
        # queue's order is not worth predicting every trial twice
        predictions = ([None] * len(todo) if all(j.cfg.predict for j in todo)
                       else predict_trials([j.cfg for j in todo], sweep_dir / ".predictions"))
        pred_by_idx = {j.index: p for j, p in zip(todo, predictions, strict=True) if p is not None}
        # estimates order the queue only if every trial has one (mixing would compare unlike numbers)
        est_by_idx = ({i: p.duration_s for i, p in pred_by_idx.items()}
                      if len(pred_by_idx) == len(todo) else {})
        ray_jobs = []
        for job in todo:
            queued = QueuedTrial(job.index, world_size(job.cfg), job.label, est_by_idx.get(job.index),
                                 nodes=trial_nodes(job.cfg))
            ray_job = TrialJob(queued, job.job_config, cpus=job.cfg.ray.cpus_per_trial,
                               accelerator_type=job.cfg.ray.accelerator_type)
            ray_job.slot = TrialSlot(sweep_dir / str(job.index), f"#{job.index} {job.label}")
            ray_jobs.append(ray_job)
        finished = self._run_on_ray(ray_jobs, todo, sweep, sweep_dir)
        self._log_predictions(finished, pred_by_idx, sweep)
        by_idx = {j.index: j for j in todo}
        out = []
        for ray_job in finished:
            job = by_idx[ray_job.queued.index]
            result = ray_job.result
            ret = (_job_return(job.job_config, result.status, result._return_value) if result is not None
                   else _job_return(job.job_config, JobStatus.FAILED, ray_job.error))
            out.append((job, ret))
        return out

    @staticmethod
    def _log_predictions(jobs: list[Any], predictions: dict[int, Any], sweep: Any) -> None:
        """Predicted next to measured: ``pred/<point>/<metric>`` in each trial's run."""
        from orchestrator.store.tracking import Tracker

        tracker = None
        for job in jobs:
            value = job_value(job.result)
            prediction = predictions.get(job.queued.index)
            if value is None or not value.get("run_id") or prediction is None:
                continue
            try:
                tracker = tracker or Tracker(sweep.tracking_uri, sweep.experiment)
                tracker.log_metrics(value["run_id"], prediction.as_metrics())
            except Exception as exc:  # a convenience: the measured numbers are already stored
                log.warning("could not log predictions for trial %d: %s", job.queued.index, exc)

    def _reuse(self, jobs: list[Any], sweep: Any, parent_run_id: str | None,
               sweep_dir: Path) -> dict[int, JobReturn]:
        """Trials that already succeeded with the same config hash: recorded as skipped, not run."""
        from orchestrator.launcher.resume import previous_successes, record_reuse
        from orchestrator.progress import ProgressWriter
        from orchestrator.store.tracking import Tracker

        tracker = Tracker(sweep.tracking_uri, sweep.experiment)
        previous = previous_successes(tracker, {j.config_hash for j in jobs})
        reused: dict[int, JobReturn] = {}
        for job in jobs:
            prev = previous.get(job.config_hash)
            if prev is None:
                continue
            record_reuse(tracker, parent_run_id, job.index, job.label, prev)
            message = f"reused run {prev.info.run_id} (same config hash {job.config_hash})"
            log.info("skipping #%d %s: %s", job.index, job.label, message)
            print(f"[parasweep] skipping #{job.index} {job.label}: succeeded before, {message}; "
                  "resume=false re-runs it", flush=True)
            (sweep_dir / str(job.index)).mkdir(parents=True, exist_ok=True)
            ProgressWriter(sweep_dir / str(job.index), job.label).update(status="skipped", message=message,
                                                                         force=True)
            reused[job.index] = _job_return(job.job_config, JobStatus.COMPLETED, {
                "status": "skipped", "run_id": prev.info.run_id, "timings": {}})
        return reused

    def _start_ray(self, jobs: list[Any], sweep: Any) -> Any:
        """Start the sweep's own Ray or join the cluster (once), say which, and refuse a cluster whose
        other nodes cannot write the sweep's tracking store."""
        from orchestrator.config.schema import joins_cluster
        from orchestrator.errors import UserError
        from orchestrator.launcher.ray_cluster import init_ray
        from orchestrator.store.tracking import is_local_store
        from vocab.status import simulated

        if self.cluster is not None:
            return self.cluster
        num_gpus = sweep.ray_num_gpus
        if num_gpus is None and all(simulated(j.engine) for j in jobs):
            num_gpus = jobs[0].cfg.hardware.num_gpus  # the simulated node's GPUs, for placement
        num_cpus = sweep.ray_num_cpus
        if num_cpus is None and not joins_cluster(sweep.ray_address) and num_gpus:
            # let GPUs decide how many trials fit side by side, not this machine's core count
            per_trial = max(j.cfg.ray.cpus_per_trial for j in jobs)
            num_cpus = max(os.cpu_count() or 1, int(num_gpus * per_trial))
        cluster = init_ray(sweep.ray_address, num_gpus, num_cpus)
        print(f"[parasweep] {cluster.describe()}", flush=True)
        from orchestrator.prediction.modelled import step_costs_label

        costs = "; ".join(sorted({step_costs_label(j.cfg) for j in jobs}))
        print(textwrap.fill(f"[parasweep] step costs: {costs}", 100, subsequent_indent="    "), flush=True)
        uri = sweep.tracking_uri
        if cluster.nodes > 1 and is_local_store(uri):
            raise UserError(
                f"tracking.uri={uri}: trials on other Ray nodes cannot write this machine's local store; "
                "valid: an MLflow tracking server, e.g. run `mlflow server --host <an address the other "
                "nodes reach> --port 5000 --backend-store-uri sqlite:///runs/mlflow.db` and pass "
                "tracking.uri=http://<that address>:5000")
        self.cluster = cluster
        return cluster

    def _run_on_ray(self, ray_jobs: list[Any], jobs: list[Any], sweep: Any, sweep_dir: Path) -> list[Any]:
        from orchestrator.launcher.ray_runner import RayTrialRunner

        self._start_ray(jobs, sweep)
        uri = sweep.tracking_uri

        def args_for(job: Any) -> tuple[Any, ...]:
            return (self.hydra_context, job.payload, self.task_function, Singleton.get_state(), True)

        runner = RayTrialRunner(_execute_job, args_for, sweep_dir, self.cancel_grace_s,
                                tracking=(uri, sweep.experiment), value_of=job_value)
        return runner.run(ray_jobs)
