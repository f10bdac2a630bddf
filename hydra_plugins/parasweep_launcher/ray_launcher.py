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
    from orchestrator.trial import IN_RAY_ENV

    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    if in_ray:
        os.environ[IN_RAY_ENV] = "1"
    return run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


def short_names(job_overrides: list[list[str]]) -> list[str]:
    """Each job's overrides that differ between jobs (what a person compares in the runs table)."""
    from orchestrator.redact import redact_override

    common = set.intersection(*(set(o) for o in job_overrides)) if len(job_overrides) > 1 else set()
    names = []
    for overrides in job_overrides:
        varying = [redact_override(o) for o in overrides if o not in common]
        names.append(" ".join(varying) or " ".join(redact_override(o) for o in overrides) or "defaults")
    return names


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

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from orchestrator.config.identity import config_hash, resolved_config_dict
        from orchestrator.config.validate import typed_config, validate, world_size
        from orchestrator.engines.registry import get_engine
        from orchestrator.launcher.estimate import predict_trials
        from orchestrator.launcher.queue import QueuedTrial
        from orchestrator.sweep import ensure_started
        from orchestrator.tracking import tracking_uri

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()  # resolve ${now:} once, here

        checked = []
        for i, overrides in enumerate(job_overrides):  # compose and validate all before starting any
            sc = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            cfg = typed_config(sc)
            engine = validate(cfg)
            get_engine(engine).preflight(cfg)  # e.g. a flag the installed SGLang does not know
            checked.append((initial_job_idx + i, sc, cfg, engine, " ".join(overrides) or "defaults"))
        dry_run = any(cfg.dry_run for _, _, cfg, _, _ in checked)
        parent_run_id = None if dry_run else ensure_started()
        names = short_names([list(o) for o in job_overrides])
        for (idx, sc, cfg, engine, _), name in zip(checked, names, strict=True):
            with open_dict(sc):
                sc.tracking.run_name = f"#{idx} {name}"
                sc.hydra.job.id = str(idx)
                sc.hydra.job.num = idx
                sc.hydra.sweep.dir = str(sweep_dir)  # workers may run with another cwd
                sc.tracking.uri = tracking_uri(cfg.tracking.uri)
                sc.tracking.parent_run_id = parent_run_id
                sc.engine.name = engine

        if dry_run or any(cfg.predict for _, _, cfg, _, _ in checked):
            # plans or virtual-time predictions: nothing is launched, so no Ray and no GPUs
            return [_execute_job(self.hydra_context, sc, self.task_function, Singleton.get_state(), False)
                    for _, sc, _, _, _ in checked]

        hashes = {idx: config_hash(resolved_config_dict(cfg, engine), get_engine(engine).version(cfg))
                  for idx, _, cfg, engine, _ in checked}
        reused = self._reuse(checked, hashes, parent_run_id, sweep_dir)
        todo = [c for c in checked if c[0] not in reused]
        predictions = predict_trials([cfg for _, _, cfg, _, _ in todo], sweep_dir / ".predictions")
        pred_by_idx = {c[0]: p for c, p in zip(todo, predictions, strict=True) if p is not None}
        # estimates order the queue only if every trial has one (mixing would compare unlike numbers)
        est_by_idx = ({i: p.duration_s for i, p in pred_by_idx.items()}
                      if len(pred_by_idx) == len(todo) else {})
        jobs = []
        from orchestrator.launcher.ray_runner import TrialJob
        from orchestrator.progress import TrialSlot

        for idx, sc, cfg, _, label in checked:
            if idx in reused:
                continue
            job = TrialJob(QueuedTrial(idx, world_size(cfg), label, est_by_idx.get(idx)), sc,
                           cpus=cfg.ray.cpus_per_trial,
                           accelerator_type=cfg.ray.accelerator_type)
            job.slot = TrialSlot(sweep_dir / str(idx), f"#{idx} {label}")
            jobs.append(job)
        results = {idx: ret for idx, ret in reused.items()}
        if jobs:
            finished = self._run_on_ray(jobs, checked, sweep_dir)
            self._log_predictions(finished, pred_by_idx, checked[0][1].tracking.uri,
                                  checked[0][2].tracking.experiment)
            for job in finished:
                if job.result is not None:
                    results[job.queued.index] = job.result
                else:
                    results[job.queued.index] = _job_return(job.payload, JobStatus.FAILED, job.error)
        return [results[idx] for idx, _, _, _, _ in checked]

    @staticmethod
    def _log_predictions(jobs: list[Any], predictions: dict[int, Any], uri: str, experiment: str) -> None:
        """Predicted next to measured: ``pred/<point>/<metric>`` in each trial's run."""
        from orchestrator.tracking import Tracker

        tracker = None
        for job in jobs:
            value = getattr(job.result, "_return_value", None)
            prediction = predictions.get(job.queued.index)
            if not isinstance(value, dict) or not value.get("run_id") or prediction is None:
                continue
            try:
                tracker = tracker or Tracker(uri, experiment)
                tracker.log_metrics(value["run_id"], prediction.as_metrics())
            except Exception as exc:  # a convenience: the measured numbers are already stored
                log.warning("could not log predictions for trial %d: %s", job.queued.index, exc)

    def _reuse(self, checked: list[Any], hashes: dict[int, str], parent_run_id: str | None,
               sweep_dir: Path) -> dict[int, JobReturn]:
        """Trials that already succeeded with the same config hash: recorded as skipped, not run."""
        from orchestrator.launcher.resume import previous_successes, record_reuse
        from orchestrator.progress import ProgressWriter
        from orchestrator.tracking import Tracker

        if not all(cfg.resume for _, _, cfg, _, _ in checked):
            return {}
        first = checked[0][2]
        tracker = Tracker(checked[0][1].tracking.uri, first.tracking.experiment)
        previous = previous_successes(tracker, set(hashes.values()))
        reused: dict[int, JobReturn] = {}
        for idx, sc, _, _, label in checked:
            prev = previous.get(hashes[idx])
            if prev is None:
                continue
            record_reuse(tracker, parent_run_id, idx, label, prev)
            message = f"reused run {prev.info.run_id} (same config hash {hashes[idx]})"
            log.info("skipping #%d %s: %s", idx, label, message)
            print(f"[parasweep] skipping #{idx} {label}: succeeded before, {message}; "
                  "resume=false re-runs it", flush=True)
            (sweep_dir / str(idx)).mkdir(parents=True, exist_ok=True)
            ProgressWriter(sweep_dir / str(idx), label).update(status="skipped", message=message, force=True)
            reused[idx] = _job_return(sc, JobStatus.COMPLETED, {"status": "skipped",
                                                                "run_id": prev.info.run_id, "timings": {}})
        return reused

    def _run_on_ray(self, jobs: list[Any], checked: list[Any], sweep_dir: Path) -> list[Any]:
        from orchestrator.errors import UserError
        from orchestrator.launcher.ray_runner import RayTrialRunner, cluster_gpus, init_ray

        first = checked[0][2]
        num_gpus = first.ray.num_gpus
        if num_gpus is None and checked[0][3] == "sim":
            num_gpus = first.hardware.num_gpus  # the simulated node's GPUs, for placement
        num_cpus = first.ray.num_cpus
        if num_cpus is None and first.ray.address is None and num_gpus:
            # let GPUs decide how many trials fit side by side, not this machine's core count
            num_cpus = max(os.cpu_count() or 1, int(num_gpus * first.ray.cpus_per_trial))
        init_ray(first.ray.address, num_gpus, num_cpus)
        _, _, nodes = cluster_gpus()
        uri = str(checked[0][1].tracking.uri)
        if nodes > 1 and uri.startswith("sqlite"):
            raise UserError(
                f"tracking.uri={uri}: trials on other Ray nodes cannot write this machine's sqlite file; "
                "valid: an MLflow tracking server, e.g. run `mlflow server --host <an address the other "
                "nodes reach> --port 5000 --backend-store-uri sqlite:///runs/mlflow.db` and pass "
                "tracking.uri=http://<that address>:5000")

        def args_for(job: Any) -> tuple[Any, ...]:
            return (self.hydra_context, job.payload, self.task_function, Singleton.get_state(), True)

        runner = RayTrialRunner(_execute_job, args_for, sweep_dir, self.cancel_grace_s,
                                tracking=(uri, first.tracking.experiment))
        return runner.run(jobs)
