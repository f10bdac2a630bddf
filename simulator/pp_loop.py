"""SGLang's pipeline-parallel event loop, run by every PP rank: each stage's host thread and CUDA streams.

Every PP rank of an SGLang engine is its own scheduler process running the same loop over the
L = pp_size + pp_async_batch_depth micro-batch slots (``event_loop_pp``; docs/simulator.md, "What each
stage's host does", cites the release's lines). One pass for slot j on stage k, in the release's order:

1. requests: stage 0 polls the tokenizer; stage k > 0 blocks on stage k-1's pickled request list (gloo,
   the CPU group); every stage but the last relays it with an asynchronous send;
2. ``get_next_batch_to_run``: the same decision on every stage (stage 0's, here);
3. with a batch, stage k > 0 blocks on the hidden states' metadata (gloo) and queues their NCCL receive
   on its schedule stream;
4. the output exchange (before the forward when depth > 0, after it at depth 0; even ranks send first):
   the last stage sends the sampled ids of the micro-batch launched ``depth`` passes ago (its NCCL send
   waits on that forward), other stages pass on what they received the pass before; every stage blocks
   on the metadata of the next slot's outputs and queues their receive;
5. the forward: the forward stream waits for everything queued on the schedule stream;
6. the next slot's result: the host waits for its outputs to land (``d2h_event.synchronize()``), then
   ``process_batch_result`` (``.tolist()`` syncs the schedule stream); stage 0 alone streams tokens out;
7. stage k < last sends this slot's hidden states: gloo metadata now, the NCCL send queued on the
   schedule stream behind this forward.

The model keeps three clocks per stage: the host thread, the schedule stream (when everything queued on
it so far has completed) and the forward stream. Blocking receives are waits for messages, keyed by
(kind, sender, the sender's pass). Stage 0 alone meets the outside world (arrivals, the client's
tokens), so its scheduling decisions and result processing run as events of the shared ``Simulation``;
the other stages are computed as soon as their inputs exist, possibly ahead of simulated time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Protocol

from simulator.costs import CostModel, HostCosts
from simulator.entities import Batch, StageBusy
from simulator.timebase import Simulation

# what a stage's loop waits for: ("at", t) stage 0 resumes at simulated time t; ("msg", key) a message;
# ("idle",) stage 0 sleeps until a request arrives
Wait = tuple
StageLoop = Generator[Wait, float, None]


class Stage0(Protocol):
    """What stage 0's loop asks of the replica: its scheduling decision and its result processing."""

    def decide(self, slot: int) -> Batch | None: ...
    def complete(self, slot: int, batch: Batch) -> None: ...
    def idle(self) -> bool: ...
    def on_idle(self) -> None: ...


class PipelineLoop:
    """All PP ranks of one replica. ``wake`` resumes stage 0 when a request arrives."""

    def __init__(self, cost: CostModel, pp: int, depth: int, sim: Simulation, owner: Stage0,
                 busy: list[StageBusy]) -> None:
        self.cost, self.pp, self.depth, self.sim, self.owner, self.busy = cost, pp, depth, sim, owner, busy
        self.slots = pp + depth
        self.h: HostCosts = cost.host_costs()
        self.batches: dict[int, Batch | None] = {}  # pass -> the micro-batch launched (None: empty slot)
        self.passes = [0] * pp  # the pass each stage is in
        self.unprocessed = 0  # micro-batches launched and not yet processed by stage 0
        # messages: (kind, sender, sender's pass) -> (when sent, when its NCCL part lands on the GPU);
        # acks: the same key -> when the receiver posted its receive
        self._msgs: dict[tuple, tuple[float, float]] = {}
        self._acks: dict[tuple, float] = {}
        self._parked_msg: dict[tuple, StageLoop] = {}
        self._parked_ack: dict[tuple, StageLoop] = {}
        self._ready: deque[tuple[StageLoop, float | None]] = deque()
        self._sleeping = False
        self._tick_pending = False
        self._outputs_sent: list[tuple[tuple, float] | None] = [None] * pp  # per stage, as below
        self._loops = [self._rank(k) for k in range(pp)]
        self._ready.extend((loop, None) for loop in self._loops)  # None: a generator's first resumption
        self._drain()

    # -- the driver -----------------------------------------------------------------------------------

    def wake(self) -> None:
        """A request arrived: stage 0 leaves its idle wait."""
        if self._sleeping and not self._tick_pending:
            # as an event of its own, so that requests arriving at this same instant are all there
            self._sleeping = False
            self._tick_pending = True
            self.sim.schedule(self.sim.now, self._resume_at, self._loops[0])

    def _post(self, key: tuple, host: float, data: float = 0.0) -> None:
        self._msgs[key] = (host, data)
        if self._parked_msg:
            loop = self._parked_msg.pop(key, None)
            if loop is not None:
                self._ready.append((loop, 0.0))

    def _posted_receive(self, key: tuple, host: float) -> None:
        """The receiver of message ``key`` has posted its receive at ``host``: the sender's wait for it
        can complete."""
        self._acks[key] = host
        if self._parked_ack:
            loop = self._parked_ack.pop(key, None)
            if loop is not None:
                self._ready.append((loop, 0.0))

    def _resume_at(self, loop: StageLoop) -> None:
        self._tick_pending = False
        self._ready.append((loop, self.sim.now))
        self._drain()

    def _drain(self) -> None:
        ready = self._ready
        while ready:
            loop, value = ready.popleft()
            wait = loop.send(value)  # type: ignore[arg-type]
            kind = wait[0]
            if kind == "msg":
                if wait[1] in self._msgs:
                    ready.append((loop, 0.0))
                else:
                    self._parked_msg[wait[1]] = loop
            elif kind == "ack":
                if wait[1] in self._acks:
                    ready.append((loop, 0.0))
                else:
                    self._parked_ack[wait[1]] = loop
            elif kind == "at":
                self._tick_pending = True
                self.sim.schedule(wait[1], self._resume_at, loop)
            else:
                self._sleeping = True

    # -- one PP rank's loop ---------------------------------------------------------------------------

    def _rank(self, k: int) -> StageLoop:
        """Stage ``k``'s scheduler process, pass after pass (the release's ``event_loop_pp``)."""
        cost, h, pp, depth, slots = self.cost, self.h, self.pp, self.depth, self.slots
        msgs, acks, batches, owner, sim = self._msgs, self._acks, self.batches, self.owner, self.sim
        first, last = k == 0, k == pp - 1
        prev = (k - 1) % pp
        latency = h.gloo_latency[prev]  # of a message from the stage before
        busy = self.busy[k]
        host = sched = fwd_free = 0.0  # host thread, schedule stream, forward stream
        fwd_end: dict[int, float] = {}  # pass -> when this stage's forward of it ended
        holding = False  # outputs received last pass, to pass on this pass (not the last stage)
        # the last gloo sends of the request list and of the hidden states' metadata, not yet waited
        # for: (message key, when it was sent)
        reqs_sent: tuple[tuple, float] | None = None
        proxy_sent: tuple[tuple, float] | None = None
        # stage 0: passes in a row that launched nothing (the engine starts idle: it sleeps until the
        # first request arrives)
        empty_passes = slots
        n = 0
        while True:
            self.passes[k] = n
            slot = n % slots
            # 1. requests: polled by stage 0, relayed down the pipeline by blocking receives
            if first:
                if self.unprocessed == 0 and (empty_passes >= slots or owner.idle()):
                    # nothing on its way back and nothing to do (no request anywhere, or a whole round
                    # launched nothing): only an arrival changes anything. SGLang spins here; the model
                    # sleeps, so a point after an idle spell starts as on a fresh engine
                    owner.on_idle()
                    yield ("idle",)
                    host = max(host, sim.now)
                # the pass drains the tokenizer socket as it starts: what has arrived by then is
                # scheduled this pass (get_next_batch_to_run decides on it, here at the same instant)
                host = max(host, (yield ("at", host))) + h.poll
                batch = owner.decide(slot)
                batches[n] = batch
                if batch is not None:
                    self.unprocessed += 1
                    empty_passes = 0
                else:
                    empty_passes += 1
            else:
                key = ("reqs", prev, n)
                self._posted_receive(key, host)
                if key not in msgs:  # (a message already there is read without yielding)
                    yield ("msg", key)
                sent = msgs.pop(key)[0]
                host = max(host, sent + latency) + h.gloo_recv
                batch = batches[n]
            host += h.tp_broadcast
            if not last:
                if reqs_sent is not None:  # the previous pass's relay must have been received
                    if reqs_sent[0] not in acks:
                        yield ("ack", reqs_sent[0])
                    host = max(host, max(reqs_sent[1], acks.pop(reqs_sent[0])) + h.gloo_latency[k])
                host += h.gloo_send
                reqs_sent = (("reqs", k, n), host)
                self._post(reqs_sent[0], host)
            if batch is not None:
                host += h.sched_base + h.sched_per_req * batch.size
                # 3. the hidden states of this micro-batch from the stage before
                if not first:
                    key = ("proxy", prev, n)
                    self._posted_receive(key, host)
                    if key not in msgs:
                        yield ("msg", key)
                    sent, arrives = msgs.pop(key)
                    host = max(host, sent + latency) + h.object_recv
                    if arrives > sched:
                        sched = arrives
            d2h = sched
            # the exchange has nothing to do when this stage has no send to wait for, nothing to send and
            # nothing to receive (most passes of a ring with empty slots)
            exchanging = (holding or self._outputs_sent[k] is not None
                          or batches.get(n + 1 - slots) is not None
                          or (last and batches.get(n - depth) is not None))
            if depth > 0 and exchanging:  # 4. the output exchange before the forward
                host, sched, d2h, holding = yield from self._exchange(k, n, host, sched, holding, fwd_end)
            if proxy_sent is not None:  # the last hidden states sent must have been received
                if proxy_sent[0] not in acks:
                    yield ("ack", proxy_sent[0])
                host = max(host, max(proxy_sent[1], acks.pop(proxy_sent[0])) + h.gloo_latency[k])
                proxy_sent = None
            # 5. the forward
            if batch is not None:
                shape = batch.shape
                assert shape is not None
                ready = host + h.prepare_base + h.prepare_per_req * batch.size
                start = max(ready, fwd_free, sched)
                end = start + cost.stage_time(k, shape)
                busy.add(start, end)
                fwd_free = fwd_end[n] = end
                host = ready + cost.host_time(k, shape)
            if depth == 0 and exchanging:  # 4. the output exchange after the forward
                host, sched, d2h, holding = yield from self._exchange(k, n, host, sched, holding, fwd_end)
            # 6. the next slot's result, on every stage
            finished = batches.get(n + 1 - slots)
            if finished is not None:
                host = max(host, d2h, sched)  # d2h_event.synchronize(), then .tolist() on the schedule stream
                host += h.process_base + h.process_per_req * finished.size
                if first:
                    host += h.stream_base + h.stream_per_req * finished.size
                    host = max(host, (yield ("at", host)))
                    self.unprocessed -= 1
                    owner.complete((slot + 1) % slots, finished)
            # 7. this micro-batch's hidden states to the next stage
            if batch is not None and not last:
                assert batch.shape is not None
                host += h.object_send
                sched = max(sched, fwd_end[n]) + cost.hop_time(batch.shape, k)
                proxy_sent = (("proxy", k, n), host)
                self._post(proxy_sent[0], host, sched)
            fwd_end.pop(n - 2 * slots, None)
            if first and slot == 0:
                self._forget()
            n += 1

    def _exchange(self, k: int, n: int, host: float, sched: float, holding: bool, fwd_end: dict[int, float]
                  ) -> Generator[Wait, float, tuple[float, float, float, bool]]:
        """The output exchange of pass ``n`` on stage ``k``: send, then receive on even ranks; receive, then
        send on odd ones (the release orders them by rank parity so that no ring of sends deadlocks).
        Returns the host and schedule-stream clocks, when the received outputs land, and whether this
        stage now holds outputs to pass on."""
        h, pp, depth = self.h, self.pp, self.depth
        last = k == pp - 1
        d2h = sched
        received = False
        pending = self._outputs_sent[k]
        if pending is not None:  # the outputs sent last time must have been received
            if pending[0] not in self._acks:
                yield ("ack", pending[0])
            host = max(host, max(pending[1], self._acks.pop(pending[0])) + h.gloo_latency[k])
            self._outputs_sent[k] = None
        for sending in ((True, False) if k % 2 == 0 else (False, True)):
            if sending:
                if last:  # the sampled ids of the micro-batch launched ``depth`` passes ago
                    if self.batches.get(n - depth) is not None:
                        host += h.object_send
                        sched = max(sched, fwd_end[n - depth]) + self.cost.output_time(k)
                        self._outputs_sent[k] = (("out", k, n), host)
                        self._post(("out", k, n), host, sched)
                elif holding:  # what arrived last pass goes on to the next stage
                    host += h.object_send
                    sched += self.cost.output_time(k)
                    self._outputs_sent[k] = (("out", k, n), host)
                    self._post(("out", k, n), host, sched)
            elif self.batches.get(n + 1 - self.slots) is not None:
                # the previous stage sends a micro-batch's outputs one pass after receiving them; the
                # last stage sends micro-batch m on pass m + depth
                prev = (k - 1) % pp
                key = ("out", prev, n + 1 - pp if prev == pp - 1 else n + 1)
                self._posted_receive(key, host)
                if key not in self._msgs:
                    yield ("msg", key)
                sent, arrives = self._msgs.pop(key)
                host = max(host, sent + h.gloo_latency[prev]) + h.object_recv
                sched = max(sched, arrives)
                d2h = sched
                received = True
        return host, sched, d2h, received and not last

    def _forget(self) -> None:
        """Drop micro-batches every stage has processed (the slowest stage is at least this far)."""
        oldest = min(self.passes) - 2 * self.slots
        for m in [m for m in self.batches if m < oldest]:
            del self.batches[m]
