"""The cost model's candidate terms (benchmarks/fidelity_terms.py holds them to measurements): each adds
what its definition says, and nothing while it is 0."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator.costs import decode_shape
from simulator.predict import load_config
from simulator.replay import replay
from vocab.assets import hardware_dir, models_dir
from workloads.bench_serving import BenchRequest, bench_metrics


def _cfg(tp: int):  # type: ignore[no-untyped-def]
    return load_config(["--model-path", str(models_dir() / "llama-3.1-8b"), "--sim-hardware",
                        str(hardware_dir() / "h100-sxm-x8.yaml"), "--sim-step-costs", "auto",
                        "--tp-size", str(tp)])


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_an_all_reduce_waits_for_the_slowest_of_its_ranks(tp: int) -> None:
    cfg = _cfg(tp)
    cost = cfg.cost
    shape = decode_shape([1000] * 16)
    before = cost.stage_time(0, shape)
    cost.p = dataclasses.replace(cost.p, allreduce_wait_us=5.0)
    after = cost.stage_time(0, shape)
    # two all-reduces a layer, each 5 us x sqrt(2 ln tp) longer; none on one GPU
    expected = 2 * cfg.spec.num_layers * 5e-6 * math.sqrt(2 * math.log(tp)) if tp > 1 else 0.0
    assert after - before == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_the_request_path_delays_the_first_token_not_the_rest() -> None:
    requests = [BenchRequest(512, 64, 0.0), BenchRequest(512, 64, 2.0)]
    base = bench_metrics(replay(_cfg(1), requests))
    cfg = _cfg(1)
    cfg.cost.p = dataclasses.replace(cfg.cost.p, request_path_us=40_000.0)
    slow = bench_metrics(replay(cfg, requests))
    assert slow["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(40.0, abs=0.5)
    assert slow["mean_tpot_ms"] == pytest.approx(base["mean_tpot_ms"], rel=1e-6)
