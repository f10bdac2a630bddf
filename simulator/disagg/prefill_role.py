"""The simulated engine as a prefill server (``--disaggregation-mode prefill``).

A request waits in the bootstrap queue until its decode server has pre-allocated its KV (SGLang's
``early`` policy: nothing is computed before), then queues and prefills as on any server, in chunks. After
each chunk's forward its KV leaves on the server's link (``kv_transfer.send``); the last chunk also carries
the first token, sampled here. The request leaves the batch then, but holds its pool row and KV until the
last byte has arrived (SGLang's inflight queue); then it is freed, its HTTP response (one token) returns,
and the decode server is told.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from simulator.disagg.kv_transfer import Link, Path, send
from simulator.entities import PDQueues, PDTimes, Request
from simulator.replica import ReplicaModel
from simulator.sim_config import SimConfig
from simulator.timebase import Simulation


@dataclass
class Transfer:
    """Where one request's KV goes, known once its decode server has pre-allocated it."""

    receiver: Link  # the decode server's link
    path: Path
    per_token: float  # bytes per prompt token per GPU
    # called when the last byte has arrived: the first token and the request's times so far
    arrived: Callable[[int, PDTimes], None]
    times: PDTimes = field(default_factory=PDTimes)
    # a request with SGLang's fake bootstrap host (its warm-up, a health probe): SGLang counts no KV
    # transfer of it in its transfer histograms
    fake: bool = False
    admitted: float = -1.0  # when it left the bootstrap queue for the waiting queue


class PrefillRole:
    """A prefill server: its replica model, its bootstrap queue and the transfers of its requests' KV."""

    def __init__(self, cfg: SimConfig, sim: Simulation, link: Link | None = None,
                 replica: ReplicaModel | None = None) -> None:
        self.sim = sim
        self.replica = replica if replica is not None else ReplicaModel(cfg, sim)
        self.replica.handoff = self
        self.link = link if link is not None else Link(sim)
        self.bootstrapping: dict[int, Request] = {}  # room -> request whose decode side is not ready
        self.ready: dict[int, Transfer] = {}  # room -> transfer whose prefill request has not arrived
        self.transfers: dict[str, Transfer] = {}  # rid -> its transfer, from the bootstrap on
        self.inflight = 0  # prefilled requests whose KV is still on the way
        self.replica.pd_queues = lambda: PDQueues(bootstrap=len(self.bootstrapping), inflight=self.inflight)

    def submit(self, req: Request, room: int) -> None:
        """A request from the router (it computes one token: the first)."""
        req.max_new_tokens = 1
        req.arrival = self.sim.now
        transfer = self.ready.pop(room, None)
        if transfer is None:
            self.bootstrapping[room] = req
        else:
            self._admit(req, transfer)

    def bootstrapped(self, room: int, transfer: Transfer) -> None:
        """The decode server has pre-allocated the request's KV."""
        req = self.bootstrapping.pop(room, None)
        if req is None:
            self.ready[room] = transfer
        else:
            self._admit(req, transfer)

    def _admit(self, req: Request, transfer: Transfer) -> None:
        transfer.times.arrival = req.arrival
        transfer.admitted = self.sim.now
        self.transfers[req.rid] = transfer
        self._stage("prefill_bootstrap", self.sim.now - req.arrival)  # SGLang: bootstrap to waiting queue
        self.replica.submit(req, self.sim.now)

    def _stage(self, stage: str, seconds: float) -> None:
        if self.replica.observer is not None:
            self.replica.observer.on_pd_stage(stage, seconds)

    def chunk_done(self, req: Request, tokens: int, last: bool) -> None:
        """A chunk's forward has run: its KV leaves; the last one also carries the first token."""
        t = self.transfers[req.rid]
        done = None
        if t.times.prefill_start < 0:  # its first forward: the wait in the waiting queue ends there
            t.times.prefill_start = req.forward_entry
            self._stage("queue_time", req.forward_entry - t.admitted)
        if last:
            t.times.prefill_end = self.sim.now
            self._stage("prefill_forward", self.sim.now - t.times.prefill_start)
            self.inflight += 1
            done = lambda end: self._arrived(req, t, end)  # noqa: E731
        t.times.transfer_bytes += tokens * t.per_token
        send(self.sim, self.link, t.receiver, tokens * t.per_token, t.path, done)

    def _arrived(self, req: Request, t: Transfer, end: float) -> None:
        del self.transfers[req.rid]
        self.inflight -= 1
        t.times.transferred = end
        if self.replica.observer is not None and not t.fake:
            self.replica.observer.on_kv_transferred(end - t.times.prefill_end, t.times.transfer_bytes)
        self._stage("prefill_transfer_kv_cache", end - t.times.prefill_end)  # from the last chunk's end
        self.replica.release_handed_off(req)
        t.arrived(req.output_ids[0], t.times)
