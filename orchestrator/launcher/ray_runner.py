"""Run a sweep's trials as Ray tasks: one task per trial asking for its world size in GPUs, started
in queue order (largest first, with backfill) as GPUs free up, never retried, cancellable.

The progress display shows queued / running / done; ``schedule.json`` in the sweep directory records
when each trial was submitted, started and ended (the scheduling benchmark reads it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.launcher.queue import QueuedTrial, place_startable, plan_order
from orchestrator.launcher.ray_cluster import node_gpus
from orchestrator.launcher.warmup import max_parallel_trials, warm_workers
from orchestrator.progress import ProgressView, TrialSlot

log = logging.getLogger("parasweep")


@dataclass
class TrialJob:
    """One trial as the launcher sees it."""

    queued: QueuedTrial
    payload: Any  # what the remote function receives (the Hydra job config)
    cpus: float = 1.0
    accelerator_type: str | None = None
    result: Any = None
    error: BaseException | None = None
    submitted: float = 0.0
    finished: float = 0.0
    slot: TrialSlot | None = field(default=None, repr=False)


def _dict_or_none(result: Any) -> dict[str, Any] | None:
    return result if isinstance(result, dict) else None


class RayTrialRunner:
    def __init__(self, remote_fn: Callable[..., Any], args_for: Callable[[TrialJob], tuple[Any, ...]],
                 sweep_dir: Path, cancel_grace_s: float = 20.0, warm: bool = True,
                 tracking: tuple[str | None, str | None] = (None, None),
                 value_of: Callable[[Any], dict[str, Any] | None] = _dict_or_none) -> None:
        self.remote_fn, self.args_for, self.warm = remote_fn, args_for, warm
        self.value_of = value_of  # a finished task's result -> the trial's {"status", "timings", ...}
        self.tracking = tracking  # (uri, experiment), so warm-up opens the same MLflow store
        self.sweep_dir, self.cancel_grace_s = sweep_dir, cancel_grace_s

    def run(self, jobs: list[TrialJob]) -> list[TrialJob]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [(node, gpus) for node, gpus in node_gpus() if gpus > 0]
        per_node = [gpus for _, gpus in nodes]
        total, largest = sum(per_node), max(per_node, default=0)
        for job in jobs:
            if job.queued.gpus > largest:
                raise UserError(f"trial '{job.queued.label}' needs {job.queued.gpus} GPUs on one node; the "
                                f"largest Ray node has {largest} (ray.num_gpus or the cluster's GPUs)")
        plan_order([j.queued for j in jobs], per_node)
        if self.warm:
            try:
                warm_workers(min(max_parallel_trials([j.queued for j in jobs], per_node), total),
                             *self.tracking)
            except Exception as exc:  # only an optimisation: the trials will report real problems
                log.warning("warming Ray workers failed: %s", str(exc).splitlines()[0])
        # max_retries=0: a crashed trial is reported, never re-run. max_calls=0: keep the worker (and its
        # imports) for the next trial; Ray's default of 1 for GPU tasks frees GPU memory a framework holds
        # inside the worker, but a trial's GPU memory belongs to its engine process, stopped at trial end.
        remote = ray.remote(max_retries=0, max_calls=0)(self.remote_fn)
        queue = {job.queued.index: job for job in jobs}
        running: dict[Any, tuple[TrialJob, int]] = {}
        free = list(per_node)  # counted node by node: a trial runs on one node
        with ProgressView([job.slot for job in jobs if job.slot]):
            try:
                while queue or running:
                    for q, node in place_startable([j.queued for j in queue.values()], free):
                        job = queue.pop(q.index)
                        options: dict[str, Any] = {"num_gpus": q.gpus, "num_cpus": job.cpus,
                                                   "name": f"trial-{q.index}"}
                        if job.accelerator_type:
                            options["accelerator_type"] = job.accelerator_type
                        if len(nodes) > 1:  # where the queue counted it, so its count stays true
                            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(nodes[node][0],
                                                                                            soft=False)
                        ref = remote.options(**options).remote(*self.args_for(job))
                        job.submitted = time.time()
                        if job.slot:
                            job.slot.state = "running"
                        running[ref] = (job, node)
                        free[node] -= q.gpus
                    if not running:
                        break
                    done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                    for ref in done:
                        job, node = running.pop(ref)
                        free[node] += job.queued.gpus
                        job.finished = time.time()
                        if job.slot:
                            job.slot.state = "done"
                        try:
                            job.result = ray.get(ref)
                        except Exception as exc:  # worker crash or cancellation: this trial failed
                            job.error = exc
            except KeyboardInterrupt:
                if queue:
                    print(f"[parasweep] cancelled {len(queue)} queued trial(s) before they started: "
                          + ", ".join(j.queued.label for j in queue.values()), flush=True)
                self._cancel(list(running))
                raise
            finally:
                self._write_schedule(jobs)
        return jobs

    def _cancel(self, refs: list[Any]) -> None:
        """Soft cancel first (the trial gets KeyboardInterrupt and its ``finally`` stops the engine's
        process group); force what is still running after the grace period."""
        import ray

        for ref in refs:
            ray.cancel(ref, force=False)
        deadline = time.monotonic() + self.cancel_grace_s
        left = refs
        while left and time.monotonic() < deadline:
            _, left = ray.wait(left, num_returns=len(left), timeout=0.5)
        for ref in left:
            ray.cancel(ref, force=True)

    def _write_schedule(self, jobs: list[TrialJob]) -> None:
        rows = []
        for job in jobs:
            timings = {}
            result = self.value_of(job.result) if job.result is not None else None
            if isinstance(result, dict):
                timings = result.get("timings", {})
            rows.append({"index": job.queued.index, "label": job.queued.label, "gpus": job.queued.gpus,
                         "est_s": job.queued.est_s, "submitted": job.submitted or None,
                         "finished": job.finished or None, "timings": timings,
                         "status": result.get("status") if isinstance(result, dict) else
                         ("failed" if job.error or job.finished else "not started")})
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        (self.sweep_dir / "schedule.json").write_text(json.dumps(rows, indent=1))
