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
    def __init__(self, cfg: SimConfig, sim: Simulation, costs: LockstepCosts,
                 scheduler: type[ReplicaModel] = ReplicaModel) -> None:
        self.cfg, self.sim, self.costs = cfg, sim, costs
        self.ranks = [scheduler(cfg, sim) for _ in range(cfg.schedulers)]
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
        hosts = [cost.sched_time(len(b.reqs) + len(b.mixed)) if b is not None else cost.host_costs().poll
                 for b in batches]
        host = max(hosts)
        self._count(batches, hosts)
        start, end = self.clock.launch(now, host, step.dispatch, step.total)
        for rank, batch in zip(self.ranks, batches, strict=True):
            rank.run_forward(batch, start, end, step.graph)
        if self.clock.cpu_free > now:
            self.wake()


    def _count(self, batches: list[Batch | None], hosts: list[float]) -> None:
        """SGLang's balance statistics of one forward: each rank's tokens against the busiest's, the
        busiest over the mean (observed by rank 0), and each rank's wait at the exchange of batch sizes
        for the slowest rank's scheduler."""
        tokens = [b.shape.tokens if b is not None else 0 for b in batches]
        busiest, ranks = max(tokens), len(tokens)
        for k, (rank, n, host) in enumerate(zip(self.ranks, tokens, hosts, strict=True)):
            bal = rank.dp_balance
            bal.scheduled += n
            bal.imbalance += busiest - n
            bal.active += int(n > 0)
            bal.idle += int(n == 0)
            if rank.observer is not None:
                ratio = busiest * ranks / sum(tokens) if k == 0 else None
                rank.observer.on_dp_balance(ratio, max(hosts) - host + self.costs.sync_s)


def build_schedulers(cfg: SimConfig, sim: Simulation,
                     scheduler: type[ReplicaModel] = ReplicaModel) -> list[ReplicaModel]:
    """The engine's schedulers (``scheduler``: SGLang's, or vLLM's engine core): one per DP replica, each
    on its own; or the attention-DP ranks of its one TP group, in lockstep."""
    if cfg.lockstep is not None:
        return LockstepGroup(cfg, sim, cfg.lockstep, scheduler).ranks
    return [scheduler(cfg, sim) for _ in range(cfg.dp)]
