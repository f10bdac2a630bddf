"""The cost model's terms held to measurements by benchmarks/fidelity_terms.py: each adds what its
definition says, and nothing while it is 0 (the prefill overlap loss is kept at 1, the others at 0)."""

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


def test_a_prefill_loses_its_share_of_the_overlap_and_a_decode_does_not() -> None:
    from simulator.costs import prefill_shape

    cost = _cfg(2).cost
    shape = prefill_shape([(256, 0)])  # a prefill: eager
    work = cost.gpu_time(0, shape) + cost.comm_time(0, shape)
    host = cost.host_time(0, shape)
    for loss in (0.0, 0.5, 1.0):
        cost.p = dataclasses.replace(cost.p, prefill_overlap_loss=loss)
        assert cost.stage_time(0, shape) == pytest.approx(max(work, host) + loss * min(work, host))
    graphed = decode_shape([500] * 4)  # a decode replayed from a graph: no dispatch to overlap
    assert cost.stage_time(0, graphed) == pytest.approx(
        cost.gpu_time(0, graphed) + cost.comm_time(0, graphed) + cost.host_time(0, graphed))
    eager = decode_shape([500] * 400)  # above the captured sizes: an eager decode overlaps fully
    assert not cost.uses_cuda_graph(eager)
    assert cost.stage_time(0, eager) == pytest.approx(max(
        cost.gpu_time(0, eager) + cost.comm_time(0, eager), cost.host_time(0, eager)))
