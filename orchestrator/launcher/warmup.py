"""Import what a trial needs in the Ray workers before the first trial is placed.

A fresh Ray worker spends seconds importing MLflow, pandas, pyarrow and matplotlib the first time it
runs a trial; Ray then reuses the worker, so only the first trial on each worker pays. Warming as many
workers as trials can run at once moves that cost out of every trial's critical path (where it would
hold the trial's GPUs idle) into the sweep's start-up, where it is paid in parallel.
"""

from __future__ import annotations

import os
import time

from orchestrator.launcher.queue import Gpus, QueuedTrial, per_node, place_startable

HOLD_S = 1.0  # how long warm-up tasks wait for each other (imports usually take longer anyway)


def max_parallel_trials(trials: list[QueuedTrial], node_gpus: Gpus) -> int:
    """How many trials can run at once at most: replay the queue with equal durations."""
    queue: list[QueuedTrial] = list(trials)
    running: list[tuple[QueuedTrial, list[int]]] = []
    peak = 0
    free = per_node(node_gpus)
    while queue or running:
        for t, nodes in place_startable(queue, free):
            queue.remove(t)
            running.append((t, nodes))
            for i in nodes:
                free[i] -= t.gpus_per_node
        peak = max(peak, len(running))
        if not running:
            break
        done, nodes = running.pop(0)
        for i in nodes:
            free[i] += done.gpus_per_node
    return peak


def _preload(hold_until: float, tracking_uri: str | None, experiment: str | None) -> int:
    # the imports a trial makes on its critical path (each module caches itself for later trials); not
    # matplotlib: plots are drawn by the driver at the end of the sweep, never in a trial's worker
    import mlflow.tracking  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import orchestrator.trial.hydra_job  # noqa: F401
    import workloads  # noqa: F401
    from orchestrator.store.tracking import Tracker

    if tracking_uri and experiment:  # MLflow builds (and caches) its store on first use
        Tracker(tracking_uri, experiment)

    # stay busy until every warm-up task has started, so each one gets a worker of its own
    time.sleep(max(0.0, hold_until - time.time()))
    return os.getpid()


def warm_workers(count: int, tracking_uri: str | None = None, experiment: str | None = None) -> int:
    """Run ``count`` preload tasks at once; returns how many distinct worker processes were warmed.

    Each asks for one GPU (the GPUs are idle before the first trial): Ray keeps the workers of GPU
    tasks apart from CPU-only ones, so only a GPU task warms a worker a trial will be given."""
    import ray

    if count <= 0:
        return 0
    task = ray.remote(num_cpus=0, num_gpus=1, max_retries=0, max_calls=0)(_preload)
    hold_until = time.time() + HOLD_S
    refs = [task.remote(hold_until, tracking_uri, experiment) for _ in range(count)]
    return len(set(ray.get(refs)))
