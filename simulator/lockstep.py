"""The attention-DP ranks of one engine, advanced in lockstep (``simulator/attention_dp/`` prices them).

Each rank is a :class:`simulator.replica.ReplicaModel` with its own waiting queue, KV pool and prefix
cache; the group takes their turns. A turn waits until no rank's forward is on the GPU, asks every rank
for its next batch, and runs one forward for all of them (``attention_dp/costs.py``): a rank without a
batch runs an idle one, its GPUs busy all the same. Each rank's scheduler iteration runs on its own
process, so the turn's host time is the slowest rank's; under the overlap scheduler it runs beside the
previous forward as a single engine's does (``replica.py``).
"""

from __future__ import annotations

from simulator.attention_dp.costs import LockstepCosts
from simulator.entities import Batch, SchedulerClock
from simulator.replica import ReplicaModel
from simulator.sim_config import SimConfig
from simulator.timebase import Simulation


class LockstepGroup:
    def __init__(self, cfg: SimConfig, sim: Simulation, costs: LockstepCosts) -> None:
        self.cfg, self.sim, self.costs = cfg, sim, costs
        self.ranks = [ReplicaModel(cfg, sim) for _ in range(cfg.schedulers)]
        for rank in self.ranks:
            rank.lockstep = self
        self.clock = SchedulerClock(hide=not cfg.disable_overlap_schedule)
        self.pending = False

    def wake(self) -> None:
        if not self.pending:
            self.pending = True
            self.sim.schedule(max(self.sim.now, self.clock.cpu_free), self._turn)

    def _turn(self) -> None:
        self.pending = False
        now = self.sim.now
        if now < self.clock.cpu_free:
            self.wake()
            return
        if any(rank.running_forward for rank in self.ranks):
            return  # the forward's end wakes the group
        batches: list[Batch | None] = [rank.next_batch() for rank in self.ranks]
        if all(b is None for b in batches):
            for rank in self.ranks:
                rank.on_idle()
            return
        step = self.costs.step([b.shape if b is not None else None for b in batches])
        cost = self.cfg.cost
        host = max(cost.sched_time(len(b.reqs) + len(b.mixed)) for b in batches if b is not None)
        start, end = self.clock.launch(now, host, step.dispatch, step.total)
        for rank, batch in zip(self.ranks, batches, strict=True):
            rank.run_forward(batch, start, end, step.graph)
        if self.clock.cpu_free > now:
            self.wake()


def build_schedulers(cfg: SimConfig, sim: Simulation) -> list[ReplicaModel]:
    """The engine's schedulers: one per DP replica, each on its own; or the attention-DP ranks of its
    one TP group, in lockstep."""
    if cfg.lockstep is not None:
        return LockstepGroup(cfg, sim, cfg.lockstep).ranks
    return [ReplicaModel(cfg, sim) for _ in range(cfg.dp)]
