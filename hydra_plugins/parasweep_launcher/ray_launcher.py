"""``hydra/launcher=parasweep_ray``: one Ray task per Hydra job, asking for the trial's world size in
GPUs (Hydra's stock Ray launcher gives every job the same resources and aborts the sweep when a
worker dies). Every job is composed and validated before the first one starts.

No `from __future__ import annotations` here: Hydra execs plugin modules without registering them
in sys.modules, and dataclasses then cannot resolve string annotations.
"""


import logging
import os
import time
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


class ParasweepRayLauncher(Launcher):
    def __init__(self, cancel_grace_s: float = 20.0) -> None:
        self.cancel_grace_s = cancel_grace_s
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from orchestrator.config.validate import typed_config, validate, world_size
        from orchestrator.errors import ConfigError
        from orchestrator.sweep import ensure_started
        from orchestrator.tracking import tracking_uri

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()  # resolve ${now:} once, here

        jobs: list[tuple[DictConfig, int, str]] = []
        checked = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            sc = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            label = " ".join(overrides) or "defaults"
            try:
                cfg = typed_config(sc)
                engine = validate(cfg)
            except ConfigError as exc:  # nothing has launched yet: fail the whole sweep now
                raise ConfigError(exc.key, exc.value, exc.valid, exc.why) from None
            checked.append((idx, sc, cfg, engine, label))
        parent_run_id = None if any(cfg.dry_run for _, _, cfg, _, _ in checked) else ensure_started()
        for idx, sc, cfg, engine, label in checked:
            with open_dict(sc):
                sc.hydra.job.id = str(idx)
                sc.hydra.job.num = idx
                sc.hydra.sweep.dir = str(sweep_dir)  # workers may run with another cwd
                sc.tracking.uri = tracking_uri(cfg.tracking.uri)
                sc.tracking.parent_run_id = parent_run_id
                sc.engine.name = engine
            jobs.append((sc, world_size(cfg), label))

        if any(bool(sc.dry_run) for sc, _, _ in jobs):  # plans only: no Ray, nothing launched
            return [_execute_job(self.hydra_context, sc, self.task_function, Singleton.get_state(), False)
                    for sc, _, _ in jobs]
        return self._launch_on_ray(jobs, sweep_dir)

    def _init_ray(self, first: DictConfig) -> None:
        import ray

        if ray.is_initialized():
            return
        rc = first.ray
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "configure_logging": False}
        if rc.address:
            kwargs["address"] = rc.address
        else:
            num_gpus = rc.num_gpus
            if num_gpus is None and first.engine.name == "sim":
                num_gpus = int(first.hardware.num_gpus)  # the simulated node's GPUs, for placement
            if num_gpus is not None:
                kwargs["num_gpus"] = int(num_gpus)
            if rc.num_cpus is not None:
                kwargs["num_cpus"] = int(rc.num_cpus)
        ray.init(**kwargs)

    def _launch_on_ray(self, jobs: list[tuple[DictConfig, int, str]], sweep_dir: Path) -> list[JobReturn]:
        import ray

        from orchestrator.progress import ProgressView, TrialSlot

        self._init_ray(jobs[0][0])
        total_gpus = int(ray.cluster_resources().get("GPU", 0))
        remote = ray.remote(max_retries=0)(_execute_job)  # a crashed trial is reported, never re-run
        slots = [TrialSlot(sweep_dir / str(sc.hydra.job.num), f"#{sc.hydra.job.num} {label}")
                 for sc, _, label in jobs]
        refs: list[Any] = []
        for (sc, gpus, label), _slot in zip(jobs, slots, strict=True):
            if gpus > total_gpus:
                raise RuntimeError(f"trial '{label}' needs {gpus} GPUs; the Ray cluster has {total_gpus}")
            refs.append(remote.options(num_gpus=gpus, num_cpus=float(sc.ray.cpus_per_trial),
                                       name=f"trial-{sc.hydra.job.num}")
                        .remote(self.hydra_context, sc, self.task_function, Singleton.get_state(), True))
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[JobReturn | None] = [None] * len(refs)
        pending = list(refs)
        with ProgressView(slots):
            try:
                while pending:
                    done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                    for slot in slots:  # a trial that wrote progress has been placed
                        if slot.state == "queued" and (slot.trial_dir / "progress.json").exists():
                            slot.state = "running"
                    for ref in done:
                        i = index[ref]
                        slots[i].state = "done"
                        results[i] = self._result(ref, jobs[i][0])
            except KeyboardInterrupt:
                self._cancel(pending)
                raise
        return [r for r in results if r is not None]

    @staticmethod
    def _result(ref: Any, sc: DictConfig) -> JobReturn:
        import ray

        try:
            return ray.get(ref)
        except Exception as exc:  # worker crash or cancellation: a failed job, not a crashed sweep
            ret = JobReturn(overrides=list(sc.hydra.overrides.task), cfg=sc, hydra_cfg=sc)
            ret.status = JobStatus.FAILED
            ret.return_value = exc
            return ret

    def _cancel(self, pending: list[Any]) -> None:
        """Soft cancel (KeyboardInterrupt in the trial, whose finally stops its engine group), then
        force whatever is still running after the grace period."""
        import ray

        for ref in pending:
            ray.cancel(ref, force=False)
        deadline = time.monotonic() + self.cancel_grace_s
        left = list(pending)
        while left and time.monotonic() < deadline:
            _, left = ray.wait(left, num_returns=len(left), timeout=0.5)
        for ref in left:
            ray.cancel(ref, force=True)
