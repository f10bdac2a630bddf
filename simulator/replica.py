"""One engine replica in the discrete-event model: requests in, tokens out, the scheduler's decisions.

With pp > 1 the timing is SGLang's PP event loop on every rank (``pp_loop.py``): this class makes stage
0's decisions for it (``decide``: the slot's next batch, from ``admission.py``) and takes each processed
result (``complete``: tokens streamed, finished requests freed, the decode log). docs/simulator.md, "What
each stage's host does" and "The scheduler model".

pp = 1 is plain continuous batching on one process (``_turn``, ``_launch``): the step's GPU time and
the scheduler iteration's host time (``CostModel.sched_time``), side by side under the overlap
scheduler (SGLang's default), one after the other with ``--disable-overlap-schedule``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from simulator.admission import Admission
from simulator.costs import decode_shape, prefill_shape
from simulator.entities import Batch, DPBalance, PDQueues, Request, SchedulerClock, Slot, StageBusy
from simulator.pp_loop import PipelineLoop
from simulator.sim_config import SimConfig
from simulator.speculative.decoding import SpecStats
from simulator.timebase import Simulation


class Observer(Protocol):
    """Receives what SGLang's tokenizer manager and scheduler report (metrics, logs)."""

    def on_first_token(self, req: Request, now: float) -> None: ...
    def on_token(self, req: Request, itl: float) -> None: ...
    def on_finish(self, req: Request, now: float) -> None: ...
    def on_prefill_batch(self, replica: ReplicaModel, n_new: int, n_tokens: int, n_cached: int,
                         running: int) -> None: ...
    def on_decode_log(self, replica: ReplicaModel, batch_size: int, cuda_graph: bool) -> None: ...
    def on_idle(self, replica: ReplicaModel) -> None: ...
    def on_kv_transferred(self, seconds: float, nbytes: float) -> None: ...
    def on_pd_stage(self, stage: str, seconds: float) -> None: ...
    def on_dp_balance(self, imbalance_ratio: float | None, sync_wait: float) -> None: ...


class Handoff(Protocol):
    """A prefill server's transfer side (``simulator/disagg/prefill_role.py``): told of every chunk whose
    forward has run (the prompt tokens whose KV now leaves), and of the request whose last chunk it was."""

    def chunk_done(self, req: Request, tokens: int, last: bool) -> None: ...


class Lockstep(Protocol):
    """The ranks' group an attention-DP rank belongs to: woken when the rank has something to run."""

    def wake(self) -> None: ...


class ReplicaModel:
    """One engine replica on a shared ``Simulation``: requests in (``submit``, ``abort``), tokens out
    (each request's ``output_ids`` and ``notify``), reports to an ``Observer``."""

    def __init__(self, cfg: SimConfig, sim: Simulation) -> None:
        self.cfg = cfg
        self.sim = sim
        self.observer: Observer | None = None  # the live server's Reporter; None in predictions
        self.cost = cfg.cost
        self.pp = cfg.pp
        self.admission = Admission(cfg, lambda: sim.now)
        self.arriving = 0  # submitted, not yet at the scheduler
        self.num_slots = cfg.pp + (cfg.depth if cfg.pp > 1 else 0)
        self.slots = [Slot(i) for i in range(self.num_slots)]
        # pp=1 with the overlap scheduler launches step n+1 before step n's results are processed (the
        # sampled ids stay on the GPU), so the iteration's host time runs beside the GPU. Under PP a slot's
        # next batch needs its own result processed first, so host time always sits between a slot's
        # return and its next launch; pp_async_batch_depth > 0 hides it only by giving stage 0 other
        # slots' work to run meanwhile (docs/simulator.md, "The scheduler model").
        self.clock = SchedulerClock(hide=cfg.pp == 1 and not cfg.disable_overlap_schedule)
        self.cursor = 0
        self.turn_pending = False
        # SGLang's --scheduler-recv-interval N (pp = 1): requests that reached the scheduler's socket are
        # taken in only once N decode iterations have passed since the last take; any other iteration
        # (a prefill, nothing to run) takes them at once (SchedulerRecvSkipper: a decode weighs 1, any
        # other forward mode as much as the whole interval)
        self.recv_interval = max(1, int(cfg.args.scheduler_recv_interval)) if cfg.pp == 1 else 1
        self.recv_count = 0
        self.unreceived: list[Request] = []
        # The overlap scheduler (SGLang's event_loop_overlap, vLLM's async scheduling) builds the batch that
        # follows the running one before the running one's results are in, when the batch before it ends
        # (receive, build, launch, then wait for the previous batch): a request that comes while a batch
        # runs is received only once that batch is done, after the next one was built, and goes into the
        # batch after it (even one that comes as the running batch ends: its successor was built already)
        self.behind: list[Request] = []
        self.successor_built = False  # a batch was launched and the one to follow it is already decided
        self.last_decode = False  # the last launched batch was decode-only
        self.busy = [StageBusy() for _ in range(cfg.pp)]
        self.in_flight = 0
        self.peak_in_flight = 0  # most micro-batches ever in flight at once (tests, predictions)
        # counters (SGLang's scheduler statistics)
        self.forward_ct_decode = 0
        self.gen_tokens_since_log = 0
        self.last_decode_log_time = 0.0
        self.last_gen_throughput = 0.0
        self.prefill_tokens_since_log = 0
        self.last_prefill_log_time = 0.0
        self.tokens_prefill_total = 0
        self.tokens_decode_total = 0
        self.decode_steps = 0
        self.prefill_steps = 0
        self._vocab = cfg.spec.vocab
        self._eos = set(cfg.spec.eos_token_ids)
        self.output_hook: Callable[[], None] | None = None  # called once per emission event (health)
        self.pipeline = (PipelineLoop(cfg.cost, cfg.pp, cfg.depth, sim, self, self.busy) if cfg.pp > 1
                         else None)
        # speculative decoding (pp = 1): each decode step is a draft-verify-extend iteration whose
        # requests each emit their accepted tokens at once
        self.spec = cfg.speculative
        self.spec_stats = SpecStats()
        self._accept = self.spec.accept_sampler(cfg.random_seed) if self.spec is not None else None
        # the running requests a prefill batch carries verify their drafts there too (vLLM's steps);
        # SGLang's mixed chunk gives each its one token
        self.mixed_verify = False
        # disaggregation: a prefill server hands each prefilled request to its transfer; a decode server
        # takes requests whose KV has arrived into its running batch at its next turn
        self.handoff: Handoff | None = None
        self.kv_arrived: list[Request] = []
        self.pd_queues: Callable[[], PDQueues] | None = None  # a disaggregated server's own queues
        # an attention-DP rank: its turns are taken by the group of ranks it runs in lockstep with
        # (simulator/attention_dp/group.py)
        self.lockstep: Lockstep | None = None
        self.dp_balance = DPBalance()  # an attention-DP rank's counts of the forwards it took part in

    # -- requests in -------------------------------------------------------------------------------------

    def submit(self, req: Request, now: float) -> None:
        """A request reaches stage 0's scheduler at simulated time ``now``."""
        self.arriving += 1
        self.sim.schedule(now, self._arrive, req)

    @property
    def load(self) -> int:
        """Requests this replica holds: arriving, waiting or admitted (what a router counts in flight)."""
        return (self.arriving + len(self.unreceived) + len(self.behind) + len(self.admission.waiting)
                + self.admission.pool_used)

    def _arrive(self, req: Request) -> None:
        self.arriving -= 1
        req.arrival = self.sim.now
        req.arrival_work = self.admission.computed_total
        if req.aborted:
            return
        if self.recv_interval > 1 and any(s.reqs for s in self.slots):  # a running batch to decode
            self.unreceived.append(req)  # on the socket until the scheduler next polls it
            return
        if self.clock.hide and self.successor_built:
            self.behind.append(req)
            return
        self.admission.waiting.append(req)
        self._wake()

    def _take_behind(self) -> bool:
        """The requests that came while the last batch ran join the waiting queue (the next batch was
        built without them); whether there were any."""
        late = [r for r in self.behind if not r.aborted]
        self.behind = []
        self.admission.waiting.extend(late)
        return bool(late)

    def _receive(self, decoded: bool) -> None:
        """The scheduler's poll of its socket after an iteration (``decoded``: a decode-only one)."""
        self.recv_count += 1 if decoded else self.recv_interval
        if self.recv_count >= self.recv_interval:
            self.recv_count = 0
            if self.unreceived:
                self.admission.waiting.extend(r for r in self.unreceived if not r.aborted)
                self.unreceived = []

    def abort(self, req: Request) -> None:
        """The client went away: drop the request at the next opportunity (SGLang aborts it too)."""
        if req.finished:
            return
        req.aborted = True
        req.finished = True
        req.finish_reason = {"type": "abort", "message": "client disconnected"}
        if self.admission.withdraw(req):
            self._wake()

    def holds(self, req: Request) -> bool:
        """Whether ``req`` is waiting, running or being prefilled on this replica."""
        adm = self.admission
        return req in adm.waiting or adm.chunked_req is req or any(req in s.reqs for s in self.slots) \
            or req in self.kv_arrived or req in self.unreceived or req in self.behind

    def release_handed_off(self, req: Request) -> None:
        """Prefill server: ``req``'s KV has all arrived at its decode server: it is done here, and its pool
        row and KV are free for the next ones."""
        self._finish(req, self.sim.now, req.log_metrics and self.observer is not None)
        self.admission.release(req)
        if req.notify is not None:
            req.notify()
        self._wake()

    def receive_kv(self, req: Request) -> None:
        """Decode server: ``req``'s KV (pre-allocated earlier) has arrived with its first token; it joins
        the running batch at the next turn."""
        self.kv_arrived.append(req)
        self._wake()

    # -- pp > 1: stage 0's part in the PP loop ------------------------------------------------------------

    def decide(self, slot: int) -> Batch | None:
        """Slot ``slot``'s next micro-batch, built now (get_next_batch_to_run on stage 0; every stage
        makes the same decision)."""
        batch = self._build_batch(self.slots[slot])
        if batch is None:
            return None
        self.admission.store_kv(batch)
        batch.cuda_graph = self.cost.uses_cuda_graph(batch.shape)  # type: ignore[arg-type]
        batch.size = len(batch.reqs) if batch.decode else len(batch.items) + len(batch.mixed)
        self.slots[slot].in_flight = batch
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        return batch

    def complete(self, slot: int, batch: Batch) -> None:
        """Stage 0 has processed ``batch``'s result: its tokens go out, and the slot is free again."""
        self._emit(batch)
        self._return(self.slots[slot], batch)

    def idle(self) -> bool:
        """No request waits, is being prefilled or runs in any slot."""
        adm = self.admission
        return (not adm.waiting and not self.unreceived and not self.behind and adm.chunked_req is None
                and not any(s.reqs for s in self.slots))

    def on_idle(self) -> None:
        if self.observer is not None and self.in_flight == 0 and not self.admission.waiting:
            self.observer.on_idle(self)

    # -- pp = 1: one scheduler process ---------------------------------------------------------------------

    def _wake(self) -> None:
        if self.pipeline is not None:
            self.pipeline.wake()
            return
        if self.lockstep is not None:
            self.lockstep.wake()
            return
        if not self.turn_pending:
            self.turn_pending = True
            self.sim.schedule(max(self.sim.now, self.clock.cpu_free), self._turn)

    def _turn(self) -> None:
        self.turn_pending = False
        now = self.sim.now
        if now < self.clock.cpu_free:
            self._wake()
            return
        skipped = 0
        while skipped < self.num_slots:
            slot = self.slots[self.cursor]
            if slot.in_flight is not None:
                return  # blocking receive of this slot's output; its return wakes us
            if self.recv_interval > 1:
                self._receive(self.last_decode)
            batch = self._next_batch(slot)
            self.cursor = (self.cursor + 1) % self.num_slots
            if batch is None:
                skipped += 1
                continue
            self._launch(slot, batch, now)
            if self.clock.cpu_free > now:
                self._wake()
                return
            skipped = 0
        if self.unreceived and self.in_flight == 0 and not self.admission.has_work:
            self._receive(False)  # an iteration with nothing to run polls the socket
            self._wake()
            return
        if self.observer is not None and self.in_flight == 0 and not self.admission.waiting:
            self.observer.on_idle(self)

    def _next_batch(self, slot: Slot) -> Batch | None:
        """The slot's next batch, built from what was received before the last batch ran; the requests
        that came while it ran are received after (the batch after this one takes them), at once where
        there is nothing else to run."""
        self.successor_built = False
        batch = self._build_batch(slot)
        if self._take_behind() and batch is None:
            batch = self._build_batch(slot)
        return batch

    def _build_batch(self, slot: Slot) -> Batch | None:
        adm = self.admission
        if self.kv_arrived:
            self._prebuild(slot)
        if any(r.finished for r in slot.reqs):  # aborted while the slot was idle
            adm.drop_finished(slot)
        if adm.has_work:
            running = list(slot.reqs)
            mixed = self.cfg.mixed_chunk and bool(running)
            batch = adm.build_prefill(slot, self.sim.now, len(running) if mixed else 0)
            if batch is not None:  # prefill first: this slot's decode waits a turn, unless mixed in
                prompt_tokens = batch.shape.tokens
                if mixed:
                    batch.mixed = running
                    batch.shape = prefill_shape([(it.tokens, it.prefix) for it in batch.items]
                                                + [(1, r.context_len) for r in running])
                self.prefill_tokens_since_log += prompt_tokens
                if self.observer is not None:
                    # SGLang's #new-seq counts every request the batch prefills, a continued chunk too
                    self.observer.on_prefill_batch(self, len(batch.items), prompt_tokens, adm.batch_cached,
                                                   len(running))
                return batch
        if slot.reqs:
            reqs = list(slot.reqs)
            lens = [r.context_len for r in reqs]
            shape = decode_shape(lens) if self.spec is None else self.spec.iteration.verify_shape(lens)
            return Batch(decode=True, reqs=reqs, shape=shape)
        return None

    def _launch(self, slot: Slot, batch: Batch, now: float) -> None:
        cost = self.cost
        self.last_decode = batch.decode
        self.admission.store_kv(batch)
        shape = batch.shape
        batch.cuda_graph = cost.uses_cuda_graph(shape)
        host = cost.sched_time(len(batch.reqs) + len(batch.mixed))
        # Stage 0's scheduler thread also dispatches stage 0's forward (one graph replay, or every kernel
        # when eager), so it is free for the next turn only after both.
        dispatch, step = self._price(batch)
        self._run(slot, batch, *self.clock.launch(now, host, dispatch, step))

    def _price(self, batch: Batch) -> tuple[float, float]:
        """(host dispatch, GPU seconds) of ``batch``'s forward: a speculative decode is the draft passes,
        the verify and the draft extend, each dispatched."""
        spec = self.spec if batch.decode else None
        if spec is None:
            return self.cost.host_time(0, batch.shape), self.cost.stage_time(0, batch.shape)
        lens = [r.context_len for r in batch.reqs]
        parts = spec.iteration.parts(lens)
        self.spec_stats.busy(parts)
        return spec.iteration.host_time(lens), parts.total

    def _run(self, slot: Slot, batch: Batch, start: float, end: float) -> None:
        """``batch`` on the GPU from ``start`` to ``end``; its tokens go out and its slot is free at the
        end."""
        self.busy[0].add(start, end)
        slot.in_flight = batch
        self.successor_built = True  # in the engine's loop, built before this batch's results are in
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        self.sim.schedule(end, self._emit, batch)
        self.sim.schedule(end, self._return, slot, batch)

    # -- an attention-DP rank: its group takes the turns ----------------------------------------------------

    @property
    def running_forward(self) -> bool:
        return self.slots[0].in_flight is not None

    def next_batch(self) -> Batch | None:
        """The rank's batch for the group's next forward (its scheduler's get_next_batch_to_run), or
        None; an iteration with nothing to run polls the socket as a single engine's does."""
        if self.recv_interval > 1:
            self._receive(self.last_decode)
        batch = self._next_batch(self.slots[0])
        if batch is None and self.unreceived and not self.admission.has_work:
            self._receive(False)
            batch = self._build_batch(self.slots[0])
        return batch

    def run_forward(self, batch: Batch | None, start: float, end: float, graph: bool) -> None:
        """The group's forward from ``start`` to ``end``: this rank's ``batch``, or an idle batch (the
        GPUs busy all the same)."""
        if batch is None:
            self.busy[0].add(start, end)
            return
        self.last_decode = batch.decode
        self.admission.store_kv(batch)
        batch.cuda_graph = graph
        self._run(self.slots[0], batch, start, end)

    # -- results -----------------------------------------------------------------------------------------

    def _emit(self, batch: Batch) -> None:
        # the hottest loop of every prediction (once per request and token): kept to locals
        now = self.sim.now
        obs = self.observer
        if batch.decode:
            reqs = batch.reqs
            self.decode_steps += 1
            self.tokens_decode_total += len(reqs)
            self.gen_tokens_since_log += len(reqs)
        else:
            reqs = [it.req for it in batch.items if it.last_chunk]
            self.admission.prefill_done(batch)
            self.prefill_steps += 1
            self.tokens_prefill_total += sum(it.tokens for it in batch.items)
            if self.handoff is not None:
                self._hand_off(batch)
                return
            if batch.mixed:  # the running requests decoded in the same forward
                self.tokens_decode_total += len(batch.mixed)
                self.gen_tokens_since_log += len(batch.mixed)
                if self._accept is not None and self.mixed_verify:  # verified their drafts
                    self._emit_accepted(batch.mixed, now)
                else:
                    reqs += batch.mixed
        if batch.decode and self._accept is not None:
            self._emit_accepted(reqs, now)
            return
        vocab, eos = self._vocab, self._eos
        for req in reqs:
            if req.finished:
                continue
            out = req.output_ids
            # deterministic per (seed, request, position); never an EOS id, so lengths are exactly
            # max_new_tokens (``_token``, written out: this runs for every token of every request)
            tok = (req.token_seed * 2654435761 + len(out) * 40503 + 12345) % vocab
            while tok in eos:
                tok = (tok + 1) % vocab
            out.append(tok)
            report = obs is not None and req.log_metrics
            if req.first_token_time < 0:
                req.first_token_time = now
                if req.pd is not None:  # vLLM's decode server computes its first token itself
                    req.pd.first_token = now
                if report:
                    obs.on_first_token(req, now)
            elif report:
                obs.on_token(req, now - req.last_token_time)
            req.last_token_time = now
            if len(out) >= req.max_new_tokens:
                self._finish(req, now, report)
            if req.notify is not None:
                req.notify()
        if self.output_hook is not None:
            self.output_hook()

    def first_token(self, req: Request) -> int:
        """The token ``req`` starts with where no prefill server sampled it (the fake transfer backend)."""
        return self._token(req)

    def _token(self, req: Request) -> int:
        """``req``'s next output token: deterministic per (seed, request, position), never an EOS id."""
        tok = (req.token_seed * 2654435761 + len(req.output_ids) * 40503 + 12345) % self._vocab
        while tok in self._eos:
            tok = (tok + 1) % self._vocab
        return tok

    def _hand_off(self, batch: Batch) -> None:
        """Prefill server: each chunk's KV leaves after its forward; a completed prompt's first token is
        sampled and the request handed to its transfer (it leaves the batch, its KV stays until sent)."""
        assert self.handoff is not None
        now = self.sim.now
        for it in batch.items:
            req = it.req
            if req.aborted:
                continue
            if it.last_chunk:
                req.output_ids.append(self._token(req))
                req.first_token_time = req.last_token_time = now
                req.handed_off = True
            # the decode server has no copy of a prefix this server found in its cache: it goes with the
            # first chunk (SGLang sends cached pages early, before the forward)
            sent = it.tokens + (req.cached if it.prefix == req.cached else 0)
            self.handoff.chunk_done(req, sent, it.last_chunk)
        if self.output_hook is not None:
            self.output_hook()

    def _prebuild(self, slot: Slot) -> None:
        """Decode server: requests whose KV arrived join ``slot``'s running batch, their first token (the
        prefill server's) streamed now: SGLang's prebuilt batch, which runs no forward."""
        now, obs = self.sim.now, self.observer
        for req in self.kv_arrived:
            if req.finished:  # aborted while its KV was on the way
                self.admission.release(req)
                continue
            slot.reqs.append(req)
            req.first_token_time = req.last_token_time = now
            if req.pd is not None:
                req.pd.first_token = now
                if obs is not None:  # SGLang's decode_waiting: the KV arrived to the first token streamed
                    obs.on_pd_stage("decode_waiting", now - req.pd.transferred)
            report = obs is not None and req.log_metrics
            if report:
                obs.on_first_token(req, now)
            if len(req.output_ids) >= req.max_new_tokens:
                self._finish(req, now, report)
            if req.notify is not None:
                req.notify()
        self.kv_arrived = []
        if self.output_hook is not None:
            self.output_hook()

    def _finish(self, req: Request, now: float, report: bool) -> None:
        """``req`` has all its tokens (never an EOS id, so exactly max_new_tokens)."""
        req.finished = True
        req.finish_time = now
        req.finish_reason = {"type": "length", "length": req.max_new_tokens}
        if report and self.observer is not None:
            self.observer.on_finish(req, now)

    def _emit_accepted(self, reqs: list[Request], now: float) -> None:
        """A speculative iteration's results: each request emits its accepted drafts and the target's
        own token in one chunk (never past its max_new_tokens), committed to its KV."""
        obs = self.observer
        accept = self._accept
        assert accept is not None
        emitted = 0
        for req in reqs:
            if req.finished:
                continue
            out = req.output_ids
            n = min(accept(), req.max_new_tokens - len(out))
            for _ in range(n):  # ``_token``, written out: every accepted token
                tok = (req.token_seed * 2654435761 + len(out) * 40503 + 12345) % self._vocab
                while tok in self._eos:
                    tok = (tok + 1) % self._vocab
                out.append(tok)
            emitted += n
            self.admission.commit_accepted(req, n - 1)
            self.spec_stats.kept(n - 1)
            report = obs is not None and req.log_metrics
            if report:  # SGLang observes a chunk of n tokens as n inter-token latencies of interval / n
                itl = (now - req.last_token_time) / n
                for _ in range(n):
                    obs.on_token(req, itl)
            req.spec_verify_ct += 1
            req.spec_correct_drafts += n - 1
            req.last_token_time = now
            if len(out) >= req.max_new_tokens:
                self._finish(req, now, report)
            if req.notify is not None:
                req.notify()
        self.spec_stats.add(len(reqs), emitted)
        extra = emitted - len(reqs)
        self.tokens_decode_total += extra
        self.gen_tokens_since_log += extra
        if self.output_hook is not None:
            self.output_hook()

    def _return(self, slot: Slot, batch: Batch) -> None:
        slot.in_flight = None
        self.in_flight -= 1
        if self.handoff is not None and not batch.decode:
            slot.reqs = [r for r in slot.reqs if not r.handed_off]
        if any(r.finished for r in slot.reqs):
            self.admission.drop_finished(slot)
        if batch.decode:
            self.forward_ct_decode += 1
            if self.forward_ct_decode % self.cfg.args.decode_log_interval == 0:
                self._decode_log(len(batch.reqs), batch.cuda_graph)
        if self.pipeline is None:
            self._wake()

    def _decode_log(self, batch_size: int, cuda_graph: bool) -> None:
        now = self.sim.now
        dt = now - self.last_decode_log_time
        self.last_gen_throughput = self.gen_tokens_since_log / dt if dt > 0 else 0.0
        self.gen_tokens_since_log = 0
        self.last_decode_log_time = now
        if self.observer is not None:
            self.observer.on_decode_log(self, batch_size, cuda_graph)

    # -- read-outs ---------------------------------------------------------------------------------------

    def input_throughput_and_reset(self) -> float:
        now = self.sim.now
        dt = now - self.last_prefill_log_time
        tput = self.prefill_tokens_since_log / dt if dt > 0 else 0.0
        self.prefill_tokens_since_log = 0
        self.last_prefill_log_time = now
        return tput

    @property
    def num_running(self) -> int:
        return sum(len(s.reqs) for s in self.slots)
