"""The steady-state window of a load point, and how sure its throughput is.

One definition, used by every consumer of a point's numbers (the load generator's metrics, its stop
rule, the simulator's prediction in virtual time, and through the metrics the summary table, the
report, ``compare``, calibration and the search):

* **ramp**: from the point's first send until the offered load has held for one turnover. Closed
  loop: from the first instant ``C`` requests are in flight (the streams enter one by one, see
  :mod:`workloads.scheduler`) until ``C`` requests have ended since, so that every stream has, about
  once, finished a request and sent the next: the window opens with the send that replaced the last
  of those ``C``, and no earlier than the first measured (non-warm-up) send. Open loop: there is
  no ramp beyond the warm-up requests; the window opens at the first measured send.

  Why the turnover: the requests in flight when the load first holds all began on an idle engine (no
  queue, no prefill backlog), so for about one request duration the engine delivers more than it can
  keep up (a TP8 PP2 Llama-3.1-70B at 64 streams of 2,000/200 tokens, predicted: 2,197 tok/s in that
  first duration, about 1,580 from then on), and a short window that starts at once reads high. A
  point whose warm-up is one wave per stream (``workload.warmup_per_concurrency=1``) has had its
  turnover by its first measured send. The same rule holds for a measured point and a predicted one.

  A closed-loop point too short for it, one that would have fewer than ``C`` measured sends left in
  its window after the turnover (about two requests per stream or fewer), is read instead from the
  instant the load first held (or its first measured send, if later): a window of one or two requests
  would describe nothing, and the first wave, read high as it may be, is all such a point has. It says
  so (``window_turned`` = 0).
* **window**: from the end of the ramp until the offered load stops holding (with sessions, read
  "request" below as "session", from its first send to its last end). Closed loop: the end
  of the first request whose stream was not replaced (with S sends, every send after the first C
  replaced an ended request, in the order they ended, so it is the (S - C + 1)-th end; from then on
  fewer than C requests are in flight). Open loop: the point's last send.
* **drain**: from the window's end until the last request ends.

The window is closed at both ends (a token or a send at either bound is inside it); the ramp ends just
before it and the drain starts just after it.

Inside the window, throughput counts the output tokens *delivered* in it (each streamed chunk at its
arrival time) over its width, so a request that straddles a bound contributes the part it delivered
inside. Latency statistics come from the requests *sent* inside the window (they started while the
offered load held). A point too short to have a window (its ramp never ended before its drain began)
falls back to its whole measured span, and says so (``window_steady`` = 0).

The uncertainty of the window's throughput is a 95 % confidence interval from batch means: the window
is cut into equal batches, each batch's output rate is one sample, and Student's t over the batch
rates gives the half-width. A batch is at least half a mean request duration long: requests that run
together (a micro-batch, a wave of fixed-length requests) deliver in cycles about one duration long.
Batches much shorter than that would be positively correlated (a prefill-heavy stretch followed by
another), which makes an interval too narrow; half a cycle makes neighbouring batches, if anything,
anti-correlated, which only widens it. The window holds at most :data:`MAX_BATCHES` batches; fewer
than :data:`MIN_BATCHES` give no interval (NaN: the window is shorter than two request durations,
and its noise is not known).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vocab.load import LoadPoint
from vocab.records import RequestRecord

NAN = float("nan")
MAX_BATCHES = 10
MIN_BATCHES = 4


@dataclass(frozen=True)
class Window:
    """A point's phases on the records' clock. ``steady`` is False when the point had no window and
    ``start``/``end`` are its whole measured span instead; ``turned`` is False when a closed-loop window
    opened as the load first held, the point too short to wait for its turnover."""

    first_send: float
    start: float
    end: float
    last_end: float
    steady: bool
    turned: bool = True

    @property
    def width(self) -> float:
        return self.end - self.start

    def holds(self, t: float) -> bool:
        return self.start <= t <= self.end


def _in_flight_reaches(intervals: Sequence[tuple[float, float]], target: int) -> float | None:
    """The first instant ``target`` intervals overlap (ends sort before starts at the same instant)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    cur = 0
    for t, d in events:
        cur += d
        if cur >= target:
            return t
    return None


def _turnover_end(intervals: Sequence[tuple[float, float]], held: float, target: int) -> float | None:
    """The end of the ``target``-th interval to end after ``held`` (the load first held): one turnover
    of the ``target`` streams (None: fewer ended)."""
    after = sorted(e for _, e in intervals if e > held)
    return after[target - 1] if len(after) >= target else None


def load_intervals(records: Sequence[RequestRecord], point: LoadPoint) -> list[tuple[float, float]]:
    """What a closed loop keeps in flight, as (start, end) intervals of finished records: each request,
    or with sessions each session, from its first turn's send to its last turn's end (a session thinking
    between turns is still one of the C in flight)."""
    done = [r for r in records if r.send_time is not None and r.end_time is not None]
    if point.sessions is None:
        return [(r.send_time, r.end_time) for r in done]  # type: ignore[misc]
    starts = point.session_starts()
    spans: dict[int, tuple[float, float]] = {}
    for r in done:
        s = bisect.bisect_right(starts, r.index) - 1
        lo, hi = spans.get(s, (r.send_time, r.end_time))  # type: ignore[arg-type]
        spans[s] = (min(lo, r.send_time), max(hi, r.end_time))  # type: ignore[type-var]
    return list(spans.values())


def steady_window(records: Sequence[RequestRecord], point: LoadPoint) -> Window | None:
    """The window of ``point`` from its finished records (None: no measured request ended)."""
    done = [r for r in records if r.send_time is not None and r.end_time is not None]
    measured = [r for r in done if not r.warmup]
    if not measured:
        return None
    first_send = min(r.send_time for r in done)  # type: ignore[type-var]
    first_measured = min(r.send_time for r in measured)  # type: ignore[type-var]
    last_end = max(r.end_time for r in done)  # type: ignore[type-var]
    start: float | None = first_measured
    turned_over = True
    if point.concurrency is not None:
        target = point.streams
        assert target is not None
        intervals = load_intervals(done, point)
        reached = _in_flight_reaches(intervals, target)
        turned = None if reached is None else _turnover_end(intervals, reached, target)
        # the window opens with the send that replaced the turnover's last request: it opens on a send,
        # as the latency statistics count requests by their sends, and the tokens that request
        # delivered as it ended stay in the ramp
        opening = None if turned is None else min((r.send_time for r in done  # type: ignore[type-var]
                                                   if r.send_time >= turned), default=None)  # type: ignore[operator]
        # the first stream not replaced. Every send after the first C replaced an ended request (or
        # session), and a closed loop replaces them in the order they end: the first S - C ends (S
        # sends) were replaced and the next one was not
        ends = sorted(e for _, e in intervals)
        end = ends[min(len(ends) - 1, max(0, len(intervals) - target))]
        start = None if opening is None else max(opening, first_measured)
        if start is None or sum(1 for r in measured if start <= r.send_time <= end) < target:  # type: ignore[operator]
            # too few requests left after the turnover to describe the point (fewer than one per
            # stream: about two waves or less per stream): read it from when the load first held
            # (a point of one wave, no more requests than streams, has no window at all)
            turned_over = False
            start = None if reached is None or len(intervals) <= target else max(reached, first_measured)
    else:
        # the last arrival on the schedule (with sessions: the last session's first turn; its later
        # turns follow answers, not the schedule)
        end = max(r.send_time for r in done  # type: ignore[type-var]
                  if point.sessions is None or r.scheduled_time is not None)
    if start is None or not end > start:
        return Window(first_send, first_measured, max(r.end_time for r in measured),  # type: ignore[type-var]
                      last_end, steady=False, turned=False)
    return Window(first_send, start, end, last_end, steady=True, turned=turned_over)


@dataclass(frozen=True)
class Chunks:
    """Every streamed chunk of a point's successful requests as flat arrays, in record order, built once
    per point: each count over a span of time is then one numpy pass, not a Python loop over every
    token (a point of a thousand 256-token requests has a quarter of a million chunks)."""

    times: np.ndarray  # each chunk's arrival
    tokens: np.ndarray  # the output tokens it completed
    owner: np.ndarray  # the position of its request in ``outputs``
    outputs: np.ndarray  # each request's output tokens

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> Chunks:
        ok = [r for r in records if r.error is None]
        lengths = np.fromiter((len(r.chunk_times) for r in ok), dtype=np.int64, count=len(ok))
        n = int(lengths.sum())
        times = np.fromiter(itertools.chain.from_iterable(r.chunk_times for r in ok), dtype=float, count=n)
        tokens = np.fromiter(itertools.chain.from_iterable(r.chunk_tokens for r in ok), dtype=np.int64,
                             count=n)
        outputs = np.fromiter((r.output_tokens for r in ok), dtype=np.int64, count=len(ok))
        return cls(times, tokens, np.repeat(np.arange(len(ok)), lengths), outputs)

    def between(self, t0: float, t1: float, *, closed: bool = True) -> int:
        """Output tokens whose chunk arrived in ``[t0, t1]`` (``[t0, t1)`` when not ``closed``)."""
        t = self.times
        inside = (t >= t0) & ((t <= t1) if closed else (t < t1))
        return int(self.tokens[inside].sum())

    def delivered(self, window: Window) -> float:
        """Requests delivered in the window: each counts the share of its output tokens that arrived in
        it (a request wholly inside counts 1). Counting the requests that *ended* inside would be off by
        up to C at the window's edges: with requests in step, a window that opens with a wave of sends
        and closes at the first end of the last wave holds one wave of ends too few."""
        inside = (self.times >= window.start) & (self.times <= window.end)
        per_request = np.bincount(self.owner[inside], weights=self.tokens[inside],
                                  minlength=len(self.outputs))
        some = self.outputs > 0
        return float((per_request[some] / self.outputs[some]).sum())


def tokens_between(records: Sequence[RequestRecord], t0: float, t1: float, *, closed: bool = True) -> int:
    """Output tokens of successful requests whose chunk arrived in ``[t0, t1]`` (``[t0, t1)`` when not
    ``closed``)."""
    return Chunks.of(records).between(t0, t1, closed=closed)


def sent_in(records: Sequence[RequestRecord], window: Window) -> list[RequestRecord]:
    """Measured requests sent inside the window: the ones its latency statistics describe."""
    return [r for r in records if not r.warmup and r.send_time is not None and window.holds(r.send_time)]


@dataclass(frozen=True)
class RateInterval:
    """The window's mean output rate and the half-width of its confidence interval (NaN: fewer than
    :data:`MIN_BATCHES` batches), from ``batches`` batch means."""

    mean: float
    half_width: float
    batches: int

    @property
    def relative(self) -> float:
        return self.half_width / self.mean if self.mean > 0 and math.isfinite(self.half_width) else NAN


# Student's t, its 97.5 % quantile by degrees of freedom (1 to MAX_BATCHES - 1): a table, not scipy,
# because the stop rule asks on the load generator's event loop, where importing scipy.stats (about half
# a second) would stall every request in flight
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def _t_quantile(dof: int) -> float:
    return T975[dof]


def rate_interval(times: np.ndarray, tokens: np.ndarray, window: Window, floor_s: float) -> RateInterval:
    """Output rate over ``window`` from token arrival ``times`` (with their ``tokens``), cut into equal
    batches at least ``floor_s`` wide and at most :data:`MAX_BATCHES` of them."""
    width = window.width
    if not width > 0:
        return RateInterval(NAN, NAN, 0)
    batch = max(width / MAX_BATCHES, floor_s)
    n = max(1, min(MAX_BATCHES, int(width / batch + 1e-9)))
    edges = np.linspace(window.start, window.end, n + 1)
    counts, _ = np.histogram(times, bins=edges, weights=tokens)
    rates = counts / (width / n)
    mean = float(rates.mean())
    if n < MIN_BATCHES:
        return RateInterval(mean, NAN, n)
    return RateInterval(mean, _t_quantile(n - 1) * float(rates.std(ddof=1)) / math.sqrt(n), n)


def quantile_interval(values: np.ndarray, q: float) -> tuple[float, float]:
    """A distribution-free 95 % interval of the ``q`` quantile: the order statistics whose ranks bound
    a Binomial(n, q) count with 95 % probability. (NaN, NaN) when the upper rank lies beyond the
    largest sample (for the p99, fewer than about 400 samples): the interval is open above, so the
    percentile's noise is not known, and no difference is called real on it."""
    arr = np.sort(values)
    n = len(arr)
    lo = _binomial_quantile(0.025, n, q)
    hi = _binomial_quantile(0.975, n, q) + 1
    if hi > n:
        return NAN, NAN
    return float(arr[max(0, lo - 1)]), float(arr[hi - 1])


def _binomial_quantile(p: float, n: int, q: float) -> int:
    """The smallest k with P(Binomial(n, q) <= k) >= p: ``scipy.stats.binom.ppf``'s answer (the same on
    every n to 3,000 and q from 0.25 to 0.999 tried), from ``scipy.special``'s binomial functions, the
    same inverse scipy.stats starts from. Importing scipy.stats costs about 0.65 s of CPU, in every
    process that summarizes a point (each trial, each Ray worker); scipy.special about 0.2 s."""
    from scipy.special import bdtr, bdtrik  # imported late: scipy is large

    k = math.ceil(bdtrik(p, n, q))
    below = max(k - 1, 0)
    return below if bdtr(below, n, q) >= p else k


def relative_half_width(value: float, lo: float, hi: float) -> float:
    """How wide an interval ``[lo, hi]`` around ``value`` is, relative to it: its larger side (NaN: not
    known, or a value of 0)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or not value > 0:
        return NAN
    return max(value - lo, hi - value) / value


def p99_relative(values: np.ndarray) -> float:
    """The relative half-width of the p99's 95 % interval (the larger side; NaN: not known yet)."""
    if len(values) == 0:
        return NAN
    return relative_half_width(float(np.percentile(values, 99)), *quantile_interval(values, 0.99))


def targets_met(metrics: Mapping[str, float], point: LoadPoint) -> bool:
    """Whether a point's summary (``workloads.metrics.summarize``) meets the stop rule's targets: its
    throughput's interval within ``point.ci_target``, and with ``point.latency_ci_target`` its TTFT and
    ITL p99s' within that (an interval not known is not)."""
    if not metrics.get("output_tok_s_ci95_rel", NAN) <= (point.ci_target or 0.0):
        return False
    target = point.latency_ci_target
    return target is None or all(
        relative_half_width(metrics.get(name, NAN), metrics.get(f"{name}_ci95_lo", NAN),
                            metrics.get(f"{name}_ci95_hi", NAN)) <= target
        for name in ("ttft_p99_ms", "itl_p99_ms"))


def inter_token_ms(chunks: Chunks) -> tuple[np.ndarray, np.ndarray]:
    """The chunks' inter-token latencies in ms: the gaps between consecutive chunks of one request that
    completed tokens, and each gap shared by the tokens of the later chunk (one value per token: the
    point's ITL)."""
    some = chunks.tokens > 0
    times, tokens, owner = chunks.times[some], chunks.tokens[some], chunks.owner[some]
    follows = owner[1:] == owner[:-1]
    gaps = (times[1:] - times[:-1])[follows] * 1000.0
    counts = tokens[1:][follows]
    return gaps, np.repeat(gaps / counts, counts)


def batch_floor_s(durations: Sequence[float]) -> float:
    """The shortest batch worth a sample: half a mean request duration (0 without any)."""
    return 0.5 * float(np.mean(durations)) if len(durations) else 0.0


def output_rate_interval(records: Sequence[RequestRecord], window: Window,
                         chunks: Chunks | None = None) -> RateInterval:
    """The window's output tokens per second with its batch-means confidence interval (``chunks``: the
    records' chunks, where the caller has them already)."""
    ok = [r for r in records if r.error is None]
    chunks = chunks if chunks is not None else Chunks.of(ok)
    durations = [r.end_time - r.send_time for r in sent_in(ok, window)  # type: ignore[operator]
                 if r.end_time is not None]
    return rate_interval(chunks.times, chunks.tokens.astype(float), window, batch_floor_s(durations))


class StabilityTracker:
    """The stop rule, asked while a point runs (live on the load generator's loop, or in virtual time):
    is the window's throughput known to within ``target`` (relative half-width of its 95 % interval)?

    It is told of every request as it is sent (:meth:`sent`) and as it ends (:meth:`ended`). Only
    ended requests' tokens are counted, so the window is judged up to the *settled horizon*: the
    earliest send among the requests still in flight (every token before it has been counted). The
    window must hold at least ``C`` ended requests (each stream replaced about once) and
    :data:`MIN_BATCHES` batches. Each call costs one pass over the point's token arrival times in
    numpy (kept as arrays as requests end), nothing per token in Python."""

    def __init__(self, point: LoadPoint, target: float, min_durations: float = 0.0) -> None:
        self.point = point
        self.target = target
        # the window must span at least this many mean request durations (0: no floor)
        self.min_durations = min_durations
        self._in_flight: dict[int, float] = {}  # request index -> send time
        self._events: list[tuple[float, int]] = []  # (time, +1 send / -1 end), in arrival order
        self._first_measured: float | None = None
        self._held: float | None = None  # the load first held (C in flight)
        self._ended_since_held = 0
        self._turned = False  # C requests ended since it held
        self._ramp_end: float | None = None  # the send after that turnover (module docstring)
        self._count = 0
        self._times: list[np.ndarray] = []
        self._tokens: list[np.ndarray] = []
        self._sends: list[float] = []  # of ended measured requests
        self._durations: list[float] = []
        # with a latency target: each ended measured request's TTFT and ITL (ms), beside its send
        self._ttft: list[float] = []
        self._itl: list[np.ndarray] = []
        self._target_c = point.streams
        self._starts = set(point.session_starts()) if point.sessions is not None else None

    def sent(self, index: int, t: float, warmup: bool) -> None:
        self._in_flight[index] = t
        if not warmup and self._first_measured is None:
            self._first_measured = t
        # the load held: C requests in flight, or with sessions C sessions begun (a session thinking
        # between turns has nothing in flight and is still one of the C)
        if self._starts is None or index in self._starts:
            self._count += 1
        if self._target_c is not None and self._held is None and self._count >= self._target_c:
            self._held = t
        if self._turned and self._ramp_end is None:
            self._ramp_end = t

    def ended(self, rec: RequestRecord) -> None:
        self._in_flight.pop(rec.index, None)
        if self._starts is None or rec.index + 1 in self._starts:
            self._count -= 1
            if self._held is not None and not self._turned and rec.end_time is not None:
                self._ended_since_held += 1
                if self._ended_since_held >= (self._target_c or 1):
                    self._turned = True  # the next send opens the window
        if rec.error is not None or rec.send_time is None or rec.end_time is None:
            return
        self._times.append(np.asarray(rec.chunk_times, dtype=float))
        self._tokens.append(np.asarray(rec.chunk_tokens, dtype=float))
        if not rec.warmup:
            self._sends.append(rec.send_time)
            self._durations.append(rec.end_time - rec.send_time)
            if self.point.latency_ci_target is not None:
                first = rec.first_token_time
                self._ttft.append(NAN if first is None else (first - rec.send_time) * 1000.0)
                self._itl.append(inter_token_ms(Chunks.of([rec]))[1])

    def stable(self, now: float) -> bool:
        if self._first_measured is None:
            return False
        start = self._first_measured
        if self.point.concurrency is not None:
            if self._ramp_end is None:
                return False
            start = max(start, self._ramp_end)
        horizon = min([now, *self._in_flight.values()])
        if not horizon > start:
            return False
        window = Window(start, start, horizon, horizon, steady=True)
        sends = np.asarray(self._sends)
        inside = (sends >= start) & (sends < horizon)
        durations = np.asarray(self._durations)[inside]
        if int(inside.sum()) < (self.point.concurrency or 1):
            return False
        floor = batch_floor_s(durations)
        if horizon - start < self.min_durations * 2 * floor:  # floor: half a mean duration
            return False
        times = np.concatenate(self._times) if self._times else np.empty(0)
        tokens = np.concatenate(self._tokens) if self._tokens else np.empty(0)
        if not rate_interval(times, tokens, window, floor).relative <= self.target:
            return False
        return self._latency_known(np.flatnonzero(inside))

    def _latency_known(self, inside: np.ndarray) -> bool:
        """With a latency target: the TTFT and ITL p99 of the window's ended requests are known to it
        (an interval not known yet, too few samples for the p99, is not)."""
        target = self.point.latency_ci_target
        if target is None:
            return True
        ttft = np.asarray(self._ttft)[inside]
        itl = [self._itl[i] for i in inside]
        itl_all = np.concatenate(itl) if itl else np.empty(0)
        return all(p99_relative(v[np.isfinite(v)]) <= target for v in (ttft, itl_all))
