"""vLLM's scheduler (``vllm/v1/core/sched/scheduler.py``) in the replica model.

vLLM has no prefill batch and no decode batch: every step gives each request the tokens it still needs
(``num_tokens - num_computed_tokens``: one for a decoding request, the rest of its prompt for one being
prefilled), under one token budget per step (``--max-num-batched-tokens``):

1. the running requests first, in the order they were admitted, each up to the budget left (and to
   ``--long-prefill-token-threshold`` where set). A request whose new tokens do not fit in the free KV
   cache preempts the last running request (first come, first served): that one's KV is freed and it goes
   back to the front of the waiting queue, to be computed again from its first token (recompute, vLLM's
   only preemption mode). When the request itself is the last, it waits for the next step;
2. then, unless a request was preempted in this step, waiting requests in order while the budget lasts and
   fewer than ``--max-num-seqs`` run: the prompt's cached prefix is taken from the prefix cache, the rest
   is computed in chunks of what the budget leaves. From 0.19 a request is admitted only when its whole
   prompt fits in the free KV cache (``scheduler_reserve_full_isl``); before, its first chunk had to.

The KV cache is counted in tokens (vLLM allocates blocks of ``--block-size`` tokens; the rounding is not
modelled) and shared with the prefix cache, whose unreferenced blocks are free to take (evicted least
recently used first). A step's forward is priced by the same step costs as SGLang's mixed batch: the
prompt chunks and one token per decoding request. docs/simulator.md, "Playing vLLM".
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.admission import Admission
from simulator.costs import decode_shape, prefill_shape
from simulator.entities import Batch, KVHold, KVPull, PrefillItem, Request, Slot
from simulator.replica import ReplicaModel
from simulator.sim_config import SimConfig
from simulator.speculative.iteration import step_shape
from simulator.timebase import Simulation
from simulator.vllm.releases import played


class VLLMAdmission(Admission):
    """What goes into each step, and the KV and request accounting behind it."""

    def __init__(self, cfg: SimConfig, clock: Callable[[], float]) -> None:
        super().__init__(cfg, clock)
        self.budget = cfg.chunked_prefill_size  # --max-num-batched-tokens
        self.long_threshold = int(cfg.args.long_prefill_token_threshold)
        self.reserve_full_prompt = played(cfg.args.vllm_release).reserve_full_prompt
        # each slot's admitted requests in the order they were admitted (one slot but under PP, where a
        # batch per stage is in flight and a request is in at most one of them)
        self.running: dict[int, list[Request]] = {}
        self.preemptions = 0  # since start (vllm:num_preemptions)
        self.queried_total = (
            0  # since start: tokens looked up in the prefix cache (vllm:prefix_cache_queries)
        )
        self.step_preemptions = 0  # in the step built last
        # --speculative-config: a decoding request verifies its k drafts with its own next token, k + 1
        # tokens of the budget, and holds ``lookahead`` KV slots more while its drafter writes them
        self.spec = cfg.args.vllm_speculative if cfg.speculative is not None else None
        # --kv-transfer-config: requests whose KV is being read from a prefill server (decode side), and
        # finished requests whose KV stays until a decode server has read it (prefill side), by id
        self.reading: list[Request] = []
        self.held: dict[str, Request] = {}

    @property
    def num_running(self) -> int:
        return sum(len(r) for r in self.running.values())

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or any(
            r.prefilled < r.context_len and not r.finished for reqs in self.running.values() for r in reqs
        )

    def holds(self, req: Request) -> bool:
        return any(req in reqs for reqs in self.running.values()) or req in self.reading

    def drop_finished(self, slot: Slot) -> None:
        """Finished and aborted requests leave the slot: their pool row and KV are freed (their prompt and
        output stay in the prefix cache). A prefill server's request for a decode server keeps its KV
        until that server has read it (vLLM's connector delays the blocks' free)."""
        running = self.running.get(slot.index, [])
        for r in [r for r in running if r.finished]:
            running.remove(r)
            if r in slot.reqs:
                slot.reqs.remove(r)
            if isinstance(r.remote, KVHold) and not r.aborted:
                self.pool_used -= 1
                self.held[r.rid] = r
                r.remote.held(r)
            else:
                self.release(r)
        super().drop_finished(slot)  # anything finished in the slot that was not in running

    def free_read(self, rid: str) -> bool:
        """A decode server has read held request ``rid``'s KV (or gave up): its blocks are free. False
        where no such request is held."""
        req = self.held.pop(rid, None)
        if req is not None:
            self.free_kv(req)
        return req is not None

    def _start_read(self, req: Request, pull: KVPull, promised: int) -> bool:
        """Decode side: the blocks of ``req``'s prompt its prefix cache lacks, taken now, and their read
        from the prefill server started (no token of the step's budget: vLLM's WAITING_FOR_REMOTE_KVS).
        False where the free KV cannot hold them."""
        cached = self._match(req)
        need = req.input_len - cached
        if need > self._free(promised):
            self._unmatch(req)
            return False
        self._make_room(need)
        req.kv_tokens = need - 1  # the last prompt token is computed again here (below)
        self.kv_used += req.kv_tokens
        req.kv_reserved = need
        self.kv_committed += need
        self.peak_kv_used = max(self.peak_kv_used, self.held_tokens)
        pull.state = "reading"
        self.reading.append(req)
        pull.start(req, need)
        return True

    def kv_received(self, req: Request) -> None:
        """``req``'s KV has been read: all of its prompt but the last token counts as computed (vLLM
        computes that one again for the logits of the first token) and it waits at the head of the queue."""
        self.reading.remove(req)
        assert isinstance(req.remote, KVPull)
        req.remote.state = "received"
        if req.finished:  # aborted while its KV was on the way
            self.free_kv(req)
            return
        req.prefilled = req.input_len - 1
        self.waiting.appendleft(req)

    def read_failed(self, req: Request) -> None:
        """The read of ``req``'s KV failed: vLLM computes the prompt itself (its default load-failure
        policy), so the request waits again as a plain one, its blocks freed."""
        self.reading.remove(req)
        req.remote = None
        self.free_kv(req)
        if not req.finished:
            self.waiting.appendleft(req)

    def _preempt(self, slot: Slot, req: Request) -> None:
        """Recompute: ``req``'s KV is freed (what was cached stays in the prefix cache) and it goes back
        to the front of the waiting queue with its output so far, which it will compute again."""
        self.running[slot.index].remove(req)
        if req in slot.reqs:
            slot.reqs.remove(req)
        self.release(req)
        req.prefilled = 0
        req.cached = 0
        if isinstance(req.remote, KVPull):  # its KV was read once: computed here from now on
            req.remote = None
        self.waiting.appendleft(req)
        self.preemptions += 1
        self.step_preemptions += 1

    def _free(self, promised: int) -> int:
        """KV tokens a step may still take: the pool less what requests hold, the cache's blocks in use
        and what this step has already promised."""
        return self.kv_capacity - self.held_tokens - promised

    def _chunk(self, todo: int, budget: int) -> int:
        n = min(todo, budget)
        return min(n, self.long_threshold) if self.long_threshold > 0 else n

    def build_step(self, slot: Slot, now: float) -> Batch | None:
        """The step ``slot`` runs next: its running requests' tokens, then new ones; None when nothing
        can run."""
        self.drop_finished(slot)
        running = self.running.setdefault(slot.index, [])
        budget, promised = self.budget, 0
        items: list[PrefillItem] = []
        decodes: list[Request] = []
        self.step_preemptions = 0
        self.batch_cached = 0
        i = 0
        verify: dict[int, int] = {}  # a speculative decode's tokens this step (1 + its drafts kept)
        while i < len(running) and budget > 0:
            req = running[i]
            todo = req.context_len - req.prefilled
            decoding = todo == 1 and bool(req.output_ids)
            n = self._chunk(1 + self.spec.k if decoding and self.spec is not None else todo, budget)
            if n <= 0:  # nothing to compute until its last token is out (vLLM skips it: `continue`)
                i += 1
                continue
            need = n + (self.spec.lookahead if decoding and self.spec is not None else 0)
            while need > self._free(promised):
                victim = running[-1]
                self._preempt(slot, victim)
                if victim is req:
                    break
            if req not in running:  # it preempted itself: nothing more of the running list fits
                break
            if decoding:
                decodes.append(req)
                verify[id(req)] = n
                req.prefilled += 1  # the verified drafts' positions are kept as they are accepted
            else:
                items.append(PrefillItem(req, n, req.prefilled, req.prefilled + n == req.context_len))
                req.prefilled += n
            promised += need
            budget -= n
            i += 1
        while self.waiting and budget > 0 and not self.step_preemptions and self.num_running < self.pool_size:
            req = self.waiting[0]
            if req.finished:  # aborted while waiting
                self.waiting.popleft()
                continue
            pull = req.remote if isinstance(req.remote, KVPull) else None
            if pull is not None and pull.state == "waiting":
                if not self._start_read(req, pull, promised):
                    break
                self.waiting.popleft()
                continue
            if pull is not None:  # its KV is in: this step computes its last prompt token, one query token
                self.waiting.popleft()  # as a decode's (a step of such tokens alone replays a full graph)
                self._run_received(req, running, now)
                if req not in slot.reqs:
                    slot.reqs.append(req)
                decodes.append(req)
                req.prefilled += 1
                promised += 1
                budget -= 1
                continue
            cached = self._match(req)
            todo = req.context_len - cached
            if self.cache is not None:
                self.queried_total += req.context_len
            n = self._chunk(todo, budget)
            if (todo if self.reserve_full_prompt else n) > self._free(promised):
                self._unmatch(req)
                break
            self.waiting.popleft()
            req.forward_entry = now
            running.append(req)
            self.pool_used += 1
            self.peak_pool_used = max(self.peak_pool_used, self.pool_used)
            req.kv_reserved = req.input_len - cached
            self.kv_committed += req.kv_reserved
            self.batch_cached += cached
            self.cached_total += cached
            items.append(PrefillItem(req, n, cached, cached + n == req.context_len))
            req.prefilled = cached + n
            promised += n
            budget -= n
        for it in items:  # a request whose prompt is all computed decodes from the next step on
            if it.last_chunk and it.req not in slot.reqs:
                slot.reqs.append(it.req)
        if not items and not decodes:
            return None
        if not items:
            lens = [r.context_len for r in decodes]
            shape = decode_shape(lens) if self.spec is None else step_shape(lens, self.spec.k + 1)
            return Batch(decode=True, reqs=decodes, shape=shape)
        return Batch(
            decode=False,
            reqs=[it.req for it in items],
            items=items,
            mixed=decodes,
            shape=prefill_shape(
                [(it.tokens, it.prefix) for it in items]
                + [(verify.get(id(r), 1), r.context_len) for r in decodes]
            ),
        )

    def _run_received(self, req: Request, running: list[Request], now: float) -> None:
        if req.forward_entry < 0:  # a deployment on one clock set it where its prefill began
            req.forward_entry = now
        running.append(req)
        self.pool_used += 1
        self.peak_pool_used = max(self.peak_pool_used, self.pool_used)

    def commit_accepted(self, req: Request, tokens: int) -> None:
        """The verify kept ``tokens`` drafts: their KV stays and they count as computed (vLLM takes the
        rejected ones back off ``num_computed_tokens``)."""
        super().commit_accepted(req, tokens)
        if tokens > 0:
            req.prefilled += tokens


class VLLMReplica(ReplicaModel):
    """One vLLM engine core: the replica model with vLLM's scheduler deciding each step."""

    def __init__(self, cfg: SimConfig, sim: Simulation) -> None:
        super().__init__(cfg, sim)
        self.admission: VLLMAdmission = VLLMAdmission(cfg, lambda: sim.now)
        self.mixed_verify = self.spec is not None  # a step verifies its decodes' drafts beside prompt chunks
        self.prompt_tokens_computed = 0  # since start: prompt tokens computed (recomputed ones too)
        self.step_hook: Callable[[int], None] | None = None  # told each step's tokens (the live server)

    def _build_batch(self, slot: Slot) -> Batch | None:
        batch = self.admission.build_step(slot, self.sim.now)
        if batch is not None and not batch.decode:
            computed = sum(it.tokens for it in batch.items)
            self.prefill_tokens_since_log += computed
            self.prompt_tokens_computed += computed
        if batch is not None and self.step_hook is not None:
            self.step_hook(batch.shape.tokens if batch.shape is not None else 0)
        return batch

    def _price(self, batch: Batch) -> tuple[float, float]:
        """A step that computed prompt tokens runs the drafter too where speculation is on: a pass over
        every token of the step, then one token per request for each further draft."""
        dispatch, step = super()._price(batch)
        if self.spec is None or batch.decode or batch.shape is None:
            return dispatch, step
        drafting = [it.req.context_len for it in batch.items] + [r.context_len for r in batch.mixed]
        parts, host = self.spec.iteration.drafter_parts(batch.shape, drafting)
        self.spec_stats.busy(parts)
        return dispatch + host, step + parts.total

    def holds(self, req: Request) -> bool:
        return super().holds(req) or self.admission.holds(req)

    # -- --kv-transfer-config: the connector's side of the scheduler (simulator/vllm/nixl.py) -------------

    def remote_kv_in(self, req: Request) -> None:
        """Decode side: ``req``'s KV has been read; it runs at the next step."""
        self.admission.kv_received(req)
        self._wake()

    def remote_kv_failed(self, req: Request) -> None:
        """Decode side: the read of ``req``'s KV failed; its prompt is computed here."""
        self.admission.read_failed(req)
        self._wake()

    def free_read(self, rid: str) -> bool:
        """Prefill side: held request ``rid``'s KV has been read; its blocks are free for new work."""
        freed = self.admission.free_read(rid)
        if freed:
            self._wake()
        return freed

    def idle(self) -> bool:
        return super().idle() and self.admission.num_running == 0

    @property
    def num_running(self) -> int:
        return self.admission.num_running
