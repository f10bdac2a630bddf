"""Per-point metrics from request records, and the client's self-check.

Latencies are computed over measured (non-warmup), successful requests only, so failures never
pollute TTFT/ITL (guidellm#444). Definitions (all latencies in ms):

* TTFT: send -> arrival of the first chunk that carried >= 1 output token.
* ITL (``itl_*``), per token, SGLang ``bench_serving`` native convention: between consecutive
  token-carrying chunks, a chunk with k tokens after a gap g contributes k samples of g/k.
  Tokens in the first chunk produce no ITL sample (they are covered by TTFT).
* Per-chunk ITL (``itl_chunk_*``): one sample g per gap between token-carrying chunks (the
  vLLM / bench_serving OpenAI-backend convention).
* TPOT: per request (e2e - ttft) / (output_tokens - 1), requests with >= 2 output tokens.
* Per-chunk TPOT (``tpot_chunk_*``): per request (e2e - ttft) / (token-carrying chunks - 1), requests
  with >= 2 such chunks: the time per chunk a client waits. Equal to TPOT when every chunk carries one
  token; with speculative decoding each chunk is one verify's accepted tokens, and the two differ by
  the accept length.
* E2E: send -> end of stream ([DONE]).

Latency statistics are NaN (never 0) when no sample exists.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from vocab.load import LoadPoint
from vocab.records import ERROR_KINDS, PD_TTFT_PARTS, RequestRecord
from vocab.telemetry import pd_ttft_part

from .length_classes import class_metrics
from .prefix_reuse import achieved_reuse
from .window import (
    Chunks,
    Window,
    inter_token_ms,
    load_intervals,
    output_rate_interval,
    quantile_interval,
    sent_in,
    steady_window,
)

NAN = float("nan")
STATS: tuple[str, ...] = ("mean", "p50", "p90", "p95", "p99", "max")
LATENCIES: tuple[str, ...] = ("ttft", "itl", "itl_chunk", "tpot", "tpot_chunk", "e2e")

DEFAULT_LAG_THRESHOLD_MS = 20.0
CONCURRENCY_TOLERANCE = 0.95  # closed loop: achieved >= 95 % of the target
RATE_TOLERANCE = 0.01  # open loop: achieved within 1 % of the schedule


@dataclass(frozen=True)
class SLO:
    """Latency bounds a request must meet to count towards goodput (None: no bound).

    ``ttft_ms`` and ``e2e_ms`` bound the request's own TTFT and E2E; ``tpot_ms`` bounds its TPOT
    (a request with a single output token has no TPOT and passes that bound), as vLLM's
    ``--goodput`` does. A failed request never meets the SLO.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ValueError(f"SLO {name} must be a positive number of ms")
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("an SLO needs at least one of ttft_ms, tpot_ms, e2e_ms")

    def met_by(self, r: RequestRecord) -> bool:
        if r.error is not None or r.send_time is None or r.end_time is None:
            return False
        e2e = (r.end_time - r.send_time) * 1000.0
        if self.e2e_ms is not None and e2e > self.e2e_ms:
            return False
        if r.first_token_time is None:
            return self.ttft_ms is None and self.tpot_ms is None
        ttft = (r.first_token_time - r.send_time) * 1000.0
        if self.ttft_ms is not None and ttft > self.ttft_ms:
            return False
        tpot_bad = self.tpot_ms is not None and r.output_tokens > 1
        return not (tpot_bad and (e2e - ttft) / (r.output_tokens - 1) > self.tpot_ms)  # type: ignore[operator]


# the latencies whose p99 carries a 95 % interval (the summary table's columns)
P99_INTERVALS: tuple[str, ...] = ("ttft", "itl")


def _stats(name: str, values: Sequence[float]) -> dict[str, float]:
    if len(values) == 0:
        out = {f"{name}_{s}_ms": NAN for s in STATS}
        if name in P99_INTERVALS:
            out |= {f"{name}_p99_ms_ci95_lo": NAN, f"{name}_p99_ms_ci95_hi": NAN}
        return out
    arr = np.asarray(values, dtype=float)
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99])  # linear, as bench_serving
    extra = {}
    if name in P99_INTERVALS:
        lo, hi = quantile_interval(arr, 0.99)
        extra = {f"{name}_p99_ms_ci95_lo": min(lo, float(p99)) if lo == lo else NAN,
                 f"{name}_p99_ms_ci95_hi": max(hi, float(p99)) if hi == hi else NAN}
    return extra | {
        f"{name}_mean_ms": float(arr.mean()),
        f"{name}_p50_ms": float(p50),
        f"{name}_p90_ms": float(p90),
        f"{name}_p95_ms": float(p95),
        f"{name}_p99_ms": float(p99),
        f"{name}_max_ms": float(arr.max()),
    }


def latency_samples(records: Iterable[RequestRecord]) -> dict[str, np.ndarray]:
    """Raw latency samples in ms, per metric, from successful records (warmup not filtered here)."""
    done = [r for r in records if r.error is None and r.send_time is not None and r.end_time is not None]
    send = np.fromiter((r.send_time for r in done), dtype=float, count=len(done))
    end = np.fromiter((r.end_time for r in done), dtype=float, count=len(done))
    e2e = (end - send) * 1000.0
    # finished without a single output token: no TTFT/ITL/TPOT to speak of
    started = [i for i, r in enumerate(done) if r.first_token_time is not None]
    first = np.fromiter((done[i].first_token_time for i in started), dtype=float, count=len(started))
    ttft = (first - send[started]) * 1000.0
    outputs = np.fromiter((done[i].output_tokens for i in started), dtype=float, count=len(started))
    several = outputs > 1
    tpot = (e2e[started][several] - ttft[several]) / (outputs[several] - 1)
    chunks = Chunks.of([done[i] for i in started])
    gaps, itl = inter_token_ms(chunks)
    # chunks that completed tokens, per request
    per_request = np.bincount(chunks.owner[chunks.tokens > 0], minlength=len(started)).astype(float)
    many = per_request > 1
    tpot_chunk = (e2e[started][many] - ttft[many]) / (per_request[many] - 1)
    return {"e2e": e2e, "ttft": ttft, "tpot": tpot, "tpot_chunk": tpot_chunk, "itl_chunk": gaps, "itl": itl}


def pd_ttft_parts(records: Iterable[RequestRecord]) -> dict[str, float]:
    """A disaggregated deployment's TTFT by its parts (``PD_TTFT_PARTS``): the mean of each over the
    successful requests whose server reported them, ``pd_ttft_<part>_ms``; {} when none did."""
    parts = [r.pd_parts_s for r in records if r.error is None and r.pd_parts_s is not None]
    if not parts:
        return {}
    means = np.asarray(parts, dtype=float).mean(axis=0) * 1000.0
    return {pd_ttft_part(name): float(v) for name, v in zip(PD_TTFT_PARTS, means, strict=True)}


def ttft_split(records: Iterable[RequestRecord]) -> dict[str, float]:
    """Where the TTFT of successful requests went, from the server's own per-request report of their
    wait in its queue (``RequestRecord.server_queue_s``); {} when the server reported none.

    * ``server_queue_{mean,p50,p99}_ms``: the wait in the queue, before the request's first forward;
    * ``ttft_p99_queue_ms``: the queueing part of the TTFT p99: the p99 times the share of queueing in
      the TTFT of the requests at or above it (the tail the p99 describes), so "TTFT p99 5.8 s, of
      which 5.1 s queueing" reads off two metrics;
    * ``ttft_queue_share``: total wait / total TTFT (the rest is prefill compute, chunk turns and
      transport).
    """
    pairs = [((r.first_token_time - r.send_time) * 1000.0, r.server_queue_s * 1000.0) for r in records
             if r.error is None and r.server_queue_s is not None and r.first_token_time is not None
             and r.send_time is not None]
    if not pairs:
        return {}
    ttft = np.asarray([p[0] for p in pairs])
    queue = np.asarray([p[1] for p in pairs])
    p50, p99 = np.percentile(queue, [50, 99])
    ttft_p99 = np.percentile(ttft, 99)
    tail = ttft >= ttft_p99
    tail_share = min(1.0, queue[tail].sum() / ttft[tail].sum()) if ttft[tail].sum() > 0 else NAN
    return {"server_queue_mean_ms": float(queue.mean()), "server_queue_p50_ms": float(p50),
            "server_queue_p99_ms": float(p99), "ttft_p99_queue_ms": float(ttft_p99 * tail_share),
            "ttft_queue_share": float(queue.sum() / ttft.sum()) if ttft.sum() > 0 else NAN}


def _time_weighted_in_flight(intervals: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Mean number of intervals covering [t0, t1] (integral of the in-flight count / width)."""
    width = t1 - t0
    if width <= 0:
        return NAN
    covered = sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in intervals)
    return covered / width


def _peak_in_flight(intervals: list[tuple[float, float]]) -> int:
    # Ends sort before starts at the same instant: a closed-loop worker's next request is not
    # counted as overlapping the one it replaces.
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def _window_metrics(recs: list[RequestRecord], in_window: list[RequestRecord], window: Window | None,
                    slo: SLO | None) -> dict[str, float]:
    """Throughput, goodput and the phases of the point (ramp, window, drain), over the window."""
    keys = ["duration_s", "window_s", "ramp_s", "drain_s", "window_steady", "window_turned", "ramp_requests",
            "window_requests", "drain_requests", "ramp_output_tok_s", "drain_output_tok_s",
            "output_tokens", "input_tokens", "output_tok_s", "input_tok_s", "total_tok_s", "request_s",
            "output_tok_s_ci95", "output_tok_s_ci95_rel", "window_batches"]
    if slo is not None:
        keys += ["goodput_req_s", "goodput_tok_s", "slo_attainment"]
    if window is None:
        return dict.fromkeys(keys, NAN) | {"output_tokens": 0.0, "input_tokens": 0.0}
    width = window.width
    first_measured = min(r.send_time for r in recs if not r.warmup)  # type: ignore[type-var]
    ramp = window.start - window.first_send
    drain = window.last_end - window.end
    chunks = Chunks.of(recs)
    out_tok = chunks.between(window.start, window.end)
    # a request's prompt counts where its prefill finished (its first token)
    in_tok = sum(r.input_tokens for r in recs if r.error is None and r.first_token_time is not None
                 and window.holds(r.first_token_time))
    delivered = chunks.delivered(window)
    interval = output_rate_interval(recs, window, chunks)
    m = {
        "duration_s": window.last_end - first_measured,
        "window_s": width,
        "ramp_s": ramp,
        "drain_s": drain,
        "window_steady": 1.0 if window.steady else 0.0,
        "window_turned": 1.0 if window.turned else 0.0,
        "ramp_requests": float(sum(1 for r in recs if r.send_time < window.start)),  # type: ignore[operator]
        "window_requests": float(len(in_window)),
        "drain_requests": float(sum(1 for r in recs if r.end_time > window.end)),  # type: ignore[operator]
        "ramp_output_tok_s": chunks.between(window.first_send, window.start, closed=False) / ramp
        if ramp > 0 else NAN,
        "drain_output_tok_s": (chunks.between(window.end, window.last_end)
                               - chunks.between(window.end, window.end)) / drain if drain > 0 else NAN,
        "output_tokens": float(out_tok),
        "input_tokens": float(in_tok),
        "output_tok_s": out_tok / width if width > 0 else NAN,
        "input_tok_s": in_tok / width if width > 0 else NAN,
        "total_tok_s": (in_tok + out_tok) / width if width > 0 else NAN,
        "request_s": delivered / width if width > 0 else NAN,
        "output_tok_s_ci95": interval.half_width,
        "output_tok_s_ci95_rel": interval.relative,
        "window_batches": float(interval.batches),
    }
    if slo is not None:
        # the share of the window's requests that met every bound (failures count against it), applied
        # to the window's rates
        good = [r for r in in_window if slo.met_by(r)]
        all_tokens = sum(r.output_tokens for r in in_window if r.error is None)
        m["slo_attainment"] = len(good) / len(in_window) if in_window else NAN
        m["goodput_req_s"] = m["request_s"] * m["slo_attainment"] if in_window else NAN
        m["goodput_tok_s"] = (m["output_tok_s"] * sum(r.output_tokens for r in good) / all_tokens
                              if all_tokens else (0.0 if in_window else NAN))
    return m


def summarize(
    records: Iterable[RequestRecord | None],
    point: LoadPoint,
    *,
    lag_ms: Sequence[float] = (),
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    slo: SLO | None = None,
) -> dict[str, float]:
    """All metrics of one point (see the module docstring and docs/loadgen.md).

    With ``slo``, adds ``goodput_req_s`` and ``goodput_tok_s`` (measured requests that succeeded
    and met every bound, and their output tokens, over ``duration_s``) and ``slo_attainment``
    (their fraction of all measured requests, failures included).
    """
    recs = [r for r in records if r is not None and r.send_time is not None and r.end_time is not None]
    measured = [r for r in recs if not r.warmup]
    ok_all = [r for r in measured if r.error is None]
    window = steady_window(recs, point)
    # latencies describe the requests sent while the offered load held (docs/loadgen.md, "Window")
    in_window = sent_in(recs, window) if window is not None else []
    ok = [r for r in in_window if r.error is None]
    m: dict[str, float] = {}

    samples = latency_samples(ok)
    for name in LATENCIES:
        m.update(_stats(name, samples[name]))
    m.update(ttft_split(ok))
    m.update(pd_ttft_parts(ok))
    m.update(class_metrics(ok))  # per prompt-length class, where lengths vary

    n_measured = len(measured)
    m["num_requests"] = float(n_measured)
    m["completed"] = float(len(ok_all))
    m["output_tokens_total"] = float(sum(r.output_tokens for r in ok_all))  # ramp and drain too
    m["errors"] = float(n_measured - len(ok_all))
    for kind in ERROR_KINDS:
        m[f"errors_{kind}"] = float(sum(1 for r in measured if r.error_kind == kind))
    m.update(_window_metrics(recs, in_window, window, slo))
    m.update(achieved_reuse(measured))  # what the server's prefix cache hit, as it reported

    # In flight counts every request (warmup included: it loads the server just the same); with
    # sessions, every session from its first send to its last end.
    intervals = load_intervals(recs, point) if not point.open_loop else [(r.send_time, r.end_time)
                                                                          for r in recs]
    if window is not None and window.width > 0:
        m["achieved_concurrency"] = _time_weighted_in_flight(intervals, window.start, window.end)  # type: ignore[arg-type]
    else:
        m["achieved_concurrency"] = NAN
    m["peak_concurrency"] = float(_peak_in_flight(intervals)) if intervals else NAN  # type: ignore[arg-type]

    if point.open_loop:
        assert point.rate is not None
        m["offered_rate"] = float(point.rate)
        # with sessions the schedule is of sessions: their first turns (the only scheduled sends)
        sends = sorted(r.send_time for r in measured  # type: ignore[type-var]
                       if point.sessions is None or r.scheduled_time is not None)
        sched = sorted(r.scheduled_time for r in measured if r.scheduled_time is not None)
        n = len(sends)
        m["achieved_rate"] = (n - 1) / (sends[-1] - sends[0]) if n > 1 and sends[-1] > sends[0] else NAN
        # The rate the schedule itself asked for over these requests: a Poisson realisation of
        # 100 arrivals is ~10 % off its nominal rate, so the client is judged against this.
        m["scheduled_rate"] = (
            (len(sched) - 1) / (sched[-1] - sched[0]) if len(sched) > 1 and sched[-1] > sched[0] else NAN
        )
        late = [
            (r.send_time - r.scheduled_time) * 1000.0  # type: ignore[operator]
            for r in measured
            if r.scheduled_time is not None
        ]
        m["schedule_lag_p99_ms"] = float(np.percentile(late, 99)) if late else NAN
        m["schedule_lag_max_ms"] = float(max(late)) if late else NAN
    else:
        m["offered_concurrency"] = float(point.concurrency or 0)

    m["client_lag_p99_ms"] = float(np.percentile(lag_ms, 99)) if len(lag_ms) else NAN
    m["client_lag_max_ms"] = float(max(lag_ms)) if len(lag_ms) else NAN

    m["valid"] = 0.0 if validity_reasons(m, point, lag_threshold_ms=lag_threshold_ms) else 1.0
    return m


def validity_reasons(
    metrics: dict[str, float], point: LoadPoint, *, lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS
) -> list[str]:
    """One line per reason the point does not measure the server at the load it claims."""
    reasons: list[str] = []
    n = metrics.get("num_requests", 0.0)
    errors = metrics.get("errors", 0.0)
    if n == 0:
        reasons.append("no measured request finished")
    elif errors > n / 2:
        kinds = {k: metrics.get(f"errors_{k}", 0.0) for k in ERROR_KINDS}
        top = max(kinds, key=lambda k: kinds[k])
        reasons.append(f"{errors:.0f} of {n:.0f} requests failed (mostly {top})")

    if point.concurrency is not None:
        # Fewer requests than workers can never reach C; judge against what was possible.
        target = min(point.concurrency, point.total_requests)
        if point.num_requests is None:
            target = point.concurrency
        if point.sessions is not None:
            target = point.streams or target
        achieved = metrics.get("achieved_concurrency", NAN)
        unit = "sessions" if point.sessions is not None else "requests"
        if math.isfinite(achieved) and achieved < CONCURRENCY_TOLERANCE * target:
            reasons.append(
                f"client kept {achieved:.2f} {unit} in flight, below 95 % of concurrency {target}"
            )
    else:
        achieved = metrics.get("achieved_rate", NAN)
        scheduled = metrics.get("scheduled_rate", NAN)
        target_rate = scheduled if math.isfinite(scheduled) else float(point.rate or NAN)
        capped = ""
        if point.max_concurrency and metrics.get("peak_concurrency", 0.0) >= point.max_concurrency:
            capped = f" (max_concurrency={point.max_concurrency} was reached: the cap held requests back)"
        if math.isfinite(achieved) and abs(achieved / target_rate - 1.0) > RATE_TOLERANCE:
            reasons.append(
                f"achieved {achieved:.3g} req/s vs {target_rate:.3g} scheduled "
                f"({(achieved / target_rate - 1.0) * 100:+.1f} %){capped}"
            )
        # The rate can match end to end while sends in between slip; late sends change the load too.
        late = metrics.get("schedule_lag_p99_ms", NAN)
        if math.isfinite(late) and late > lag_threshold_ms:
            reasons.append(
                f"sends were late: p99 {late:.1f} ms behind schedule > {lag_threshold_ms:g} ms{capped}"
            )

    lag = metrics.get("client_lag_p99_ms", NAN)
    if math.isfinite(lag) and lag > lag_threshold_ms:
        reasons.append(
            f"client event-loop lag p99 {lag:.1f} ms > {lag_threshold_ms:g} ms: "
            "the load generator was CPU-bound"
        )
    return reasons
