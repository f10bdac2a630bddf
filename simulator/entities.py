"""The nouns of the replica model: requests, prefill items, micro-batches, slots and per-stage busy time.

Plain state with no scheduling logic: ``admission.py`` decides what goes into a batch and
``replica.py`` (the PP loop) decides when it runs. docs/simulator.md, "The scheduler model", describes
how they fit together.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from simulator.costs import BatchShape
from simulator.prefix_cache import CacheNode
from vocab.records import PD_TTFT_PARTS


class Request:
    """One generation request, from its arrival at stage 0's scheduler to its last token."""

    __slots__ = (
        "aborted",
        "arrival",
        "arrival_work",
        "cache_node",
        "cached",
        "finish_reason",
        "finish_time",
        "finished",
        "first_token_time",
        "forward_entry",
        "handed_off",
        "input_len",
        "kv_reserved",
        "kv_tokens",
        "last_token_time",
        "log_metrics",
        "max_new_tokens",
        "notify",
        "output_ids",
        "pd",
        "prefilled",
        "prompt",
        "remote",
        "rid",
        "spec_correct_drafts",
        "spec_verify_ct",
        "stream",
        "token_seed",
    )

    def __init__(self, rid: str, input_len: int, max_new_tokens: int, token_seed: int,
                 stream: bool = False, log_metrics: bool = True, prompt: np.ndarray | None = None) -> None:
        self.rid = rid
        self.input_len = input_len
        # the prompt's token ids, which the prefix cache matches (None: a request known by its length
        # only, which the cache neither matches nor keeps)
        self.prompt = prompt
        self.cached = 0  # prompt tokens found in the prefix cache at admission (not computed again)
        self.cache_node: CacheNode | None = None  # the cache node it holds locked while it runs
        self.max_new_tokens = max_new_tokens
        self.token_seed = token_seed
        self.stream = stream
        self.log_metrics = log_metrics
        self.output_ids: list[int] = []
        self.prefilled = 0
        self.arrival = 0.0
        self.arrival_work = 0  # prompt tokens the replica had computed when it arrived (hrrn's clock)
        self.first_token_time = -1.0
        self.forward_entry = -1.0  # when its first prefill batch was built: the end of its queueing
        self.last_token_time = -1.0
        self.finish_time = -1.0
        self.finished = False
        self.aborted = False
        self.finish_reason: dict | None = None
        self.kv_reserved = 0
        self.kv_tokens = 0  # tokens of this request whose KV is stored
        self.spec_verify_ct = 0  # speculative verifies it went through (SGLang's meta_info field)
        self.spec_correct_drafts = 0  # drafted tokens the target accepted over them
        self.notify: Callable[[], None] | None = None  # set by the client side; called on new output
        # disaggregation: a prefill server's request, prefilled and handed to its transfer (it leaves the
        # running batch but keeps its KV until the transfer completes)
        self.handed_off = False
        self.pd: PDTimes | None = None  # disaggregation: when each part of its first token happened
        # vLLM's KV connector: this request's KV is read by another server once it finishes (KVHold) or
        # read from another server instead of computed (KVPull)
        self.remote: KVHold | KVPull | None = None

    @property
    def context_len(self) -> int:
        return self.input_len + len(self.output_ids)


@dataclass
class KVHold:
    """vLLM's prefill side of a KV transfer (``kv_transfer_params.do_remote_decode``): once the request
    has finished (one token), its KV stays for the decode server to read; ``held(req)`` is told then."""

    held: Callable[[Request], None]


@dataclass
class KVPull:
    """vLLM's decode side (``do_remote_prefill``): the prompt's KV is read from the prefill server's blocks
    instead of computed. Once the scheduler has room for it, ``start(req, tokens)`` begins the read of the
    ``tokens`` its prefix cache lacks; the scheduler is told when they are in (``state``: waiting, reading,
    received)."""

    start: Callable[[Request, int], None]
    state: str = "waiting"


@dataclass
class PDTimes:
    """A disaggregated request's way to its first token, in model seconds: it reaches both servers, the
    decode server pre-allocates its KV (the prefill server may compute from then on), the prefill server
    admits it to a batch, finishes its last chunk, its KV arrives, the decode server streams the token.
    The parts of its TTFT are the differences (``parts``)."""

    arrival: float = -1.0
    preallocated: float = -1.0
    prefill_start: float = -1.0
    prefill_end: float = -1.0
    transferred: float = -1.0
    first_token: float = -1.0
    transfer_bytes: float = 0.0  # per GPU

    def parts(self) -> dict[str, float]:
        """Bootstrap wait, prefill queue, prefill compute, transfer, decode's first step (seconds), by
        their names in ``vocab.records.PD_TTFT_PARTS``."""
        bootstrap = max(self.preallocated, self.arrival)
        values = (bootstrap - self.arrival, self.prefill_start - bootstrap,
                  self.prefill_end - self.prefill_start, self.transferred - self.prefill_end,
                  self.first_token - self.transferred)
        return dict(zip(PD_TTFT_PARTS, values, strict=True))


@dataclass(frozen=True)
class PDQueues:
    """A disaggregated server's own queues, as its batch lines and gauges report them: a prefill server's
    bootstrap queue (waiting for their decode server) and inflight queue (prefilled, KV on the way); a
    decode server's pre-allocation queue, its transfer queue (KV reserved, not arrived), the prompt tokens
    reserved for those, and the prompt tokens still waiting to be reserved."""

    bootstrap: int = 0
    inflight: int = 0
    prealloc: int = 0
    transfer: int = 0
    preallocated_tokens: int = 0
    pending_tokens: int = 0


@dataclass
class PrefillItem:
    """The part of one request's prompt a prefill batch computes (a whole prompt or one chunk)."""

    req: Request
    tokens: int
    prefix: int  # prompt tokens already prefilled by earlier chunks
    last_chunk: bool


@dataclass
class Batch:
    """One micro-batch: a decode step of a slot's requests, or a prefill of new prompts and chunks."""

    decode: bool
    reqs: list[Request]  # decode: the slot's requests
    items: list[PrefillItem] = field(default_factory=list)  # prefill: what is computed
    # prefill with --enable-mixed-chunk: the slot's running requests, one decode token each, in the
    # same forward
    mixed: list[Request] = field(default_factory=list)
    shape: BatchShape | None = None
    cuda_graph: bool = False
    # the requests the scheduler's host work scales with: a decode step's, or a prefill's prompts plus
    # the running requests decoding beside them (set when the batch is launched)
    size: int = 0


@dataclass
class Slot:
    """One of the L = pp_size + pp_async_batch_depth micro-batch slots of the PP loop."""

    index: int
    reqs: list[Request] = field(default_factory=list)  # running (prefilled) requests owned by the slot
    in_flight: Batch | None = None


@dataclass
class DPBalance:
    """One attention-DP rank's share of the lockstep forwards, as SGLang 0.5.23 counts it
    (``sglang:dp_attention_tokens_total``, ``sglang:dp_attention_steps_total``): the tokens it ran, the
    tokens the busiest rank ran beyond it (capacity lost to imbalance), and its forwards with and without
    tokens of its own."""

    scheduled: int = 0
    imbalance: int = 0
    active: int = 0
    idle: int = 0


@dataclass
class SchedulerClock:
    """When one scheduler's thread and its GPU are next free (pp = 1). With the overlap scheduler
    (``hide``, SGLang's default) the iteration's host work runs beside the GPU step it launches, since
    the sampled ids stay on the GPU; without it, before. The thread is free again once it has also
    dispatched the forward (one graph replay, or every kernel when eager)."""

    hide: bool
    cpu_free: float = 0.0
    gpu_free: float = 0.0  # when the GPU finishes the step launched last

    def launch(self, now: float, host: float, dispatch: float, step: float) -> tuple[float, float]:
        """A step launched at ``now``: (start, end) on the GPU."""
        t = now if self.hide else now + host
        self.cpu_free = (now + host if self.hide else t) + dispatch
        start = max(t, self.gpu_free)
        self.gpu_free = start + step
        return start, self.gpu_free


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
