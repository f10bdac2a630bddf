"""The discrete-event model of one SGLang engine replica (all its PP stages), after sglang.md section 4.

Entities: ``Request``; ``Slot`` (one of the L = pp_size + pp_async_batch_depth micro-batch slots, owning
a disjoint set of running requests); per-stage GPU timelines (``StageBusy``). Stage 0's scheduler visits
the slots round-robin. A slot whose previous micro-batch has not come back around the ring blocks the
loop (SGLang's blocking receive), which is what lock-steps micro-batches and opens bubbles.

Each visit of a free slot builds one batch, prefill first (new requests from the shared waiting queue,
within the slot cap, the request pool, the chunked-prefill token budget and the KV budget), else a
decode step of the slot's running requests. The batch is pushed through the stages in FIFO order, so
its whole timeline is known at launch: stage k starts at max(arrival from k-1, stage k free). Two events
follow: tokens are emitted when the step leaves the last stage, and the slot is free again once the
sampled ids are back at stage 0 (result processing).

Stage 0's host is one serial resource: each turn costs ``CostModel.sched_time`` (process the slot's
result, build its next batch), paid between the slot's return and its next launch. With depth 0 every
slot is in that position every turn, so the host time is a bubble on each; extra slots (depth > 0) keep
the GPUs fed while it runs. pp=1 with the overlap scheduler runs it beside the GPU step instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from simulator.clock import Simulation
from simulator.costs import BatchShape
from simulator.resolve import SimConfig

CLIP_MAX_NEW_TOKENS = 4096  # SGLang's cap on the per-request decode reservation (CLIP_MAX_NEW_TOKENS)


class Request:
    __slots__ = (
        "aborted",
        "arrival",
        "finish_reason",
        "finish_time",
        "finished",
        "first_token_time",
        "input_len",
        "kv_reserved",
        "kv_tokens",
        "last_token_time",
        "log_metrics",
        "max_new_tokens",
        "notify",
        "output_ids",
        "prefilled",
        "rid",
        "slot",
        "stream",
        "token_seed",
    )

    def __init__(self, rid: str, input_len: int, max_new_tokens: int, token_seed: int,
                 stream: bool = False, log_metrics: bool = True) -> None:
        self.rid = rid
        self.input_len = input_len
        self.max_new_tokens = max_new_tokens
        self.token_seed = token_seed
        self.stream = stream
        self.log_metrics = log_metrics
        self.output_ids: list[int] = []
        self.prefilled = 0
        self.arrival = 0.0
        self.first_token_time = -1.0
        self.last_token_time = -1.0
        self.finish_time = -1.0
        self.finished = False
        self.aborted = False
        self.finish_reason: dict | None = None
        self.slot = -1
        self.kv_reserved = 0
        self.kv_tokens = 0  # tokens of this request whose KV is stored
        self.notify: Callable[[], None] | None = None  # set by the HTTP layer; called on new output

    @property
    def context_len(self) -> int:
        return self.input_len + len(self.output_ids)


class Observer(Protocol):
    """Receives what SGLang's tokenizer manager and scheduler report (metrics, logs)."""

    def on_first_token(self, req: Request, now: float) -> None: ...
    def on_token(self, req: Request, itl: float) -> None: ...
    def on_finish(self, req: Request, now: float) -> None: ...
    def on_prefill_batch(self, engine: Engine, n_new: int, n_tokens: int, running: int) -> None: ...
    def on_decode_log(self, engine: Engine, batch_size: int, cuda_graph: bool) -> None: ...
    def on_idle(self, engine: Engine) -> None: ...


@dataclass
class PrefillItem:
    req: Request
    tokens: int
    prefix: int
    last_chunk: bool


@dataclass
class Batch:
    slot: int
    decode: bool
    reqs: list[Request]  # decode: the slot's requests
    items: list[PrefillItem] = field(default_factory=list)  # prefill: what is computed
    shape: BatchShape | None = None
    launch: float = 0.0
    cuda_graph: bool = False


@dataclass
class Slot:
    index: int
    reqs: list[Request] = field(default_factory=list)  # running (prefilled) requests owned by the slot
    in_flight: Batch | None = None


class StageBusy:
    """Busy intervals of one stage's GPUs. Intervals are known at launch (possibly in the future), arrive
    in start order and never overlap (one FIFO per stage)."""

    __slots__ = ("_done", "_pending", "_recent", "window")

    def __init__(self, window: float = 1.0) -> None:
        self._done = 0.0
        self._pending: deque[tuple[float, float]] = deque()
        self._recent: deque[tuple[float, float]] = deque()  # finished intervals, kept for the window
        self.window = window

    def add(self, start: float, end: float) -> None:
        self._pending.append((start, end))

    def _fold(self, now: float) -> None:
        while self._pending and self._pending[0][1] <= now:
            iv = self._pending.popleft()
            self._done += iv[1] - iv[0]
            self._recent.append(iv)
        horizon = now - 2 * self.window
        while self._recent and self._recent[0][1] < horizon:
            self._recent.popleft()

    def busy_total(self, now: float) -> float:
        """Seconds busy in [0, now]."""
        self._fold(now)
        partial = 0.0
        for s, e in self._pending:
            if s >= now:
                break
            partial += min(e, now) - s
        return self._done + partial

    def busy_fraction(self, now: float) -> float:
        """Fraction of the last ``window`` seconds spent busy."""
        self._fold(now)
        lo = now - self.window
        busy = 0.0
        for s, e in self._recent:
            if e > lo:
                busy += e - max(s, lo)
        for s, e in self._pending:
            if s >= now:
                break
            busy += min(e, now) - max(s, lo)
        return min(busy / self.window, 1.0) if self.window > 0 else 0.0


class Engine:
    def __init__(self, cfg: SimConfig, sim: Simulation, dp_rank: int = 0,
                 observer: Observer | None = None) -> None:
        self.cfg = cfg
        self.sim = sim
        self.dp_rank = dp_rank
        self.observer = observer
        self.cost = cfg.cost
        self.pp = cfg.pp
        self.num_slots = cfg.pp + (cfg.depth if cfg.pp > 1 else 0)
        self.slots = [Slot(i) for i in range(self.num_slots)]
        self.cap = cfg.pp_max_micro_batch_size
        self.pool_size = cfg.max_running_requests
        self.kv_capacity = cfg.max_total_num_tokens
        self.chunk = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else 1 << 62
        self.max_prefill_tokens = cfg.max_prefill_tokens
        # pp=1 with the overlap scheduler launches step n+1 before step n's results are processed (the
        # sampled ids stay on the GPU), so the iteration's host time runs beside the GPU. Under PP a slot's
        # next batch needs its own result processed first, so host time always sits between a slot's
        # return and its next launch; pp_async_batch_depth > 0 hides it only by giving stage 0 other
        # slots' work to run meanwhile (see docs/simulator.md).
        self.hide_cpu = cfg.pp == 1 and not cfg.disable_overlap_schedule
        self.waiting: deque[Request] = deque()
        self.chunked_req: Request | None = None
        self.pool_used = 0
        self.kv_used = 0  # tokens whose KV is stored (prefilled + generated) for admitted requests
        self.kv_committed = 0  # kv_used plus reservations for admitted requests' remaining tokens
        self.cursor = 0
        self.cpu_free = 0.0
        self.turn_pending = False
        self.gpu_free = [0.0] * cfg.pp
        self.busy = [StageBusy() for _ in range(cfg.pp)]
        self.in_flight = 0
        self.peak_in_flight = 0  # most micro-batches ever in flight at once (tests, predictions)
        self.peak_pool_used = 0  # most requests ever admitted at once (never above max_running_requests)
        # counters (SGLang's scheduler statistics)
        self.forward_ct_decode = 0
        self.gen_tokens_since_log = 0
        self.last_decode_log_time = 0.0
        self.last_gen_throughput = 0.0
        self.prefill_tokens_since_log = 0
        self.last_prefill_log_time = 0.0
        self.last_input_throughput = 0.0
        self.tokens_prefill_total = 0
        self.tokens_decode_total = 0
        self.decode_steps = 0
        self.prefill_steps = 0
        self.cuda_graph_passes = 0
        vocab = cfg.spec.vocab
        eos = set(cfg.spec.eos_token_ids)
        self._vocab = vocab
        self._eos = eos
        self.output_hook: Callable[[], None] | None = None  # called once per emission event (health)

    # -- requests in -------------------------------------------------------------------------------------

    def submit(self, req: Request, now: float) -> None:
        """A request reaches stage 0's scheduler at simulated time ``now``."""
        self.sim.schedule(now, self._arrive, req)

    def _arrive(self, req: Request) -> None:
        req.arrival = self.sim.now
        if req.aborted:
            return
        self.waiting.append(req)
        self._wake()

    def abort(self, req: Request) -> None:
        """The client went away: drop the request at the next opportunity (SGLang aborts it too)."""
        if req.finished:
            return
        req.aborted = True
        req.finished = True
        req.finish_reason = {"type": "abort", "message": "client disconnected"}
        if req in self.waiting:
            self.waiting.remove(req)
            self._wake()

    # -- stage-0 scheduler loop --------------------------------------------------------------------------

    def _wake(self) -> None:
        if not self.turn_pending:
            self.turn_pending = True
            self.sim.schedule(max(self.sim.now, self.cpu_free), self._turn)

    def _turn(self) -> None:
        self.turn_pending = False
        now = self.sim.now
        if now < self.cpu_free:
            self._wake()
            return
        skipped = 0
        while skipped < self.num_slots:
            slot = self.slots[self.cursor]
            if slot.in_flight is not None:
                return  # blocking receive of this slot's output; its return wakes us
            batch = self._build_batch(slot)
            self.cursor = (self.cursor + 1) % self.num_slots
            if batch is None:
                skipped += 1
                continue
            self._launch(slot, batch, now)
            if self.cpu_free > now:
                self._wake()
                return
            skipped = 0
        if self.observer is not None and self.in_flight == 0 and not self.waiting:
            self.observer.on_idle(self)

    def _build_batch(self, slot: Slot) -> Batch | None:
        if any(r.finished for r in slot.reqs):  # aborted while the slot was idle
            self._drop_finished(slot)
        if self.waiting or self.chunked_req is not None:
            batch = self._build_prefill(slot)
            if batch is not None:
                return batch  # prefill first: this slot's decode waits a turn
        if slot.reqs:
            return Batch(slot=slot.index, decode=True, reqs=list(slot.reqs))
        return None

    def _build_prefill(self, slot: Slot) -> Batch | None:
        items: list[PrefillItem] = []
        rem_chunk = self.chunk
        rem_input = self.max_prefill_tokens
        running_before = len(slot.reqs)
        cr = self.chunked_req
        if cr is not None and not cr.aborted:
            n = min(cr.input_len - cr.prefilled, rem_chunk)
            last = cr.prefilled + n == cr.input_len
            items.append(PrefillItem(cr, n, cr.prefilled, last))
            cr.prefilled += n
            rem_chunk -= n
            rem_input -= n
            if last:
                self.chunked_req = None
                self._join(slot, cr)
        elif cr is not None:  # aborted mid-prefill
            self.chunked_req = None
            self._release(cr)
        cap_left = self.cap - len(slot.reqs)
        waiting = self.waiting
        while waiting and rem_chunk > 0 and cap_left > 0 and self.pool_used < self.pool_size:
            req = waiting[0]
            reserve = min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
            if self.kv_committed + req.input_len + reserve > self.kv_capacity:
                break  # KV budget: wait for running requests to finish
            if req.input_len > rem_input and items:
                break  # max_prefill_tokens bounds one batch (a lone oversize request still goes)
            waiting.popleft()
            self.pool_used += 1
            if self.pool_used > self.peak_pool_used:
                self.peak_pool_used = self.pool_used
            req.kv_reserved = req.input_len + reserve
            self.kv_committed += req.kv_reserved
            if req.input_len <= rem_chunk:
                items.append(PrefillItem(req, req.input_len, 0, True))
                req.prefilled = req.input_len
                rem_chunk -= req.input_len
                rem_input -= req.input_len
                self._join(slot, req)
                cap_left -= 1
            else:  # becomes the chunked request; later turns (any slot) continue it
                items.append(PrefillItem(req, rem_chunk, 0, False))
                req.prefilled = rem_chunk
                self.chunked_req = req
                rem_chunk = 0
                break
            if self.chunked_req is not None:
                break
        if not items:
            return None
        n_tok = sum(it.tokens for it in items)
        kv_read = sum(it.prefix for it in items)
        attn = sum(it.tokens * it.prefix + it.tokens * (it.tokens + 1) / 2 for it in items)
        shape = BatchShape(tokens=n_tok, seqs=len(items), kv_read_tokens=kv_read, attn_ctx=attn, decode=False)
        new_seqs = sum(1 for it in items if it.prefix == 0)
        self.prefill_tokens_since_log += n_tok
        if self.observer is not None:
            self.observer.on_prefill_batch(self, new_seqs, n_tok, running_before)
        return Batch(slot=slot.index, decode=False, reqs=[it.req for it in items], items=items, shape=shape)

    def _join(self, slot: Slot, req: Request) -> None:
        req.slot = slot.index
        slot.reqs.append(req)

    def _launch(self, slot: Slot, batch: Batch, now: float) -> None:
        cost = self.cost
        if batch.decode:
            ctx = 0
            for r in batch.reqs:
                ctx += r.context_len
                r.kv_tokens += 1  # the step writes the KV of each request's last token
            n = len(batch.reqs)
            batch.shape = BatchShape(tokens=n, seqs=n, kv_read_tokens=ctx, attn_ctx=float(ctx), decode=True)
            self.kv_used += n
        else:
            for it in batch.items:
                it.req.kv_tokens += it.tokens
            self.kv_used += batch.shape.tokens
        shape = batch.shape
        batch.cuda_graph = cost.uses_cuda_graph(shape)
        host = cost.sched_time(len(batch.reqs))
        if self.hide_cpu:
            t = now
            self.cpu_free = now + host
        else:
            t = now + host
            self.cpu_free = t
        batch.launch = t
        hop = cost.hop_time(shape) if self.pp > 1 else 0.0
        gpu_free = self.gpu_free
        last = self.pp - 1
        for s in range(self.pp):
            start = t if t > gpu_free[s] else gpu_free[s]
            end = start + cost.stage_time(s, shape)
            gpu_free[s] = end
            self.busy[s].add(start, end)
            t = end + hop if s < last else end
        slot.in_flight = batch
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        self.sim.schedule(t, self._emit, batch)
        self.sim.schedule(t + cost.return_time(), self._return, slot, batch)

    # -- results -----------------------------------------------------------------------------------------

    def _token(self, req: Request) -> int:
        # Deterministic per (seed, request, position); never an EOS id, so lengths are exactly max_new_tokens.
        tok = (req.token_seed * 2654435761 + len(req.output_ids) * 40503 + 12345) % self._vocab
        while tok in self._eos:
            tok = (tok + 1) % self._vocab
        return tok

    def _emit(self, batch: Batch) -> None:
        now = self.sim.now
        obs = self.observer
        if batch.decode:
            reqs = batch.reqs
            self.decode_steps += 1
            self.tokens_decode_total += len(reqs)
            self.gen_tokens_since_log += len(reqs)
            if batch.cuda_graph:
                self.cuda_graph_passes += 1
        else:
            reqs = [it.req for it in batch.items if it.last_chunk]
            self.prefill_steps += 1
            self.tokens_prefill_total += batch.shape.tokens
        for req in reqs:
            if req.finished:
                continue
            req.output_ids.append(self._token(req))
            if req.first_token_time < 0:
                req.first_token_time = now
                if obs is not None and req.log_metrics:
                    obs.on_first_token(req, now)
            elif obs is not None and req.log_metrics:
                obs.on_token(req, now - req.last_token_time)
            req.last_token_time = now
            if len(req.output_ids) >= req.max_new_tokens:
                req.finished = True
                req.finish_time = now
                req.finish_reason = {"type": "length", "length": req.max_new_tokens}
                if obs is not None and req.log_metrics:
                    obs.on_finish(req, now)
            if req.notify is not None:
                req.notify()
        if self.output_hook is not None:
            self.output_hook()

    def _return(self, slot: Slot, batch: Batch) -> None:
        slot.in_flight = None
        self.in_flight -= 1
        if any(r.finished for r in slot.reqs):
            self._drop_finished(slot)
        if batch.decode:
            self.forward_ct_decode += 1
            if self.forward_ct_decode % self.cfg.args.decode_log_interval == 0:
                self._decode_log(len(batch.reqs), batch.cuda_graph)
        self._wake()

    def _drop_finished(self, slot: Slot) -> None:
        keep = []
        for r in slot.reqs:
            if r.finished:
                self._release(r)
            else:
                keep.append(r)
        slot.reqs = keep

    def _release(self, req: Request) -> None:
        self.pool_used -= 1
        self.kv_used -= req.kv_tokens
        req.kv_tokens = 0
        self.kv_committed -= req.kv_reserved
        req.kv_reserved = 0
        if req.aborted and req.notify is not None:
            req.notify()

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
        self.last_input_throughput = tput
        return tput

    @property
    def num_running(self) -> int:
        return sum(len(s.reqs) for s in self.slots)

    @property
    def pending_tokens(self) -> int:
        return sum(r.input_len for r in self.waiting)
