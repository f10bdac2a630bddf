"""SGLang's --scheduler-recv-interval in the simulated engine: while a batch decodes, new requests wait on
the scheduler's socket until the interval's decode iterations have passed; decoding itself is unchanged."""

from __future__ import annotations

import pytest

from simulator.predict import load_config
from simulator.replay import replay
from vocab.assets import hardware_dir, models_dir
from workloads.bench_serving import BenchRequest, bench_metrics


def _engine(*flags: str):  # type: ignore[no-untyped-def]
    return load_config(["--model-path", str(models_dir() / "llama-3.1-8b"),
                        "--sim-hardware", str(hardware_dir() / "h100-sxm-x8.yaml"),
                        "--sim-step-costs", "auto", *flags])


def _run(interval: int) -> dict[str, float]:
    cfg = _engine("--disable-radix-cache", "--scheduler-recv-interval", str(interval))
    # a closed loop of 8 streams of 512-token prompts and replies of 128 to 376 tokens: every request after
    # the first eight arrives while others decode
    requests = [BenchRequest(512, 128 + 8 * (i % 32), 0.0) for i in range(48)]
    return bench_metrics(replay(cfg, requests, max_concurrency=8))


def test_new_requests_wait_for_the_interval_while_decoding() -> None:
    every, thirty = _run(1), _run(30)
    step_ms = every["median_itl_ms"]
    extra = thirty["mean_ttft_ms"] - every["mean_ttft_ms"]
    # an arrival waits for what is left of 30 decode iterations: about half of them on average, and
    # never more than all of them
    assert 5 * step_ms < extra < 30 * step_ms
    # the decode steps themselves are the same (the interval changes when prefills happen, not their cost)
    assert thirty["median_itl_ms"] == pytest.approx(every["median_itl_ms"], rel=0.05)


def test_an_idle_engine_takes_a_request_at_once() -> None:
    cfg, base = _engine("--scheduler-recv-interval", "30"), _engine()
    one = [BenchRequest(512, 64, 0.0), BenchRequest(512, 64, 5.0)]  # the second arrives after the first ends
    got = bench_metrics(replay(cfg, one))["mean_ttft_ms"]
    assert got == bench_metrics(replay(base, one))["mean_ttft_ms"]
