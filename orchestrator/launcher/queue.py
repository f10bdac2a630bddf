"""Which queued trials to start now: a planned order, with backfill.

A sweep's trials need different numbers of GPUs. The launcher walks the queue in order and starts
every trial that fits the GPUs free at that moment (list scheduling with backfill). The order matters:
with duration estimates (the simulator's prediction of each trial), :func:`plan_order` simulates this
very policy for the longest-first order, the widest-first order and a few thousand random orders, and
keeps the one with the shortest predicted makespan. Without estimates, the widest trials go first.
On the scheduling benchmark this planned order came within a few per cent of the best order in
hindsight (docs/benchmarks.md).

A trial runs on one node: on a cluster the free GPUs are counted node by node, and each trial started
is placed on the fullest node that still takes it (best fit), so that whole nodes stay free for wide
trials. A count of GPUs alone would start a trial that no single node can hold.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

# free (or total) GPUs of one node, or of each node of a cluster
Gpus = int | list[int]


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


def pick_startable(queue: list[QueuedTrial], free: Gpus) -> list[QueuedTrial]:
    """Trials to start now, in order: walk the ordered queue and take each one that still fits."""
    return [trial for trial, _ in place_startable(queue, free)]


def place_startable(queue: list[QueuedTrial], free: Gpus) -> list[tuple[QueuedTrial, int]]:
    """``pick_startable`` with the node each trial goes to (an index into ``free``): the fullest node
    that still has room for it."""
    nodes = _per_node(free)
    chosen = []
    for trial in queue_order(queue):
        fits = [i for i, f in enumerate(nodes) if trial.gpus <= f]
        if fits:
            node = min(fits, key=lambda i: (nodes[i], i))
            nodes[node] -= trial.gpus
            chosen.append((trial, node))
    return chosen


def _per_node(gpus: Gpus) -> list[int]:
    return [gpus] if isinstance(gpus, int) else list(gpus)


def list_schedule(order: list[int], gpus: list[int], durations: list[float], node_gpus: Gpus) -> float:
    """Makespan of list scheduling with backfill (what the launcher does) for one order of jobs, each
    job on one node (best fit)."""
    t, free, queue, running, end = 0.0, _per_node(node_gpus), list(order), [], 0.0
    while queue or running:
        for j in list(queue):
            fits = [i for i, f in enumerate(free) if gpus[j] <= f]
            if fits:
                node = min(fits, key=lambda i: (free[i], i))
                queue.remove(j)
                free[node] -= gpus[j]
                heapq.heappush(running, (t + durations[j], j, node))
        if not running:  # a job wider than every node: nothing can start it
            return float("inf")
        t, j, node = heapq.heappop(running)
        free[node] += gpus[j]
        end = max(end, t)
    return end


def best_order(gpus: list[int], durations: list[float], node_gpus: Gpus, samples: int = 3000,
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
    return min(candidates, key=lambda o: list_schedule(o, gpus, durations, node_gpus))


def plan_order(trials: list[QueuedTrial], node_gpus: Gpus) -> None:
    """Set each trial's ``priority`` from the best simulated order (needs every trial's estimate)."""
    if len(trials) < 2 or any(t.est_s is None for t in trials):
        return
    samples = max(200, 36000 // len(trials))  # about the same planning time for any sweep size
    order = best_order([t.gpus for t in trials], [t.est_s or 0.0 for t in trials], node_gpus, samples)
    for position, j in enumerate(order):
        trials[j].priority = position
