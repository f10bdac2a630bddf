"""Which queued trials to start now: largest first, with backfill.

A sweep's trials need different numbers of GPUs. Starting the largest (GPU count x expected
duration, when an estimate exists) first and filling leftover GPUs with smaller trials keeps the
makespan close to its lower bound max(longest trial, total GPU-seconds / GPUs) (LPT list scheduling).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class QueuedTrial:
    index: int  # position in the sweep
    gpus: int
    label: str
    est_s: float | None = None  # expected run time, when the simulator can predict it

    @property
    def size(self) -> float:
        return self.gpus * (self.est_s if self.est_s is not None else 1.0)


def queue_order(trials: list[QueuedTrial]) -> list[QueuedTrial]:
    return sorted(trials, key=lambda t: (-t.size, -t.gpus, t.index))


def pick_startable(queue: list[QueuedTrial], free_gpus: int) -> list[QueuedTrial]:
    """Trials to start now, in order: walk the ordered queue and take each one that still fits."""
    chosen = []
    for trial in queue_order(queue):
        if trial.gpus <= free_gpus:
            chosen.append(trial)
            free_gpus -= trial.gpus
    return chosen
