"""The steady-state window of a load point, the closed loop's ramp and the stop rule: on the load
generator's own scheduler (a send that takes a fixed time, no server) and on the simulator's model in
virtual time (the same definitions, deterministic)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from simulator.predict import predict_point
from vocab.load import LoadPoint, RequestSpec
from vocab.records import RequestRecord
from workloads import clock
from workloads.metrics import summarize
from workloads.scheduler import drive
from workloads.window import output_rate_interval, steady_window, tokens_between

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model-path", str(REPO / "models" / "tiny-test"), "--sim-hardware", "h200-nvlink-x8",
        "--random-seed", "1"]
SPEC = RequestSpec(input_len=128, output_len=64)


def _rec(i: int, send: float, end: float, tokens: int = 4, warmup: bool = False,
         at: float = 1.0) -> RequestRecord:
    """A request that delivers ``tokens`` tokens evenly, the k-th at ``(k + at) / tokens`` of its time."""
    times = [send + (end - send) * (k + at) / tokens for k in range(tokens)]
    return RequestRecord("c2", i, warmup=warmup, send_time=send, first_token_time=times[0], end_time=end,
                         chunk_times=times, chunk_tokens=[1] * tokens, output_tokens=tokens)


# -- the window from records --------------------------------------------------------------------------

def test_the_window_ends_at_the_first_stream_not_replaced() -> None:
    # C = 2, three waves, then one request more: at t = 3 both end, one is replaced (sent 1 ms later),
    # the other is not. The end of the first stream not replaced is t = 3, although the last send is
    # later. The load first held at 0 (both in flight) and turned over at 1 (two ends since): the window
    # opens with the send that replaced the second of them, at 1.001
    recs = [_rec(0, 0.0, 1.0), _rec(1, 0.0, 1.0), _rec(2, 1.001, 2.0), _rec(3, 1.001, 2.0),
            _rec(4, 2.001, 3.0), _rec(5, 2.001, 3.0), _rec(6, 3.001, 4.0)]
    window = steady_window(recs, LoadPoint(concurrency=2, num_requests=7))
    assert window is not None and window.steady
    assert (window.start, window.end, window.last_end) == (1.001, 3.0, 4.0)
    m = summarize(recs, LoadPoint(concurrency=2, num_requests=7))
    # the part-filled tail (one request in flight from 3 to 4) is the drain, not the window
    assert m["window_s"] == pytest.approx(1.999) and m["drain_s"] == 1.0 and m["drain_requests"] == 1
    assert m["ramp_s"] == 1.001
    assert m["output_tok_s"] == tokens_between(recs, 1.001, 3.0) / 1.999 == pytest.approx(16 / 1.999)
    assert m["drain_output_tok_s"] == pytest.approx(4.0)
    assert m["achieved_concurrency"] == pytest.approx(2.0, rel=1e-3)
    # what the whole point's span would say: the tail dilutes it by a seventh
    assert m["output_tok_s"] > 28 / 4.0


def test_the_window_opens_after_one_turnover_so_an_idle_start_does_not_read_high() -> None:
    # C = 2 on an engine that delivers the first wave at twice its later rate (no queue yet): 8 tokens in
    # 0.5 s, then 8 tokens a second. Opening at the first instant both are in flight would count the
    # fast wave; the turnover leaves it in the ramp
    fast = [_rec(0, 0.0, 0.5), _rec(1, 0.0, 0.5)]
    steady = [_rec(2 + 2 * k + s, 0.501 + k, 1.501 + k) for k in range(4) for s in range(2)]
    recs = fast + steady
    m = summarize(recs, LoadPoint(concurrency=2, num_requests=len(recs)))
    assert m["ramp_s"] == 0.501 and m["ramp_requests"] == 2 and m["window_turned"] == 1.0
    assert m["output_tok_s"] == pytest.approx(8.0, rel=1e-3)
    whole_from_held = tokens_between(recs, 0.0, m["ramp_s"] + m["window_s"]) / (m["ramp_s"] + m["window_s"])
    assert whole_from_held > 8.0 * 1.05


def test_the_ramp_is_outside_the_window() -> None:
    # streams enter at 0 and 0.5: the load holds from 0.5, and has turned over at 1.5 (the ends at 1.0
    # and 1.5 since)
    recs = [_rec(0, 0.0, 1.0), _rec(1, 0.5, 1.5), _rec(2, 1.0, 2.0), _rec(3, 1.5, 2.5), _rec(4, 2.0, 3.0),
            _rec(5, 2.5, 3.5)]
    m = summarize(recs, LoadPoint(concurrency=2, num_requests=6))
    assert (m["ramp_s"], m["window_s"], m["ramp_requests"]) == (1.5, 1.5, 3)
    # six sends, C = 2: the fifth end (3.0) closes it, so the sends at 1.5 ... 2.5 are in it
    assert m["window_requests"] == 3
    assert m["window_steady"] == 1.0


def test_a_point_too_short_for_a_window_says_so() -> None:
    # C = 4 but only two requests: the load held (two in flight is all this point could offer) and never
    # turned over, one wave and nothing after it
    recs = [_rec(0, 0.0, 1.0), _rec(1, 0.0, 1.2)]
    m = summarize(recs, LoadPoint(concurrency=4, num_requests=2))
    assert m["window_steady"] == 0.0 and m["window_s"] == 1.2
    recs = [_rec(0, 0.0, 1.0, warmup=True), _rec(1, 1.0, 2.0)]
    m = summarize(recs, LoadPoint(concurrency=2, num_requests=1, warmup_requests=1))
    assert m["window_steady"] == 0.0 and m["window_s"] == 1.0  # the measured span instead
    # C = 2 held from 0, but the point ends before both streams turned over: its window opens as the load
    # held (at 0) and closes at the first stream not replaced (2.0), and says it did not wait
    recs = [_rec(0, 0.0, 1.0), _rec(1, 0.0, 2.0), _rec(2, 1.0, 2.5)]
    m = summarize(recs, LoadPoint(concurrency=2, num_requests=3))
    assert (m["window_steady"], m["window_turned"], m["ramp_s"], m["window_s"]) == (1.0, 0.0, 0.0, 2.0)


def test_a_point_of_two_requests_per_stream_is_read_from_when_the_load_held() -> None:
    # C = 2, two waves: the turnover's window would hold one send (the one at 1.1, replacing the second
    # end of the first wave, before the first end of the second, at 2.0, closes it): too few to
    # describe the point, so the window opens as the load held, at 0
    recs = [_rec(0, 0.0, 1.0), _rec(1, 0.0, 1.1), _rec(2, 1.0, 2.0), _rec(3, 1.1, 2.1)]
    m = summarize(recs, LoadPoint(concurrency=2, num_requests=4))
    assert (m["window_turned"], m["ramp_s"], m["window_s"], m["window_requests"]) == (0.0, 0.0, 2.0, 4)
    # a third wave leaves three sends after the turnover: the window waits for it
    recs += [_rec(4, 2.0, 3.0), _rec(5, 2.1, 3.1)]
    m = summarize(recs, LoadPoint(concurrency=2, num_requests=6))
    assert (m["window_turned"], m["ramp_s"], m["window_requests"]) == (1.0, 1.1, 3)


def test_batch_means_know_a_steady_rate_and_say_nothing_of_a_short_window() -> None:
    # ten requests back to back on each of two streams: a constant delivery rate
    recs = [_rec(2 * k + s, float(k), k + 1.0, tokens=10, at=0.5) for k in range(10) for s in range(2)]
    window = steady_window(recs, LoadPoint(concurrency=2, num_requests=20))
    assert window is not None
    interval = output_rate_interval(recs, window)
    assert interval.mean == pytest.approx(20.0) and interval.batches == 10
    assert interval.relative < 1e-9
    # a window of one request duration: fewer than four half-duration batches, no interval (held at 0,
    # turned over at 1.5; the fourth end, at 2.5, is the first stream not replaced)
    few = [_rec(0, 0.0, 1.0, tokens=10, at=0.5), _rec(1, 0.0, 1.5, tokens=10, at=0.5),
           _rec(2, 1.0, 2.0, tokens=10, at=0.5), _rec(3, 1.5, 2.5, tokens=10, at=0.5),
           _rec(4, 2.0, 3.0, tokens=10, at=0.5)]
    short = steady_window(few, LoadPoint(concurrency=2, num_requests=5))
    assert short is not None and (short.start, short.width) == (1.5, 1.0)
    assert math.isnan(output_rate_interval(few, short).half_width)


# -- the closed loop's ramp on the load generator's scheduler ------------------------------------------

def _closed_loop_sends(point: LoadPoint, duration: float) -> list[tuple[int, float]]:
    sends: list[tuple[int, float]] = []

    async def send(i: int, _: float | None) -> None:
        sends.append((i, clock.now()))
        await asyncio.sleep(duration)

    asyncio.run(drive(point, send))
    return sends


def test_the_ramp_lets_the_streams_in_one_by_one() -> None:
    sends = _closed_loop_sends(LoadPoint(concurrency=4, num_requests=8, ramp_s=0.4), 0.4)
    t0 = sends[0][1]
    first_four = [t - t0 for _, t in sends[:4]]
    # stream k enters at k / 4 x 0.4 s (a loaded machine can only make the entries later)
    for k, offset in enumerate(first_four):
        assert offset >= k * 0.1 - 1e-3
    assert first_four[-1] < 0.4 + 0.3  # all entered before the first stream's second request
    burst = _closed_loop_sends(LoadPoint(concurrency=4, num_requests=8), 0.2)
    assert burst[3][1] - burst[0][1] < 0.05  # ramp_s 0: all at once


# -- the same, in virtual time ----------------------------------------------------------------------

def test_a_ramped_fixed_length_closed_loop_does_not_march_in_step() -> None:
    burst = predict_point(TINY, LoadPoint(concurrency=8, num_requests=64), SPEC)
    duration = burst.metrics["e2e_mean_ms"] / 1000
    ramped = predict_point(TINY, LoadPoint(concurrency=8, num_requests=64, ramp_s=duration), SPEC)

    def most_sends_within_a_ms(result) -> int:
        window = steady_window(result.records, result.point)
        sends = np.asarray(sorted(r.send_time for r in result.records if window.holds(r.send_time)))
        return int(np.bincount(((sends - sends[0]) / 1e-3).astype(int)).max())

    assert most_sends_within_a_ms(burst) == 8  # every stream sends in the same instant, wave after wave
    assert most_sends_within_a_ms(ramped) <= 2  # after the ramp, spread over the request duration
    window = steady_window(ramped.records, ramped.point)
    sends = sorted(r.send_time for r in ramped.records if window.holds(r.send_time))
    phases = sorted(((t - sends[0]) % duration) / duration for t in sends[:8])
    assert phases[-1] - phases[0] > 0.6  # one cycle's sends cover most of it
    assert ramped.metrics["ramp_s"] > 0.5 * duration


def test_the_stop_rule_ends_a_point_once_its_throughput_is_known() -> None:
    bound = LoadPoint(concurrency=8, num_requests=2000, ramp_s=0.06, ci_target=0.03)
    result = predict_point(TINY, bound, SPEC)
    sent = len(result.records)
    assert 8 < sent < 2000  # stopped long before its request bound
    assert result.metrics["output_tok_s_ci95_rel"] < 0.03 * 1.5
    assert result.valid
    # a fixed count stays possible: without a target every request is sent
    fixed = predict_point(TINY, LoadPoint(concurrency=8, num_requests=300, ramp_s=0.06), SPEC)
    assert len(fixed.records) == 300


def test_the_t_table_is_students_t() -> None:
    # the stop rule's table (kept off the event loop's import path) against scipy's distribution
    from scipy.stats import t

    from workloads.window import MAX_BATCHES, T975

    assert sorted(T975) == list(range(1, MAX_BATCHES))
    for dof, value in T975.items():
        assert value == pytest.approx(float(t.ppf(0.975, dof)), abs=5e-4)
