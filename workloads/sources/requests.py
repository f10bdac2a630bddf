"""A source's requests by index: the token ids each sends and the answer length it asks for.

Every request is a pure function of the source, the seed and its index, as generated prompts are, so a
measurement, a prediction and a re-run send the same requests.

* ShareGPT, one turn: conversation ``order[i]``'s first question, its recorded answer's length as the
  output length (sent with ``ignore_eos``, so the engine generates exactly that many tokens).
* ShareGPT, multi-turn: sessions in ``order``; turn k of a session sends the conversation so far, token
  for token: every earlier question and *recorded* answer, then question k. (The engine's own answer
  differs from the recorded one, so a real engine's prefix cache matches up to the last answer.) No chat
  template is applied: the turns' ids are concatenated.
* Traces: row ``i`` of the replayed window. Mooncake prompts are built block by block from the hash ids:
  block ``h`` is the same ``block_size`` ids in every request that lists ``h`` (drawn from the seed and
  ``h``), so an engine sees the prefix sharing the trace recorded; the last block holds the remainder.
  Azure prompts share nothing.

Requests that cannot be sent as recorded are skipped and counted, never cut: a prompt or answer under
``MIN_TOKENS`` (ShareGPT, as SGLang's and vLLM's benchmarks do), a prompt plus answer longer than the
model's context, an empty prompt or answer in a trace.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from vocab.load import LoadPoint, RequestSpec, Source

from .base import SourceRequest, SourceRequests
from .shared_prefix import SharedPrefixRequests
from .sharegpt import Conversations, conversations, packaged_path, read_conversations
from .traces import read_trace

MIN_TOKENS = 4


class _ShareGPT(SourceRequests):
    def __init__(self, source: Source, seed: int, vocab_size: int) -> None:
        super().__init__(source, seed, vocab_size)
        self.conv: Conversations = conversations(source.path, source.tokenizer)
        lengths = self.conv.message_lengths()
        context = source.context or np.iinfo(np.int64).max
        turns: list[int] = []  # per conversation: how many of its turns can be sent
        short = long = cut_turns = 0
        for c in range(len(self.conv)):
            m0, m1 = int(self.conv.starts[c]), int(self.conv.starts[c + 1])
            history = 0
            n = 0
            for m in range(m0, m1, 2):
                q, a = int(lengths[m]), int(lengths[m + 1])
                fits = q >= MIN_TOKENS and a >= MIN_TOKENS and history + q + a <= context
                if not fits and n == 0:  # the conversation is skipped: say why
                    short += q < MIN_TOKENS or a < MIN_TOKENS
                    long += q >= MIN_TOKENS and a >= MIN_TOKENS
                if not fits:
                    cut_turns += (m1 - m) // 2 if n else 0  # a session ends before this turn
                    break
                history += q + a
                n += 1
                if not source.multi_turn:
                    break
            turns.append(n)
        kept = np.flatnonzero(np.asarray(turns) > 0)
        self.order = kept[np.random.default_rng([seed, 7]).permutation(len(kept))]
        self.turns = np.asarray(turns)[self.order]
        self.count = len(self.order)
        self.skipped = {f"under {MIN_TOKENS} tokens": short, "longer than the context": long,
                        "later turns cut (under 4 tokens, or past the context with their history)":
                        cut_turns}
        cut = " (the file is cut off after them)" if self.conv.cut_off else ""
        self.read = (f"ShareGPT {self.conv.path}: {self.conv.recovered:,} complete conversations "
                     f"read{cut}, {len(self.conv):,} with a question and its answer")
        if source.multi_turn:
            self.session_turns = tuple(int(t) for t in self.turns)
            self.starts = np.concatenate([[0], np.cumsum(self.turns)])

    def _turn(self, i: int) -> tuple[int, int]:
        """Request ``i``'s conversation and turn."""
        if self.source.multi_turn:
            flat = i % int(self.starts[-1])  # past the last session: from the first again
            s = int(np.searchsorted(self.starts, flat, side="right")) - 1
            return int(self.order[s]), flat - int(self.starts[s])
        return int(self.order[i % self.count]), 0

    def request(self, i: int) -> SourceRequest:
        c, turn = self._turn(i)
        m0 = int(self.conv.starts[c])
        last = m0 + 2 * turn  # the question this request asks
        ids = self.conv.ids[self.conv.offsets[m0]:self.conv.offsets[last + 1]]
        answer = int(self.conv.offsets[last + 2] - self.conv.offsets[last + 1])
        return SourceRequest(_fold(np.asarray(ids, dtype=np.int64), self.vocab_size), answer)

    def messages(self, i: int) -> tuple[dict[str, str], ...]:
        c, turn = self._turn(i)
        texts = _texts(self.source.path)[c]
        return tuple({"role": "user" if k % 2 == 0 else "assistant", "content": texts[k]}
                     for k in range(2 * turn + 1))


@functools.lru_cache(maxsize=2)
def _texts(path: str | None) -> list[list[str]]:
    return read_conversations(packaged_path() if path is None else Path(path))[0]


class _Trace(SourceRequests):
    def __init__(self, source: Source, seed: int, vocab_size: int) -> None:
        super().__init__(source, seed, vocab_size)
        trace = read_trace(source.kind, source.path)
        t = trace.times_s
        end = np.inf if source.window_s is None else source.start_s + source.window_s
        in_window = (t >= source.start_s) & (t < end)
        if not in_window.any():
            raise ValueError(f"{trace.path}: no request between {source.start_s:g} s and {end:g} s "
                             f"(the trace spans {t[-1]:g} s)")
        total = trace.input_len + trace.output_len
        empty = in_window & ((trace.input_len < 1) | (trace.output_len < 1))
        long = in_window & ~empty & (total > (source.context or np.iinfo(np.int64).max))
        kept = np.flatnonzero(in_window & ~empty & ~long)
        if len(kept) == 0:
            raise ValueError(f"{trace.path}: every request in the window is empty or longer than the "
                             f"model's context ({source.context})")
        self.trace, self.rows = trace, kept
        self.count = len(kept)
        self.times_s = t[kept] - source.start_s
        self.skipped = {"with no prompt or answer": int(empty.sum()),
                        "longer than the context": int(long.sum())}
        window = "the whole trace" if source.window_s is None else (
            f"{source.start_s:g}-{end:g} s of it")
        self.read = f"{source.kind} trace {trace.path}: {len(trace):,} requests over {t[-1]:,.0f} s, {window}"
        self._blocks: dict[int, np.ndarray] = {}

    def request(self, i: int) -> SourceRequest:
        row = int(self.rows[i % self.count])
        n_in = int(self.trace.input_len[row])
        if self.trace.hash_ids is None:
            ids = np.random.default_rng([self.seed, 11, row]).integers(0, self.vocab_size, n_in)
        else:
            hashes = self.trace.hash_ids[row]
            parts = [self._block(h) for h in hashes]
            covered = len(hashes) * self.source.block_size
            if covered < n_in:  # more prompt than blocks: the rest is this request's own
                parts.append(np.random.default_rng([self.seed, 13, row]).integers(
                    0, self.vocab_size, n_in - covered))
            ids = np.concatenate(parts)[:n_in]
        return SourceRequest(ids, int(self.trace.output_len[row]))

    def _block(self, h: int) -> np.ndarray:
        block = self._blocks.get(h)
        if block is None:
            block = np.random.default_rng([self.seed, 17, h]).integers(
                0, self.vocab_size, self.source.block_size)
            self._blocks[h] = block
        return block


def as_sessions(point: LoadPoint, spec: RequestSpec) -> LoadPoint:
    """A point of a multi-turn source, as sessions: the first whole sessions whose turns reach its
    request count (taken again from the first if it needs more than the source has), with the source's
    think time; a closed-loop point keeps its concurrency of sessions, an open-loop one its rate, now of
    sessions per second. Any other point is returned as it is."""
    if (spec.source is None or not spec.source.multi_turn or point.schedule is not None
            or point.sessions is not None or point.num_requests is None):
        return point
    turns = source_requests(spec).session_turns
    wanted = point.warmup_requests + point.num_requests
    sessions: list[int] = []
    while sum(sessions) < wanted:
        sessions.append(turns[len(sessions) % len(turns)])
    return dataclasses.replace(point, sessions=tuple(sessions), think_s=spec.source.think_s,
                               num_requests=sum(sessions) - point.warmup_requests)


def trace_point(times_s: np.ndarray, speed: float, requests: int | None = None, warmup: int = 0,
                max_s: float | None = None) -> LoadPoint:
    """An open-loop point replaying a trace's requests on their own timestamps (``times_s``, from the
    window's start), divided by ``speed``: the first ``warmup`` + ``requests`` of them (None: all).
    Its name is its mean rate. A replay runs whole (no stop rule); ``max_s`` ends its sends early."""
    times = times_s[: (warmup + requests) if requests else None]
    schedule = tuple(float(t) / speed for t in times)
    span = schedule[-1] - schedule[0]
    rate = len(schedule) / span if span > 0 else float(len(schedule))
    return LoadPoint(rate=float(f"{rate:.3g}"), arrival="trace", schedule=schedule,
                     num_requests=max(1, len(schedule) - warmup),
                     warmup_requests=min(warmup, len(schedule) - 1), duration_s=max_s)


def _fold(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    # a stand-in tokenizer's ids may exceed a small model's vocabulary: fold them in, keeping every
    # length and every shared prefix (equal ids stay equal)
    return ids % vocab_size if len(ids) and int(ids.max()) >= vocab_size else ids


@functools.lru_cache(maxsize=8)
def _requests(source: Source, seed: int, vocab_size: int) -> SourceRequests:
    if source.kind == "sharegpt":
        return _ShareGPT(source, seed, vocab_size)
    if source.kind == "shared-prefix":
        return SharedPrefixRequests(source, seed, vocab_size)
    return _Trace(source, seed, vocab_size)


def source_requests(spec: RequestSpec) -> SourceRequests:
    """The requests of ``spec.source`` (read once per process)."""
    assert spec.source is not None
    return _requests(spec.source, spec.seed, spec.vocab_size)
