"""Which queued trials to start now: a planned order, with backfill.

A sweep's trials need different numbers of GPUs. The launcher walks the queue in order and starts
every trial that fits the GPUs free at that moment (list scheduling with backfill). The order matters:
with duration estimates (the simulator's prediction of each trial), :func:`plan_order` simulates this
very policy for the longest-first order, the widest-first order and a few thousand random orders, and
keeps the one with the shortest predicted makespan. Without estimates, the widest trials go first.
On the scheduling benchmark this planned order came within a few per cent of the best order in
hindsight (docs/benchmarks.md).

On a cluster the free GPUs are counted node by node. A trial runs on one node, or, wider than a node,
on several with the same share of its GPUs on each (whole nodes, in practice). Each trial started is
placed on the fullest nodes that still take it (best fit), so that whole nodes stay free for wide
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
    nodes: int = 1  # the nodes it spans, gpus / nodes on each

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


def queue_order(trials: list[QueuedTrial]) -> list[QueuedTrial]:
    if trials and all(t.priority is not None for t in trials):
        return sorted(trials, key=lambda t: (t.priority, t.index))
    if trials and all(t.est_s is not None for t in trials):
        return sorted(trials, key=lambda t: (-(t.est_s or 0.0), -t.gpus, t.index))
    return sorted(trials, key=lambda t: (-t.gpus, t.index))


def pick_startable(queue: list[QueuedTrial], free: Gpus) -> list[QueuedTrial]:
    """Trials to start now, in order: walk the ordered queue and take each one that still fits."""
    return [trial for trial, _ in place_startable(queue, free)]


def place_startable(queue: list[QueuedTrial], free: Gpus) -> list[tuple[QueuedTrial, list[int]]]:
    """``pick_startable`` with the nodes each trial goes to (indexes into ``free``)."""
    left = per_node(free)
    chosen = []
    for trial in queue_order(queue):
        nodes = best_fit(trial.gpus_per_node, trial.nodes, left)
        if nodes is not None:
            for i in nodes:
                left[i] -= trial.gpus_per_node
            chosen.append((trial, nodes))
    return chosen


def best_fit(gpus_per_node: int, nodes: int, free: list[int]) -> list[int] | None:
    """The ``nodes`` fullest nodes that each still have ``gpus_per_node`` free, or None."""
    fits = sorted((i for i, f in enumerate(free) if gpus_per_node <= f), key=lambda i: (free[i], i))
    return fits[:nodes] if len(fits) >= nodes else None


def per_node(gpus: Gpus) -> list[int]:
    return [gpus] if isinstance(gpus, int) else list(gpus)


def list_schedule(order: list[int], gpus: list[int], durations: list[float], node_gpus: Gpus,
                  spans: list[int] | None = None) -> float:
    """Makespan of list scheduling with backfill (what the launcher does) for one order of jobs, job
    ``j`` on ``spans[j]`` nodes (one without ``spans``), best fit."""
    t, free, queue, end = 0.0, per_node(node_gpus), list(order), 0.0
    running: list[tuple[float, int, list[int]]] = []
    span = spans or [1] * len(gpus)
    while queue or running:
        for j in list(queue):
            nodes = best_fit(gpus[j] // span[j], span[j], free)
            if nodes is not None:
                queue.remove(j)
                for i in nodes:
                    free[i] -= gpus[j] // span[j]
                heapq.heappush(running, (t + durations[j], j, nodes))
        if not running:  # a job wider than the cluster can hold: nothing can start it
            return float("inf")
        t, j, nodes = heapq.heappop(running)
        for i in nodes:
            free[i] += gpus[j] // span[j]
        end = max(end, t)
    return end


def best_order(gpus: list[int], durations: list[float], node_gpus: Gpus, samples: int = 3000,
               seed: int = 0, spans: list[int] | None = None) -> list[int]:
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
    return min(candidates, key=lambda o: list_schedule(o, gpus, durations, node_gpus, spans))


def plan_order(trials: list[QueuedTrial], node_gpus: Gpus) -> None:
    """Set each trial's ``priority`` from the best simulated order (needs every trial's estimate)."""
    if len(trials) < 2 or any(t.est_s is None for t in trials):
        return
    samples = max(200, 36000 // len(trials))  # about the same planning time for any sweep size
    order = best_order([t.gpus for t in trials], [t.est_s or 0.0 for t in trials], node_gpus, samples,
                       spans=[t.nodes for t in trials])
    for position, j in enumerate(order):
        trials[j].priority = position
