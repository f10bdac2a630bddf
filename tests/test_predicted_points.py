"""A point in virtual time runs until its numbers are known (``orchestrator.points.virtual``), not for a
measured run's request count: on the simulator's model, deterministic."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.config.schema import PredictedPointConf
from orchestrator.points.virtual import MAX_REQUESTS_PER_STREAM, budget_hits, in_virtual_time
from simulator.predict import predict_point
from vocab.load import LoadPoint, RequestSpec
from workloads.window import StabilityTracker

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model-path", str(REPO / "models" / "tiny-test"), "--sim-hardware", "h200-nvlink-x8",
        "--random-seed", "1"]
# lengths that vary, so requests end out of step and the window's batches differ
SPEC = RequestSpec(input_len=256, output_len=64, input_dist="uniform:0.5", output_dist="uniform:0.5")
DEFAULTS = PredictedPointConf()


def test_in_virtual_time_a_point_is_bounded_by_its_targets_and_its_budget() -> None:
    closed = LoadPoint(concurrency=8, num_requests=32, warmup_requests=2, ramp_s=0.3)
    v = in_virtual_time(closed, DEFAULTS)
    assert v.num_requests == MAX_REQUESTS_PER_STREAM * 8 and v.duration_s == DEFAULTS.budget_s
    assert (v.ci_target, v.latency_ci_target) == (DEFAULTS.ci_target, DEFAULTS.latency_ci_target)
    assert (v.warmup_requests, v.ramp_s, v.label) == (2, 0.3, "c8")  # the same load, the same name
    # open loop: as many requests as the budget's seconds at its rate
    rate = in_virtual_time(LoadPoint(rate=5.0, num_requests=20), DEFAULTS)
    assert rate.num_requests == 5 * DEFAULTS.budget_s and rate.label == "r5"
    # a trace's point is its trace's requests
    trace = LoadPoint(rate=2.0, arrival="trace", schedule=(0.0, 0.5, 1.0), num_requests=3)
    assert in_virtual_time(trace, DEFAULTS) == trace


def test_a_predicted_point_does_not_move_with_a_four_times_larger_cap_or_budget() -> None:
    point = LoadPoint(concurrency=8, num_requests=32, warmup_requests=2, ramp_s=0.05)
    runs = {
        "4 per stream": in_virtual_time(point, DEFAULTS),
        "16 per stream": in_virtual_time(dataclasses.replace(point, num_requests=128), DEFAULTS),
        "4x the budget, 8x as tight": in_virtual_time(point, PredictedPointConf(
            ci_target=DEFAULTS.ci_target / 8, latency_ci_target=DEFAULTS.latency_ci_target,
            budget_s=4 * DEFAULTS.budget_s)),
    }
    got = {name: predict_point(TINY, p, SPEC).metrics for name, p in runs.items()}
    base = got["4 per stream"]
    assert base["budget_hit"] == 0.0  # its targets, not its budget, ended it
    assert base["output_tok_s_ci95_rel"] <= DEFAULTS.ci_target
    assert base["completed"] > 32  # far beyond the count a measurement would send
    assert got["16 per stream"]["output_tok_s"] == base["output_tok_s"]  # the count does not decide
    longer = got["4x the budget, 8x as tight"]
    assert longer["completed"] > base["completed"]
    for metric in ("output_tok_s", "ttft_p99_ms", "itl_p99_ms"):
        assert longer[metric] == pytest.approx(base[metric], rel=0.02), metric
    # what the count a measurement affords would have said: its end-to-end p99 from too few samples (9 %
    # off; the ITL p99 is one prefill's stall, the same in both)
    counted = predict_point(TINY, point, SPEC).metrics
    assert counted["e2e_p99_ms"] != pytest.approx(longer["e2e_p99_ms"], rel=0.05)


def test_a_point_stopped_by_its_budget_says_so() -> None:
    point = in_virtual_time(LoadPoint(concurrency=8, num_requests=32, ramp_s=0.05),
                            PredictedPointConf(budget_s=1.0))
    result = predict_point(TINY, point, SPEC)
    assert result.metrics["budget_hit"] == 1.0
    assert budget_hits([result]) == ["c8"]


def test_the_stop_rule_waits_for_the_p99s_when_asked() -> None:
    # the same point, stopped by its throughput alone and by its throughput and its p99s: the p99s need
    # more requests (some hundreds for the upper rank of a p99 to exist at all)
    rate_only = dataclasses.replace(in_virtual_time(LoadPoint(concurrency=8, num_requests=32, ramp_s=0.05),
                                                    DEFAULTS), latency_ci_target=None)
    both = dataclasses.replace(rate_only, latency_ci_target=DEFAULTS.latency_ci_target)
    a = predict_point(TINY, rate_only, SPEC).metrics
    b = predict_point(TINY, both, SPEC).metrics
    assert b["completed"] > a["completed"] and b["completed"] >= 400
    assert a["budget_hit"] == b["budget_hit"] == 0.0
    assert StabilityTracker(both, DEFAULTS.ci_target).stable(0.0) is False  # nothing sent: not known


def test_a_point_too_short_for_its_turnover_is_read_from_when_the_load_held() -> None:
    # two requests per stream: after the turnover fewer than one send per stream would be left, so the
    # window opens as the load held, in virtual time as on the load generator's records; a point with
    # more waves waits for the turnover
    short = predict_point(TINY, LoadPoint(concurrency=8, num_requests=16), SPEC).metrics
    assert (short["window_steady"], short["window_turned"]) == (1.0, 0.0)
    assert short["ramp_requests"] < 8 and short["window_requests"] >= 8
    longer = predict_point(TINY, LoadPoint(concurrency=8, num_requests=48), SPEC).metrics
    assert (longer["window_steady"], longer["window_turned"]) == (1.0, 1.0)
    assert longer["ramp_requests"] >= 8
    for m in (short, longer):  # the simulated GPUs' busy share, read over a window in both
        assert 0.0 < m["gpu_util_mean_pct"] <= 100.0
