"""Run a sweep's trials as Ray tasks: one task per trial asking for its GPUs (its world size, or a
node's share of it across nodes), started in queue order (largest first, with backfill) as GPUs free
up, never retried, cancellable.

On a cluster each trial is pinned to the node the queue counted it on. A trial wider than one node
first reserves its nodes as a placement group, one bundle per node (strictly spread, each bundle
pinned to a node the queue chose); its task runs in bundle 0 and starts the other nodes' engines in
the others (orchestrator/process/node_engines.py). The group is removed when the trial ends.

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
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        nodes = [(node, gpus) for node, gpus in node_gpus() if gpus > 0]
        per_node = [gpus for _, gpus in nodes]
        total = sum(per_node)
        for job in jobs:
            _check_fits(job.queued, per_node)
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
        running: dict[Any, tuple[TrialJob, list[int]]] = {}
        groups: dict[int, Any] = {}  # the placement group of each running trial across nodes
        free = list(per_node)  # counted node by node
        with ProgressView([job.slot for job in jobs if job.slot]):
            try:
                while queue or running:
                    for q, node_indexes in place_startable([j.queued for j in queue.values()], free):
                        job = queue.pop(q.index)
                        options: dict[str, Any] = {"num_gpus": q.gpus_per_node, "num_cpus": job.cpus,
                                                   "name": f"trial-{q.index}"}
                        if job.accelerator_type:
                            options["accelerator_type"] = job.accelerator_type
                        try:
                            if q.nodes > 1:
                                groups[q.index] = group = placement_group_for(
                                    [nodes[i][0] for i in node_indexes], q.gpus_per_node, job.cpus,
                                    job.accelerator_type)
                                wait_reserved(group, len(node_indexes), q.gpus_per_node)
                                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                                    group, placement_group_bundle_index=0)
                            elif len(nodes) > 1:  # where the queue counted it, so its count stays true
                                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                                    nodes[node_indexes[0]][0], soft=False)
                            ref = remote.options(**options).remote(*self.args_for(job))
                        except Exception as exc:  # not started (nodes not reserved in time, refused options)
                            if q.index in groups:
                                ray.util.remove_placement_group(groups.pop(q.index))
                            job.error, job.finished = exc, time.time()
                            if job.slot:
                                job.slot.state = "done"
                            log.warning("trial %d not started: %s", q.index, exc)
                            continue
                        job.submitted = time.time()
                        if job.slot:
                            job.slot.state = "running"
                        running[ref] = (job, node_indexes)
                        for i in node_indexes:
                            free[i] -= q.gpus_per_node
                    if not running:
                        break
                    done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                    for ref in done:
                        job, node_indexes = running.pop(ref)
                        for i in node_indexes:
                            free[i] += job.queued.gpus_per_node
                        if job.queued.index in groups:
                            ray.util.remove_placement_group(groups.pop(job.queued.index))
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
                for group in groups.values():  # whatever ended the sweep, its reservations go
                    ray.util.remove_placement_group(group)
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


class NodesNotReserved(RuntimeError):
    """The nodes a trial across nodes was counted on could not be reserved in time."""


RESERVE_TIMEOUT_S = 60.0


def placement_group_for(node_ids: list[str], gpus_per_node: int, cpus: float,
                        accelerator_type: str | None) -> Any:
    """A placement group of one bundle per node, bundle ``i`` on ``node_ids[i]`` (the queue counted
    the trial there), strictly spread; each bundle holds what the trial's task (bundle 0) or a node's
    engine asks for, the accelerator type included (Ray asks for a sliver of ``accelerator_type:X``)."""
    from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group

    bundle: dict[str, float] = {"GPU": gpus_per_node, "CPU": cpus}
    if accelerator_type:
        bundle[f"accelerator_type:{accelerator_type}"] = 0.001
    return placement_group([dict(bundle) for _ in node_ids], strategy="STRICT_SPREAD",
                           bundle_label_selector=[{NODE_ID_LABEL_KEY: node} for node in node_ids])


def wait_reserved(group: Any, nodes: int, gpus_per_node: int) -> None:
    """The nodes were free in the queue's count, so the group is normally ready at once; one not ready
    within RESERVE_TIMEOUT_S fails the trial (NodesNotReserved) instead of waiting for nodes that are
    not coming. The caller owns the group (and removes it) whatever happens here."""
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        ray.get(group.ready(), timeout=RESERVE_TIMEOUT_S)
    except GetTimeoutError:
        raise NodesNotReserved(f"could not reserve {nodes} nodes of {gpus_per_node} GPUs within "
                               f"{RESERVE_TIMEOUT_S:g} s (Ray placement group)") from None


def _check_fits(trial: QueuedTrial, per_node: list[int]) -> None:
    """A trial the cluster cannot hold even when idle is one line before anything starts."""
    if trial.nodes == 1:
        largest = max(per_node, default=0)
        if trial.gpus > largest:
            raise UserError(f"trial '{trial.label}' needs {trial.gpus} GPUs on one node; the largest Ray "
                            f"node has {largest} (ray.num_gpus or the cluster's GPUs)")
        return
    enough = sum(1 for gpus in per_node if gpus >= trial.gpus_per_node)
    if enough < trial.nodes:
        raise UserError(f"trial '{trial.label}' spans {trial.nodes} nodes of {trial.gpus_per_node} GPUs; the "
                        f"Ray cluster has {enough} node(s) with that many ({len(per_node)} GPU node(s): "
                        f"{', '.join(str(g) for g in per_node) or 'none'} GPUs)")
