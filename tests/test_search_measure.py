"""The pieces of measuring a search's best candidates that need no engine: the loads around a predicted
best, the command line of each measured trial, judging measured loads against the SLOs, the rank
agreement, and the Pareto front of the search's plots."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.search_plots import frontier_table, pareto_front
from orchestrator.prediction.at_load import closed_point
from orchestrator.search.evaluate import OK, Outcome, Settings
from orchestrator.search.measure import (
    RUN_PY,
    Measured,
    base_overrides,
    judge,
    loads_around,
    rank_agreement,
    trial_argv,
    trial_points,
)
from vocab.hardware import load_hardware

SETTINGS = Settings("output_tok_s_per_gpu", {"itl_p99_ms": 50.0, "ttft_p99_ms": 2000.0}, 256)


def test_the_loads_around_a_predicted_best() -> None:
    assert loads_around(44, 256) == [39, 44, 49]  # one bisection step (an eighth) either side
    assert loads_around(4, 256) == [3, 4, 5]  # at least one request
    assert loads_around(1, 256) == [1, 2]
    assert loads_around(256, 256) == [224, 256]  # never above search.max_concurrency


def test_a_measured_trial_is_run_py_with_the_search_overrides_and_the_candidate() -> None:
    task = ["experiment=search-llama-70b-h100", "search.slo.itl_p99_ms=40", "+search.workers=2",
            "tp.size=2", "workload.concurrency=[8]", "tracking.experiment=mine", "hydra.run.dir=x"]
    change = {"tp.size": 8, "pp.micro_batch_size": None, "server.extra_args.enable-mixed-chunk": True}
    assert base_overrides(task, change) == ["experiment=search-llama-70b-h100", "tracking.experiment=mine"]
    argv = trial_argv(task, change, [39, 44, 49], "abc123", "search #1 tp.size=8", Path("/o/measured/1"))
    assert argv[:2] == [sys.executable, str(RUN_PY)]
    assert argv[2:] == [
        "experiment=search-llama-70b-h100", "tracking.experiment=mine",
        "++tp.size=8", "++pp.micro_batch_size=null", "++server.extra_args.enable-mixed-chunk=true",
        "workload.concurrency=[39,44,49]", "workload.rate=[]", "workload.warmup_per_concurrency=0",
        "workload.requests_per_concurrency=4", "workload.requests_per_point=null", "workload.ramp=auto",
        "workload.ci_target=null", "search.name=null",
        "tracking.parent_run_id=abc123", "tracking.label='search #1 tp.size=8'",
        "hydra.run.dir=/o/measured/1"]


def test_the_trials_load_plan_is_the_searchs_points() -> None:
    from orchestrator.config.schema import ParasweepConf
    from orchestrator.points.plan import load_points
    from orchestrator.prediction.modelled import point_predictor

    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    # what trial_argv sets: the trial's load plan is then the search's points (four requests per stream,
    # no warm-up wave), their ramp included
    cfg.workload.concurrency, cfg.workload.warmup_per_concurrency = [3, 44], 0.0
    cfg.workload.requests_per_concurrency, cfg.workload.ci_target = 4, None
    points = trial_points([3, 44], point_predictor(cfg, {}))
    assert [(p.concurrency, p.num_requests, p.warmup_requests) for p in points.values()] == [
        (3, 12, 0), (44, 176, 0)]
    assert all(p.ramp_s > 0 for p in points.values())
    assert load_points(cfg) == list(points.values())
    assert [closed_point(c) for c in (3, 44)] == [
        dataclasses.replace(p, ramp_s=0.0) for p in points.values()]


def _measured(score: float, loads: dict[int, dict[str, float]]) -> Measured:
    outcome = Outcome({"tp.size": 8}, OK, gpus=8, concurrency=44, score=score)
    return Measured(outcome, 1, sorted(loads), measured=loads)


def test_judging_measured_loads_against_the_slos() -> None:
    m = _measured(300.0, {39: {"output_tok_s": 2000.0, "itl_p99_ms": 30.0, "ttft_p99_ms": 1500.0},
                          44: {"output_tok_s": 2300.0, "itl_p99_ms": 45.0, "ttft_p99_ms": 1900.0},
                          49: {"output_tok_s": 2400.0, "itl_p99_ms": 48.0, "ttft_p99_ms": 2100.0}})
    judge(m, SETTINGS, 8, {})
    assert m.concurrency == 44 and m.score == pytest.approx(2300.0 / 8)  # 49 breaks the TTFT bound
    none = _measured(300.0, {44: {"output_tok_s": 2300.0, "itl_p99_ms": 60.0}})
    judge(none, SETTINGS, 8, {})
    assert none.concurrency is None and none.score is None


def test_rank_agreement() -> None:
    def scored(predicted: float, measured: float) -> Measured:
        m = _measured(predicted, {})
        m.score = measured
        return m

    assert rank_agreement([scored(3, 30), scored(2, 20), scored(1, 10)]) == pytest.approx(1.0)
    assert rank_agreement([scored(3, 10), scored(2, 20), scored(1, 30)]) == pytest.approx(-1.0)
    assert rank_agreement([scored(3, 30)]) is None  # one measured: nothing to order


def test_the_pareto_front() -> None:
    # per-user speed (higher better) against per-GPU throughput (higher better)
    xs, ys = [10.0, 20.0, 30.0, 15.0, 30.0], [300.0, 250.0, 100.0, 200.0, 90.0]
    assert pareto_front(xs, ys) == [0, 1, 2]  # 3 and 4 are beaten on both axes
    # TTFT (lower better): the fastest first-token point and the highest throughput are both on it
    assert pareto_front([500.0, 900.0, 700.0], [100.0, 300.0, 90.0], x_higher_better=False) == [0, 1]
    table = pd.DataFrame({"status": [OK, OK, "rejected"], "same_as": ["", "", ""], "gpus": [8, 4, None],
                          "concurrency": [40, 20, None], "output_tok_s": [2400.0, 1000.0, math.nan],
                          "ttft_p99_ms": [1900.0, 900.0, math.nan]})
    frame = frontier_table(table)
    assert frame["tok_s_per_gpu"].tolist() == [300.0, 250.0]
    assert frame["tok_s_per_user"].tolist() == [60.0, 50.0]
