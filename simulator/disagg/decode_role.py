"""The simulated engine as a decode server (``--disaggregation-mode decode``).

A request from the router waits in the pre-allocation queue until the server's KV can hold its whole
prompt with room to spare: SGLang admits it when the free KV, less ``--num-reserved-decode-tokens`` for
every request it already holds (running, waiting for its KV, or waiting for a running slot), fits the
prompt and one more reserve, and a request-pool row is free (``--max-running-requests``). It then tells
the prefill server, waits for the KV, and joins the running batch at the server's next turn with the
first token the prefill server sampled; from there it decodes as on any server. Decode servers keep no
prefix cache (SGLang turns it off on them) and do not retract: with a reserve of 512 tokens per request a
pool runs out only for outputs longer than that.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from simulator.disagg.kv_transfer import Link
from simulator.entities import PDQueues, PDTimes, Request
from simulator.replica import ReplicaModel
from simulator.sim_config import SimConfig
from simulator.timebase import Simulation
from vocab.model import DEFAULT_RESERVED_DECODE_TOKENS


class DecodeRole:
    """A decode server: its replica model, its pre-allocation queue, the requests whose KV is on the way."""

    def __init__(self, cfg: SimConfig, sim: Simulation, link: Link | None = None,
                 reserved_tokens: int = DEFAULT_RESERVED_DECODE_TOKENS,
                 replica: ReplicaModel | None = None) -> None:
        self.sim = sim
        self.replica = replica if replica is not None else ReplicaModel(cfg, sim)
        self.link = link if link is not None else Link(sim)
        self.reserve = reserved_tokens
        self.queue: deque[tuple[Request, Callable[[Request], None]]] = deque()  # pre-allocation queue
        self.transferring = 0  # pre-allocated, KV not arrived yet
        self._retry_pending = False
        self.preallocated_tokens = 0  # prompt tokens reserved for requests whose KV has not arrived
        self.replica.admission.on_release = self._retry
        self.replica.pd_queues = self.queues

    def queues(self) -> PDQueues:
        """What the decode batch line and the gauges report of this server's own queues."""
        return PDQueues(prealloc=len(self.queue), transfer=self.transferring,
                        preallocated_tokens=self.preallocated_tokens,
                        pending_tokens=sum(r.input_len for r, _ in self.queue))

    def submit(self, req: Request, preallocated: Callable[[Request], None]) -> None:
        """A request from the router; ``preallocated(req)`` once its KV is reserved here."""
        req.arrival = self.sim.now
        if req.pd is None:
            req.pd = PDTimes(arrival=self.sim.now)
        self.queue.append((req, preallocated))
        self._preallocate()

    def allocatable(self) -> int:
        """Free KV tokens less the reserve of every request this server holds (SGLang's budget)."""
        adm = self.replica.admission
        return adm.kv_capacity - adm.kv_used - self.reserve * adm.pool_used

    def _retry(self) -> None:
        if not self._retry_pending and self.queue:
            self._retry_pending = True
            self.sim.schedule(self.sim.now, self._preallocate)

    def _preallocate(self) -> None:
        self._retry_pending = False
        adm = self.replica.admission
        while self.queue:
            req, preallocated = self.queue[0]
            if req.finished:  # aborted while it waited
                self.queue.popleft()
                continue
            if adm.pool_used >= adm.pool_size or self.allocatable() < req.input_len + self.reserve:
                return
            self.queue.popleft()
            adm.preallocate(req)
            self.transferring += 1
            self.preallocated_tokens += req.input_len
            assert req.pd is not None
            req.pd.preallocated = self.sim.now
            if self.replica.observer is not None:  # SGLang: pre-allocation queue to transfer queue
                self.replica.observer.on_pd_stage("decode_bootstrap", self.sim.now - req.pd.arrival)
            preallocated(req)

    def fail(self, req: Request, message: str) -> None:
        """``req``'s KV never came (its prefill server failed): it ends with an error, its KV freed."""
        self.transferring -= 1
        self.preallocated_tokens -= req.input_len
        req.aborted = req.finished = True
        req.finish_reason = {"type": "abort", "message": message, "status_code": 500}
        self.replica.admission.release(req)

    def fake_arrived(self, req: Request) -> None:
        """The fake transfer backend: ``req``'s KV is there at once (garbage, as SGLang's fake backend
        leaves it), its first token made here."""
        now = self.sim.now
        self.kv_arrived(req, self.replica.first_token(req), PDTimes(prefill_start=now, prefill_end=now,
                                                                   transferred=now))

    def kv_arrived(self, req: Request, first_token: int, times: PDTimes) -> None:
        """The prefill server's last byte of ``req``'s KV is here, with the first token."""
        self.transferring -= 1
        self.preallocated_tokens -= req.input_len
        assert req.pd is not None
        for name in ("prefill_start", "prefill_end", "transferred"):
            setattr(req.pd, name, getattr(times, name))
        req.pd.transfer_bytes = times.transfer_bytes
        req.forward_entry = times.prefill_start  # its queueing ends when the prefill server takes it
        req.output_ids.append(first_token)
        self.replica.receive_kv(req)
