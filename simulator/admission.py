"""Admission: what goes into a micro-batch. One replica's shared waiting queue, request pool and KV
budget, and the building of prefill batches (SGLang's ``PrefillAdder``); docs/simulator.md, "The
scheduler model", lists the rules.

*When* a batch runs is the PP loop's business (``replica.py``); this module only answers "which
requests, how many tokens" for the slot being visited, and keeps the pool and KV accounting.

With the prefix cache (``prefix_cache.py``, on unless ``--disable-radix-cache``) the KV pool holds the
cache's tree and what running requests keep outside it. A request is matched when it is considered for
admission: its cached prefix is locked and not computed again. Its prompt joins the tree when its prefill
has run (``prefill_done``), its output when it finishes (``release``); cached tokens no request holds
are evicted, least recently used first, when a prefill needs their room. The budget a new request must
fit is SGLang's: the pool less what is locked in the tree and what running requests hold or reserve.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from simulator.costs import prefill_shape
from simulator.entities import Batch, PrefillItem, Request, Slot
from simulator.prefix_cache import RadixCache
from simulator.schedule_policy import SchedulePolicy
from simulator.sim_config import SimConfig
from vocab.model import CLIP_MAX_NEW_TOKENS


class Admission:
    def __init__(self, cfg: SimConfig, clock: Callable[[], float]) -> None:
        self.cap = cfg.pp_max_micro_batch_size  # per slot; /set_internal_state may change it
        self.pool_size = cfg.max_running_requests  # request pool rows, shared by all slots
        self.kv_capacity = cfg.max_total_num_tokens
        self.chunk = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else 1 << 62
        self.max_prefill_tokens = cfg.max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self.chunked_req: Request | None = None
        self.pool_used = 0
        self.peak_pool_used = 0  # most requests ever admitted at once (never above max_running_requests)
        # tokens admitted requests store outside the cache's tree (prompts not yet inserted, outputs)
        self.kv_used = 0
        self.kv_committed = 0  # kv_used plus reservations for admitted requests' remaining tokens
        self.cache = RadixCache(cfg.page_size, clock) if cfg.radix_cache else None
        self.policy = SchedulePolicy(cfg.schedule_policy, self.cache, cfg.random_seed)
        self.batch_cached = 0  # prompt tokens of the last prefill batch found in the cache
        self.cached_total = 0  # since start: prompt tokens found in the cache
        self.computed_total = 0  # since start: prompt tokens computed
        # speculative decoding: slots each running request holds back for a step's drafts
        self.spec_headroom = cfg.speculative.kv_headroom if cfg.speculative is not None else 0
        self.peak_kv_used = 0  # the most KV held since the last reset (predictions' kv_token_usage_max)
        self.on_release: Callable[[], None] | None = None  # a decode server retries its pre-allocations

    @property
    def pool_tokens(self) -> int:
        """Tokens whose KV the pool holds: the cache's tree and what admitted requests keep outside it."""
        return self.kv_used + (self.cache.total if self.cache is not None else 0)

    @property
    def held_tokens(self) -> int:
        """Tokens of the pool a new request cannot take: everything but the cache's evictable part
        (SGLang's token usage counts these)."""
        return self.kv_used + (self.cache.protected if self.cache is not None else 0)

    @property
    def has_work(self) -> bool:
        """Requests wait for a prefill (new ones, or the rest of a chunked prompt)."""
        return bool(self.waiting) or self.chunked_req is not None

    @property
    def pending_tokens(self) -> int:
        return sum(r.input_len for r in self.waiting)

    def withdraw(self, req: Request) -> bool:
        """Take a not-yet-admitted request out of the waiting queue; False if it was not waiting."""
        if req in self.waiting:
            self.waiting.remove(req)
            return True
        return False

    def build_prefill(self, slot: Slot, now: float, mixed_decodes: int = 0) -> Batch | None:
        """The prefill batch of ``slot``'s turn at ``now``: the chunked request's next chunk, then new
        requests from the waiting queue while the slot cap, the request pool, the token budgets and the
        KV budget allow. Requests whose prompt completes join ``slot``. None when nothing can be
        admitted. ``mixed_decodes`` running requests will decode in the same forward (mixed chunk):
        their tokens come off the chunk and input budgets and off the KV budget, as in SGLang's
        ``PrefillAdder``."""
        items: list[PrefillItem] = []
        rem_chunk = self.chunk - mixed_decodes
        rem_input = self.max_prefill_tokens - mixed_decodes
        kv_capacity = self.kv_capacity - mixed_decodes
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
                _join(slot, cr)
        elif cr is not None:  # aborted mid-prefill
            self.chunked_req = None
            self.release(cr)
        cap_left = self.cap - len(slot.reqs)
        waiting = self.waiting
        cache = self.cache
        self.batch_cached = 0
        if len(waiting) > 1:
            self.policy.order(waiting, self.computed_total)
        while waiting and rem_chunk > 0 and cap_left > 0 and self.pool_used < self.pool_size:
            req = waiting[0]
            reserve = min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) + self.spec_headroom
            cached = self._match(req)
            uncached = req.input_len - cached
            locked = cache.protected if cache is not None else 0
            if locked + self.kv_committed + uncached + reserve > kv_capacity:
                self._unmatch(req)
                break  # KV budget: wait for running requests to finish
            if uncached > rem_input and items:
                self._unmatch(req)
                break  # max_prefill_tokens bounds one batch (a lone oversize request still goes)
            waiting.popleft()
            req.forward_entry = now
            self.pool_used += 1
            if self.pool_used > self.peak_pool_used:
                self.peak_pool_used = self.pool_used
            req.kv_reserved = uncached + reserve
            self.kv_committed += req.kv_reserved
            self.batch_cached += cached
            self.cached_total += cached
            if uncached <= rem_chunk:
                items.append(PrefillItem(req, uncached, cached, True))
                req.prefilled = req.input_len
                rem_chunk -= uncached
                rem_input -= uncached
                _join(slot, req)
                cap_left -= 1
            else:  # becomes the chunked request; later turns (any slot) continue it
                items.append(PrefillItem(req, rem_chunk, cached, False))
                req.prefilled = cached + rem_chunk
                self.chunked_req = req
                rem_chunk = 0
                break
            if self.chunked_req is not None:
                break
        if not items:
            return None
        return Batch(decode=False, reqs=[it.req for it in items], items=items,
                     shape=prefill_shape([(it.tokens, it.prefix) for it in items]))

    def _match(self, req: Request) -> int:
        """Match ``req`` against the cache and lock what it found: the cached prompt tokens. At least one
        prompt token is always computed (its logits give the first output token)."""
        if self.cache is None or req.prompt is None:
            return 0
        cached, node = self.cache.match(req.prompt[:req.input_len - 1])
        self.cache.lock(node)
        req.cached, req.cache_node = cached, node
        return cached

    def _unmatch(self, req: Request) -> None:
        """``req`` was matched but not admitted: it lets go of its lock (it is matched again next time)."""
        if self.cache is not None and req.cache_node is not None:
            self.cache.unlock(req.cache_node)
        req.cached, req.cache_node = 0, None

    def _make_room(self, tokens: int) -> None:
        """Evict cached tokens no request holds until ``tokens`` more fit in the pool."""
        if self.cache is not None:
            short = self.pool_tokens + tokens - self.kv_capacity
            if short > 0:
                self.cache.evict(short)

    def store_kv(self, batch: Batch) -> None:
        """A launched batch writes KV: one token per decoding request (mixed ones too), every computed
        prompt token."""
        if batch.decode:
            self._make_room(len(batch.reqs))
            for r in batch.reqs:
                r.kv_tokens += 1
            self.kv_used += len(batch.reqs)
        else:
            computed = sum(it.tokens for it in batch.items)
            self._make_room(computed + len(batch.mixed))
            self.computed_total += computed
            for it in batch.items:
                it.req.kv_tokens += it.tokens
            self.kv_used += computed
            for r in batch.mixed:
                r.kv_tokens += 1
            self.kv_used += len(batch.mixed)
        if self.held_tokens > self.peak_kv_used:
            self.peak_kv_used = self.held_tokens

    def preallocate(self, req: Request) -> None:
        """Decode server: a pool row and the KV of ``req``'s whole prompt, taken before its KV arrives."""
        self.pool_used += 1
        if self.pool_used > self.peak_pool_used:
            self.peak_pool_used = self.pool_used
        req.kv_tokens = req.input_len
        self.kv_used += req.input_len
        if self.held_tokens > self.peak_kv_used:
            self.peak_kv_used = self.held_tokens

    def commit_accepted(self, req: Request, tokens: int) -> None:
        """A speculative verify kept ``tokens`` accepted drafts of ``req`` beyond the one slot its step
        stored at launch: their KV stays."""
        if tokens > 0:
            self._make_room(tokens)
            req.kv_tokens += tokens
            self.kv_used += tokens

    def prefill_done(self, batch: Batch) -> None:
        """A prefill's results are processed: each prompt it completed joins the cache, locked by its
        request (SGLang's ``cache_unfinished_req``), so requests admitted from now on can share it."""
        cache = self.cache
        if cache is None:
            return
        for it in batch.items:
            req = it.req
            if not it.last_chunk or req.prompt is None or req.aborted:
                continue
            _, node = cache.insert(req.prompt)
            # the prompt's computed tokens now live in the tree (those another request had just
            # inserted are freed as duplicates); only an unaligned tail stays the request's own
            moved = len(req.prompt) - len(req.prompt) % cache.page - req.cached
            cache.lock(node)
            if req.cache_node is not None:
                cache.unlock(req.cache_node)
            req.cache_node = node
            req.kv_tokens -= moved
            self.kv_used -= moved
            req.kv_reserved -= moved
            self.kv_committed -= moved

    def drop_finished(self, slot: Slot) -> None:
        keep = []
        for r in slot.reqs:
            if r.finished:
                self.release(r)
            else:
                keep.append(r)
        slot.reqs = keep

    def release(self, req: Request) -> None:
        """Free a finished or aborted request's pool row and reservation. With the cache, a finished
        request's prompt and output join the tree (SGLang's ``cache_finished_req``: every token whose KV
        was written, not the last one sampled) and stay until evicted; without it, its KV is freed."""
        self.pool_used -= 1
        self.free_kv(req)

    def free_kv(self, req: Request) -> None:
        """``req``'s KV and reservation freed (into the cache where there is one), its pool row apart."""
        cache = self.cache
        if cache is not None and req.prompt is not None and not req.aborted and req.cache_node is not None:
            written = np.concatenate((req.prompt, np.asarray(req.output_ids[:-1], dtype=np.int64)))
            _, node = cache.insert(written)
            cache.lock(node)
            cache.unlock(req.cache_node)
            req.cache_node = node
        self.kv_used -= req.kv_tokens
        req.kv_tokens = 0
        self.kv_committed -= req.kv_reserved
        req.kv_reserved = 0
        if req.cache_node is not None:
            cache.unlock(req.cache_node)  # type: ignore[union-attr]
            req.cache_node = None
        if req.aborted and req.notify is not None:
            req.notify()  # the client side learns that an aborted request is gone
        if self.on_release is not None:
            self.on_release()

    def flush_cache(self) -> bool:
        """Empty the prefix cache (``/flush_cache``); refused (False) while any request is admitted or
        waiting, as SGLang refuses."""
        if self.waiting or self.pool_used or self.chunked_req is not None:
            return False
        if self.cache is not None:
            self.cache.reset()
        return True


def _join(slot: Slot, req: Request) -> None:
    slot.reqs.append(req)
