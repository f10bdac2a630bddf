"""Which queued trials to start now: largest first, with backfill.

A sweep's trials need different numbers of GPUs. With duration estimates (the simulator's
prediction), the longest trials start first (LPT list scheduling: a long trial started late sets the
makespan), wider ones first among equals; without estimates, the widest start first. Leftover GPUs
are always back-filled with whatever fits. On the scheduling benchmark's measured durations this
order matched the best of 200,000 random list orders (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class QueuedTrial:
    index: int  # position in the sweep
    gpus: int
    label: str
    est_s: float | None = None  # expected run time, when the simulator can predict it

def queue_order(trials: list[QueuedTrial]) -> list[QueuedTrial]:
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
