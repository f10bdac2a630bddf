"""Which queued trials to start now: a planned order, with backfill.

A sweep's trials need different numbers of GPUs. The launcher walks the queue in order and starts
every trial that fits the GPUs free at that moment (list scheduling with backfill). The order matters:
with duration estimates (the simulator's prediction of each trial), :func:`plan_order` simulates this
very policy for the longest-first order, the widest-first order and a few thousand random orders, and
keeps the one with the shortest predicted makespan. Without estimates, the widest trials go first.
On the scheduling benchmark this planned order came within a few per cent of the best order in
hindsight (docs/benchmarks.md).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass


@dataclass
class QueuedTrial:
    index: int  # position in the sweep
    gpus: int
    label: str
    est_s: float | None = None  # expected run time, when the simulator can predict it
    priority: int | None = None  # position in the planned order (lower starts first)


def queue_order(trials: list[QueuedTrial]) -> list[QueuedTrial]:
    if trials and all(t.priority is not None for t in trials):
        return sorted(trials, key=lambda t: (t.priority, t.index))
    if trials and all(t.est_s is not None for t in trials):
        return sorted(trials, key=lambda t: (-(t.est_s or 0.0), -t.gpus, t.index))
    return sorted(trials, key=lambda t: (-t.gpus, t.index))


def pick_startable(queue: list[QueuedTrial], free_gpus: int) -> list[QueuedTrial]:
    """Trials to start now, in order: walk the ordered queue and take each one that still fits."""
    chosen = []
    for trial in queue_order(queue):
        if trial.gpus <= free_gpus:
            chosen.append(trial)
            free_gpus -= trial.gpus
    return chosen


def list_schedule(order: list[int], gpus: list[int], durations: list[float], total_gpus: int) -> float:
    """Makespan of list scheduling with backfill (what the launcher does) for one order of jobs."""
    t, free, queue, running, end = 0.0, total_gpus, list(order), [], 0.0
    while queue or running:
        for j in list(queue):
            if gpus[j] <= free:
                queue.remove(j)
                free -= gpus[j]
                heapq.heappush(running, (t + durations[j], j))
        if not running:  # a job wider than the node: nothing can start it
            return float("inf")
        t, j = heapq.heappop(running)
        free += gpus[j]
        end = max(end, t)
    return end


def best_order(gpus: list[int], durations: list[float], total_gpus: int, samples: int = 3000,
               seed: int = 0) -> list[int]:
    """The order with the shortest simulated makespan among heuristics and ``samples`` random ones."""
    n = len(gpus)
    candidates = [sorted(range(n), key=lambda j: (-durations[j], -gpus[j], j)),
                  sorted(range(n), key=lambda j: (-gpus[j], -durations[j], j)),
                  sorted(range(n), key=lambda j: (-gpus[j] * durations[j], j))]
    rng = random.Random(seed)
    for _ in range(samples):
        order = list(range(n))
        rng.shuffle(order)
        candidates.append(order)
    return min(candidates, key=lambda o: list_schedule(o, gpus, durations, total_gpus))


def plan_order(trials: list[QueuedTrial], total_gpus: int) -> None:
    """Set each trial's ``priority`` from the best simulated order (needs every trial's estimate)."""
    if len(trials) < 2 or any(t.est_s is None for t in trials):
        return
    samples = max(200, 36000 // len(trials))  # about the same planning time for any sweep size
    order = best_order([t.gpus for t in trials], [t.est_s or 0.0 for t in trials], total_gpus, samples)
    for position, j in enumerate(order):
        trials[j].priority = position
