"""Per-point metrics and the client's self-check (``summarize``, ``validity_reasons``), from
hand-built records: every timestamp and every lag sample is constructed, so each verdict is
deterministic (no server, no clock, no dependence on how busy the machine is)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vocab.metric_keys import CONTRACT_METRICS
from workloads import SLO, LoadPoint, RequestRecord, summarize, validity_reasons
from workloads.metrics import DEFAULT_LAG_THRESHOLD_MS

# ---------------------------------------------------------------------------------------------
# metrics from a hand-built fixture (dyadic times, so every value below is exact)

B = 1024.0


def _fixture() -> list[RequestRecord]:
    # the opening wave: both streams in flight from B - 2, both ended by B - 1.25 (one turnover), so
    # the window can open at the first measured send, B
    opening = [RequestRecord("c2", 10 + k, warmup=True, send_time=B - 2.0, first_token_time=B - 1.75,
                             end_time=B - 1.5 + 0.25 * k, chunk_times=[B - 1.75], chunk_tokens=[1],
                             output_tokens=1) for k in range(2)]
    warm = RequestRecord(
        "c2",
        0,
        warmup=True,
        send_time=B - 1.0,
        first_token_time=B - 0.5,
        end_time=B + 0.25,
        chunk_times=[B - 0.5],
        chunk_tokens=[1],
        output_tokens=1,
    )
    r1 = RequestRecord(
        "c2",
        1,
        send_time=B,
        first_token_time=B + 0.125,
        end_time=B + 1.0,
        chunk_times=[B + 0.125, B + 0.375, B + 0.75, B + 0.875],
        chunk_tokens=[2, 1, 3, 0],
        input_tokens=10,
        output_tokens=6,
    )
    failed = RequestRecord(
        "c2",
        2,
        send_time=B + 0.25,
        end_time=B + 0.5,
        error="HTTP 500: x",
        error_kind="http_5xx",
        http_status=500,
    )
    r2 = RequestRecord(
        "c2",
        3,
        send_time=B + 0.5,
        first_token_time=B + 0.75,
        end_time=B + 1.0,
        chunk_times=[B + 0.75, B + 1.0],
        chunk_tokens=[1, 1],
        input_tokens=10,
        output_tokens=2,
    )
    return [*opening, warm, r1, failed, r2]


def test_itl_tpot_ttft_e2e_match_hand_computed_values() -> None:
    m = summarize(_fixture(), LoadPoint(num_requests=3, concurrency=2, warmup_requests=3), lag_ms=[1.0] * 10)
    # TTFT: 125 and 250 ms (the warmup request's 500 ms is excluded).
    assert (m["ttft_mean_ms"], m["ttft_p50_ms"], m["ttft_max_ms"]) == (187.5, 187.5, 250.0)
    # Per-token ITL: r1 gaps 250 ms (1 token) and 375 ms (3 tokens -> 3 x 125); r2 one gap of 250.
    # The 2 tokens of r1's first chunk give no ITL sample; the 0-token chunk is ignored.
    assert m["itl_mean_ms"] == (250 + 125 * 3 + 250) / 5 == 175.0
    assert (m["itl_p50_ms"], m["itl_p90_ms"], m["itl_max_ms"]) == (125.0, 250.0, 250.0)
    # Per-chunk ITL: 250, 375, 250.
    assert (m["itl_chunk_p50_ms"], m["itl_chunk_max_ms"]) == (250.0, 375.0)
    assert m["itl_chunk_mean_ms"] == pytest.approx(875 / 3, rel=1e-15)
    # TPOT: (1000 - 125) / (6 - 1) = 175 and (500 - 250) / 1 = 250.
    assert (m["tpot_mean_ms"], m["tpot_p50_ms"], m["tpot_max_ms"]) == (212.5, 212.5, 250.0)
    # TPOT per chunk: r1's 3 token-carrying chunks, (1000 - 125) / 2 = 437.5; r2's 2, 250 / 1 = 250.
    assert (m["tpot_chunk_mean_ms"], m["tpot_chunk_max_ms"]) == (343.75, 437.5)
    assert (m["e2e_mean_ms"], m["e2e_max_ms"]) == (750.0, 1000.0)
    # The window: from B (the load turned over by B - 1.25; B is the first measured send) to the first
    # end of a stream that was not replaced (6 sends, C = 2: the fifth end, B + 1). Throughput counts
    # what was delivered in it: 8 output tokens, 20 prompt tokens whose prefill ended in it, 2 requests
    # (each successful one counts the share of its tokens that arrived in it: r1 and r2 whole, the
    # warm-up requests none).
    assert (m["window_s"], m["ramp_s"], m["drain_s"], m["window_steady"]) == (1.0, 2.0, 0.0, 1.0)
    assert (m["duration_s"], m["output_tok_s"], m["input_tok_s"], m["request_s"]) == (1.0, 8.0, 20.0, 2.0)
    assert m["total_tok_s"] == 28.0
    assert (m["ramp_requests"], m["window_requests"], m["drain_requests"]) == (3, 3, 0)
    assert (m["completed"], m["errors"], m["errors_http_5xx"], m["errors_timeout"]) == (2, 1, 1, 0)
    # In flight over [B, B + 1]: warmup 0.25 s + r1 1 s + failed 0.25 s + r2 0.5 s = 2.0 s -> 2.0.
    assert m["achieved_concurrency"] == 2.0
    assert m["peak_concurrency"] == 2.0
    assert m["client_lag_max_ms"] == 1.0
    assert m["valid"] == 1.0


def test_contract_metric_names_exist() -> None:
    m = summarize(_fixture(), LoadPoint(num_requests=3, concurrency=2, warmup_requests=3))
    for key in CONTRACT_METRICS:
        assert key in m
    assert all(isinstance(v, float) for v in m.values())


def test_nothing_completed_gives_nan_latencies_and_invalid() -> None:
    recs = [
        RequestRecord("c1", i, send_time=B + i, end_time=B + i + 0.5, error="x", error_kind="connect")
        for i in range(4)
    ]
    point = LoadPoint(num_requests=4, concurrency=1)
    m = summarize(recs, point)
    for name in ("ttft", "itl", "itl_chunk", "tpot", "tpot_chunk", "e2e"):
        assert math.isnan(m[f"{name}_p50_ms"]) and math.isnan(m[f"{name}_mean_ms"])
    assert (m["completed"], m["errors"], m["errors_connect"], m["output_tok_s"]) == (0, 4, 4, 0.0)
    assert m["valid"] == 0.0
    assert any("4 of 4 requests failed (mostly connect)" in r for r in validity_reasons(m, point))


def test_validity_flags_low_concurrency_lag_and_rate() -> None:
    recs = _fixture()
    m = summarize(recs, LoadPoint(num_requests=3, concurrency=4, warmup_requests=1), lag_ms=[30.0] * 100)
    reasons = validity_reasons(m, LoadPoint(num_requests=3, concurrency=4, warmup_requests=1))
    assert m["valid"] == 0.0 and len(reasons) == 2
    assert "below 95 % of concurrency 4" in reasons[0] and "lag p99 30.0 ms" in reasons[1]
    # A higher lag threshold accepts the same lag.
    m = summarize(
        recs, LoadPoint(num_requests=3, concurrency=2, warmup_requests=3), lag_ms=[30.0], lag_threshold_ms=50
    )
    assert m["valid"] == 1.0

    # Open loop: 11 sends scheduled 0.1 s apart; sent on time -> valid, sent 2 % slow -> invalid.
    point = LoadPoint(num_requests=11, rate=10.0, arrival="constant")

    def open_records(stretch: float) -> list[RequestRecord]:
        return [
            RequestRecord(
                "r10",
                i,
                scheduled_time=B + i / 10,
                send_time=B + stretch * i / 10,
                end_time=B + stretch * i / 10 + 0.05,
            )
            for i in range(11)
        ]

    ok = summarize(open_records(1.0), point)
    assert ok["achieved_rate"] == pytest.approx(10.0) and ok["scheduled_rate"] == pytest.approx(10.0)
    assert ok["offered_rate"] == 10.0 and ok["valid"] == 1.0
    slow = summarize(open_records(1.02), point)
    assert slow["valid"] == 0.0
    assert "scheduled" in validity_reasons(slow, point)[0]
    assert slow["schedule_lag_max_ms"] == pytest.approx(20.0)


def test_uniformly_late_sends_are_invalid_even_at_the_right_rate() -> None:
    point = LoadPoint(num_requests=11, rate=10.0, arrival="constant")
    recs = [
        RequestRecord(
            "r10", i, scheduled_time=B + i / 10, send_time=B + i / 10 + 0.03, end_time=B + i / 10 + 0.1
        )
        for i in range(11)
    ]
    m = summarize(recs, point)
    assert m["achieved_rate"] == pytest.approx(10.0) and m["valid"] == 0.0
    assert validity_reasons(m, point)[0].startswith("sends were late: p99 30.0 ms")


# ---------------------------------------------------------------------------------------------
# goodput


def test_goodput_against_ttft_and_tpot_slos() -> None:
    b = 1000.0

    def rec(i: int, ttft: float, e2e: float, n: int, error: str | None = None) -> RequestRecord:
        return RequestRecord(
            point="c2",
            index=i,
            send_time=b,
            first_token_time=b + ttft,
            end_time=b + e2e,
            chunk_times=[b + ttft, b + e2e],
            chunk_tokens=[1, n - 1],
            output_tokens=n,
            error=error,
            error_kind="http_5xx" if error else None,
        )

    # the opening wave, warm-up: both streams sent at b - 1 and ended by b - 0.25 (one turnover)
    opening = [RequestRecord(point="c2", index=10 + k, warmup=True, send_time=b - 1.0,
                             first_token_time=b - 0.75, end_time=b - 0.5 + 0.25 * k,
                             chunk_times=[b - 0.75], chunk_tokens=[1], output_tokens=1) for k in range(2)]
    records = [
        *opening,
        rec(0, 0.1, 1.1, 11),  # TTFT 100 ms, TPOT 100 ms: good
        rec(1, 0.3, 1.3, 11),  # TTFT 300 ms: misses the TTFT bound
        rec(2, 0.1, 2.1, 11),  # TPOT 200 ms: misses the TPOT bound
        rec(3, 0.1, 0.1, 1),  # one token: no TPOT, TTFT fine: good
        rec(4, 0.1, 1.1, 11, error="HTTP 500"),  # failed: never good
    ]
    point = LoadPoint(num_requests=5, concurrency=2, warmup_requests=2)
    m = summarize(records, point, slo=SLO(ttft_ms=200, tpot_ms=150))
    assert m["duration_s"] == pytest.approx(2.1)  # the measured requests' span
    # the window: from b (turned over at b - 0.25; the first measured send) to the first stream not
    # replaced (7 sends, C = 2: the sixth end, b + 1.3); all five measured were sent in it, two met both
    # bounds
    assert m["window_s"] == pytest.approx(1.3)
    assert m["slo_attainment"] == pytest.approx(2 / 5)
    # 24 tokens were delivered in the window (11 + 11 + 1 + 1): requests 0, 1 and 3 whole and 1 of
    # request 2's 11; of the window's successful requests' 34 tokens the good ones had 12
    assert m["request_s"] == pytest.approx((3 + 1 / 11) / 1.3)
    assert m["goodput_req_s"] == pytest.approx((3 + 1 / 11) / 1.3 * 2 / 5)
    assert m["goodput_tok_s"] == pytest.approx(24 / 1.3 * 12 / 34)
    assert "goodput_req_s" not in summarize(records, point)
    with pytest.raises(ValueError):
        SLO()


# ---------------------------------------------------------------------------------------------
# the self-check, one rule at a time


def _closed(n: int, c: int, *, fail: int = 0, gap: float = 0.0) -> list[RequestRecord]:
    """n requests of 1 s from c workers, back to back (``gap`` s between a worker's requests)."""
    out = []
    for i in range(n):
        start = B + (i // c) * (1.0 + gap)
        bad = i < fail
        out.append(
            RequestRecord(
                f"c{c}",
                i,
                send_time=start,
                first_token_time=None if bad else start + 0.125,
                end_time=start + 1.0,
                chunk_times=[] if bad else [start + 0.125, start + 1.0],
                chunk_tokens=[] if bad else [1, 1],
                output_tokens=0 if bad else 2,
                error="x" if bad else None,
                error_kind="timeout" if bad else None,
            )
        )
    return out


def _verdict(records: list[RequestRecord], point: LoadPoint, **kw: object) -> tuple[float, list[str]]:
    m = summarize(records, point, **kw)  # type: ignore[arg-type]
    reasons = validity_reasons(m, point, **{k: v for k, v in kw.items() if k == "lag_threshold_ms"})  # type: ignore[arg-type]
    assert (m["valid"] == 1.0) == (reasons == [])  # the metric and the reasons always agree
    return m["valid"], reasons


def test_a_full_closed_loop_point_is_valid() -> None:
    assert _verdict(_closed(16, 4), LoadPoint(num_requests=16, concurrency=4)) == (1.0, [])


def test_failures_invalidate_only_past_half() -> None:
    point = LoadPoint(num_requests=8, concurrency=4)
    assert _verdict(_closed(8, 4, fail=4), point) == (1.0, [])
    valid, reasons = _verdict(_closed(8, 4, fail=5), point)
    assert valid == 0.0 and reasons == ["5 of 8 requests failed (mostly timeout)"]


def test_idle_workers_invalidate_a_closed_loop_point() -> None:
    # Each worker waits 1 s between requests: half the time, nothing of its is in flight.
    valid, reasons = _verdict(_closed(16, 4, gap=1.0), LoadPoint(num_requests=16, concurrency=4))
    assert valid == 0.0 and len(reasons) == 1 and "below 95 % of concurrency 4" in reasons[0]
    # Fewer requests than workers: judged against the 3 that could be in flight, not 8.
    assert _verdict(_closed(3, 3), LoadPoint(num_requests=3, concurrency=8)) == (1.0, [])


@pytest.mark.parametrize(
    ("lag", "threshold", "valid"), [(20.0, None, 1.0), (20.5, None, 0.0), (40.0, 50.0, 1.0)]
)
def test_event_loop_lag_against_the_threshold(lag: float, threshold: float | None, valid: float) -> None:
    kw: dict[str, object] = {"lag_ms": [lag] * 200}
    if threshold is not None:
        kw["lag_threshold_ms"] = threshold
    got, reasons = _verdict(_closed(16, 4), LoadPoint(num_requests=16, concurrency=4), **kw)
    limit = threshold if threshold is not None else DEFAULT_LAG_THRESHOLD_MS
    assert got == valid
    if not valid:
        assert reasons == [
            f"client event-loop lag p99 {lag:.1f} ms > {limit:g} ms: the load generator was CPU-bound"
        ]


def test_a_held_back_open_loop_point_names_the_cap() -> None:
    # 11 requests scheduled 100 ms apart, sent 200 ms apart because max_concurrency=1 was reached.
    point = LoadPoint(num_requests=11, rate=10.0, arrival="constant", max_concurrency=1)
    recs = [
        RequestRecord("r10", i, scheduled_time=B + i / 10, send_time=B + i / 5, end_time=B + i / 5 + 0.2)
        for i in range(11)
    ]
    valid, reasons = _verdict(recs, point)
    assert valid == 0.0 and len(reasons) == 2
    assert reasons[0].startswith("achieved 5 req/s vs 10 scheduled (-50.0 %)")
    assert all("max_concurrency=1 was reached" in r for r in reasons)


def test_the_ttft_split_from_the_servers_queue_times() -> None:
    records = []
    for i, (ttft, queue) in enumerate([(0.25, 0.0), (0.5, 0.25), (1.0, 0.75), (2.0, 1.75)]):
        records.append(RequestRecord("c4", i, send_time=B, first_token_time=B + ttft, end_time=B + 3.0,
                                     chunk_times=[B + ttft], chunk_tokens=[1], output_tokens=1,
                                     server_queue_s=queue))
    m = summarize(records, LoadPoint(concurrency=4, num_requests=4))
    assert m["server_queue_mean_ms"] == 687.5 and m["server_queue_p50_ms"] == 500.0
    # the TTFT p99 (1,970 ms, between the two slowest) and its queueing part: the tail above it is the
    # slowest request, 2 s of which 1.75 s in the queue
    assert m["ttft_p99_ms"] == pytest.approx(1970.0)
    assert m["ttft_p99_queue_ms"] == pytest.approx(1970.0 * 1.75 / 2.0)
    assert m["ttft_queue_share"] == 2750.0 / 3750.0
    # a server that does not report queue times: no split at all (not zeros)
    for r in records:
        r.server_queue_s = None
    assert "ttft_queue_share" not in summarize(records, LoadPoint(concurrency=4, num_requests=4))


def test_a_p99_interval_needs_samples_beyond_its_upper_rank() -> None:
    from workloads.window import quantile_interval

    rng = np.random.default_rng(0)
    # 100 samples: the interval's upper rank is past the largest sample, so it is not known
    assert all(math.isnan(v) for v in quantile_interval(rng.exponential(size=100), 0.99))
    # 2,000 samples: a closed interval around the p99, below the maximum
    big = rng.exponential(size=2000)
    lo, hi = quantile_interval(big, 0.99)
    assert lo < np.percentile(big, 99) < hi < big.max()


def test_the_quantiles_ranks_are_scipy_stats_binomial_quantiles() -> None:
    # the ranks come from scipy.special's binomial functions (scipy.stats is slow to import): they must
    # be scipy.stats.binom.ppf's, the distribution's own quantile, wherever an interval is drawn
    from scipy.stats import binom

    from workloads.window import _binomial_quantile

    sizes = [*range(1, 600), 999, 1000, 1801, 4000, 40_000, 123_457]
    for n in sizes:
        for q in (0.5, 0.9, 0.99):
            for p in (0.025, 0.975):
                assert _binomial_quantile(p, n, q) == int(binom.ppf(p, n, q)), (p, n, q)
