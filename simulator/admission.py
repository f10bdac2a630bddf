"""Admission: what goes into a micro-batch. One replica's shared waiting queue, request pool and KV
budget, and the building of prefill batches (SGLang's ``PrefillAdder``); docs/simulator.md, "The
scheduler model", lists the rules.

*When* a batch runs is the PP loop's business (``replica.py``); this module only answers "which
requests, how many tokens" for the slot being visited, and keeps the pool and KV accounting.
"""

from __future__ import annotations

from collections import deque

from simulator.costs import prefill_shape
from simulator.entities import Batch, PrefillItem, Request, Slot
from simulator.sim_config import SimConfig
from vocab.model import CLIP_MAX_NEW_TOKENS


class Admission:
    def __init__(self, cfg: SimConfig) -> None:
        self.cap = cfg.pp_max_micro_batch_size  # per slot; /set_internal_state may change it
        self.pool_size = cfg.max_running_requests  # request pool rows, shared by all slots
        self.kv_capacity = cfg.max_total_num_tokens
        self.chunk = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else 1 << 62
        self.max_prefill_tokens = cfg.max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self.chunked_req: Request | None = None
        self.pool_used = 0
        self.peak_pool_used = 0  # most requests ever admitted at once (never above max_running_requests)
        self.kv_used = 0  # tokens whose KV is stored (prefilled + generated) for admitted requests
        self.kv_committed = 0  # kv_used plus reservations for admitted requests' remaining tokens

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
        while waiting and rem_chunk > 0 and cap_left > 0 and self.pool_used < self.pool_size:
            req = waiting[0]
            reserve = min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
            if self.kv_committed + req.input_len + reserve > kv_capacity:
                break  # KV budget: wait for running requests to finish
            if req.input_len > rem_input and items:
                break  # max_prefill_tokens bounds one batch (a lone oversize request still goes)
            waiting.popleft()
            req.forward_entry = now
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
                _join(slot, req)
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
        return Batch(decode=False, reqs=[it.req for it in items], items=items,
                     shape=prefill_shape([(it.tokens, it.prefix) for it in items]))

    def store_kv(self, batch: Batch) -> None:
        """A launched batch writes KV: one token per decoding request (mixed ones too), every computed
        prompt token."""
        if batch.decode:
            for r in batch.reqs:
                r.kv_tokens += 1
            self.kv_used += len(batch.reqs)
        else:
            for it in batch.items:
                it.req.kv_tokens += it.tokens
                self.kv_used += it.tokens
            for r in batch.mixed:
                r.kv_tokens += 1
            self.kv_used += len(batch.mixed)

    def drop_finished(self, slot: Slot) -> None:
        keep = []
        for r in slot.reqs:
            if r.finished:
                self.release(r)
            else:
                keep.append(r)
        slot.reqs = keep

    def release(self, req: Request) -> None:
        """Free a finished or aborted request's pool row, KV and reservation."""
        self.pool_used -= 1
        self.kv_used -= req.kv_tokens
        req.kv_tokens = 0
        self.kv_committed -= req.kv_reserved
        req.kv_reserved = 0
        if req.aborted and req.notify is not None:
            req.notify()  # the client side learns that an aborted request is gone


def _join(slot: Slot, req: Request) -> None:
    slot.reqs.append(req)
