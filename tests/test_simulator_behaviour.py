"""What the simulated engine must show (issue 3), in virtual time through the public prediction API.

Every test configures the engine with the live server's flags (``predict_point(argv, ...)``), drives it
with ``workloads``' load modes and asserts numbers. Nothing here touches the wall clock, so each test
runs in milliseconds to a fraction of a second and is deterministic.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from simulator.costs import decode_shape  # noqa: E402
from simulator.predict import load_config, predict_point, predict_trial, resolved_server_info  # noqa: E402
from workloads import LoadPoint, RequestSpec  # noqa: E402

KIMI = str(REPO / "models" / "kimi-k2")
PCIE = "rtx-pro-6000-pcie-x8"
NVLINK = "h200-nvlink-x8"
KIMI_PP8 = ["--model-path", KIMI, "--pp-size", "8", "--sim-hardware", PCIE]
# Decode-dominated requests: a short prompt and a long answer, so throughput is decode throughput.
DECODE = RequestSpec(api="generate", input_len=32, output_len=256)
# A layer split that balances Kimi's LM-head stage (SGLANG_PP_LAYER_PARTITION, sglang.md 1.4).
BALANCED = "8,8,8,8,8,8,8,5"


def closed(c: int, n: int | None = None, warmup: int = 0) -> LoadPoint:
    return LoadPoint(num_requests=n or c, concurrency=c, warmup_requests=warmup)


def tok_s(argv: list[str], point: LoadPoint, spec: RequestSpec = DECODE) -> float:
    return predict_point(argv, point, spec).metrics["output_tok_s"]


def test_pp8_depth0_default_cap_runs_one_microbatch_and_stages_idle_7_of_8() -> None:
    cfg = load_config(KIMI_PP8)
    assert cfg.depth == 0 and cfg.pp_max_micro_batch_size == cfg.max_running_requests // 8 >= 8
    m = predict_point(KIMI_PP8, closed(8, 24, warmup=8), DECODE).metrics
    assert m["sim_peak_microbatches_in_flight"] == 1  # all 8 requests fit the first slot's cap
    assert m["sim_peak_running_reqs"] == 8
    # one micro-batch circles the ring: each stage works on it 1/8 of the period (less the hops and
    # host time, and spread by the LM-head stage being heavier)
    assert m["sim_stage_busy_mean"] == pytest.approx(1 / 8, abs=0.01)
    assert m["sim_stage_busy_max"] < 0.16 and m["sim_stage_busy_min"] > 0.09
    # every token costs one full ring trip of an 8-request micro-batch
    ring = cfg.cost.ring_trip(decode_shape([32 + 128] * 8))
    assert m["tpot_p50_ms"] / 1e3 == pytest.approx(ring, rel=0.05)
    # simulated power follows busy time: idle + 1/8 of the dynamic range
    hw = cfg.hw
    assert m["sim_gpu_power_w_mean"] == pytest.approx(
        hw.idle_power_w + m["sim_stage_busy_mean"] * (hw.power_limit_w - hw.idle_power_w), rel=1e-9
    )


def test_micro_batch_size_1_fills_the_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    mb1 = [*KIMI_PP8, "--pp-max-micro-batch-size", "1"]
    # With SGLang's default split (last stage: 8 layers + the 2.35 GB LM head) the LM-head stage paces
    # the 8-micro-batch ring: gain = ring(8 requests) / (8 x last stage(1 request)) ~ 2.4.
    base, full = tok_s(KIMI_PP8, closed(8)), tok_s(mb1, closed(8))
    cfg = load_config(mb1)
    s1 = [cfg.cost.stage_time(s, decode_shape([160])) for s in range(8)]
    expected = cfg.cost.ring_trip(decode_shape([160] * 8)) / (8 * max(s1))
    assert full / base == pytest.approx(expected, rel=0.05)
    assert 2.2 < full / base < 3.0
    m = predict_point(mb1, closed(8), DECODE).metrics
    assert m["sim_peak_microbatches_in_flight"] == 8 and m["sim_stage_busy_max"] > 0.95
    # Balanced stages (the LM-head stage gets 5 layers): at least 3x, as the issue expects.
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", BALANCED)
    base_b, full_b = tok_s(KIMI_PP8, closed(8)), tok_s(mb1, closed(8))
    assert full_b / base_b >= 3.0
    assert resolved_server_info(mb1)["sim_stage_layers"] == [8, 8, 8, 8, 8, 8, 8, 5]


def test_pp_throughput_rises_with_concurrency_until_the_caps_bind() -> None:
    argv = [*KIMI_PP8, "--max-running-requests", "32"]  # per-slot cap 4, request pool 32
    assert load_config(argv).pp_max_micro_batch_size == 4
    points = [closed(c, 2 * c) for c in (1, 2, 4, 8, 16, 32, 64, 128)]
    results = predict_trial(argv, points, DECODE)
    x = [r.metrics["output_tok_s"] for r in results]
    for lo, hi in itertools.pairwise(x[:6]):  # up to C = 32 = 8 slots x cap 4: strictly rising
        assert hi > 1.2 * lo
    assert x[6] == pytest.approx(x[5], rel=0.03) and x[7] == pytest.approx(x[5], rel=0.03)  # capped
    peaks = [r.metrics["sim_peak_running_reqs"] for r in results]
    assert peaks == [1, 2, 4, 8, 16, 32, 32, 32]
    assert [r.metrics["sim_peak_microbatches_in_flight"] for r in results][3:6] == [2, 4, 8]


@pytest.mark.parametrize(
    "argv",
    [
        [*KIMI_PP8, "--max-running-requests", "24", "--pp-async-batch-depth", "3"],
        [*KIMI_PP8, "--max-running-requests", "10", "--pp-max-micro-batch-size", "3"],
        ["--model-path", KIMI, "--tp-size", "8", "--sim-hardware", NVLINK, "--max-running-requests", "12"],
        [
            "--model-path",
            str(REPO / "models" / "llama-3.1-8b"),
            "--sim-hardware",
            NVLINK,
            "--max-running-requests",
            "5",
            "--dp-size",
            "2",
        ],
    ],
)
def test_running_requests_never_exceed_max_running_requests(argv: list[str]) -> None:
    mrr = load_config(argv).max_running_requests
    spec = RequestSpec(api="generate", input_len=300, output_len=24)
    overload = [closed(64, 96), LoadPoint(num_requests=80, rate=2000.0, seed=1)]
    for r in predict_trial(argv, overload, spec):
        assert r.metrics["completed"] == r.point.num_requests
        assert r.metrics["sim_peak_running_reqs"] == mrr  # reached, never exceeded (per DP replica)


def test_tp8_single_stream_is_allreduce_bound_on_pcie_but_not_on_nvlink() -> None:
    shape = decode_shape([1024])
    share = {}
    for hw in (PCIE, NVLINK):
        argv = ["--model-path", KIMI, "--tp-size", "8", "--sim-hardware", hw]
        cfg = load_config(argv)
        parts = cfg.cost.breakdown(0, shape)
        share[hw] = parts["comm"] / parts["total"]
        # the virtual-time run agrees with the cost breakdown (pp=1: overlap hides host time)
        m = predict_point(
            argv, closed(1, 2), RequestSpec(api="generate", input_len=1000, output_len=48)
        ).metrics
        assert m["tpot_p50_ms"] / 1e3 == pytest.approx(parts["total"], rel=0.05)
    assert share[PCIE] > 0.55  # 122 NCCL all-reduces x ~40 us over PCIe dominate the token
    assert share[NVLINK] < 0.40  # one-shot custom all-reduce over NVLink: a minority


def test_async_depth_helps_only_when_per_step_overheads_are_exposed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mb1 = ["--pp-max-micro-batch-size", "1"]
    point = closed(12, 24)  # enough requests for 12 slots of one

    def gain(argv: list[str]) -> float:
        return tok_s([*argv, "--pp-async-batch-depth", "4"], point) / tok_s(argv, point)

    # Hidden: on the PCIe box the LM-head stage paces the ring (8 x 5.0 ms > the 28 ms ring trip), so
    # hops and host time already overlap other micro-batches; 4 more slots change nothing.
    hidden = [*KIMI_PP8, *mb1]
    cfg = load_config(hidden)
    sh = decode_shape([160])
    assert cfg.cost.ring_trip(sh) < 8 * max(cfg.cost.stage_time(s, sh) for s in range(8))
    assert gain(hidden) == pytest.approx(1.0, abs=0.02)
    # Exposed: balanced stages and slow PP hops (0.3 ms each, as across nodes): the ring trip is longer
    # than 8 stage times, so depth 0 leaves every stage idle part of each period; depth 4 fills it.
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", BALANCED)
    profile = yaml.safe_load((REPO / "conf" / "hardware" / f"{NVLINK}.yaml").read_text())
    profile.update(name="h200-slow-pp-hops", link_latency_us=300.0)
    path = tmp_path / "slow-hops.yaml"
    path.write_text(yaml.safe_dump(profile))
    exposed = ["--model-path", KIMI, "--pp-size", "8", "--sim-hardware", str(path), *mb1]
    cfg = load_config(exposed)
    assert cfg.cost.ring_trip(sh) > 1.1 * 8 * max(cfg.cost.stage_time(s, sh) for s in range(8))
    assert gain(exposed) > 1.12


def test_prediction_api_matches_workloads_semantics() -> None:
    argv = ["--model-path", str(REPO / "models" / "tiny-test"), "--pp-size", "2", "--sim-hardware", PCIE]
    spec = RequestSpec(api="generate", input_len=64, output_len=16)
    c = predict_point(argv, LoadPoint(num_requests=10, concurrency=3, warmup_requests=2), spec)
    assert len(c.records) == 12 and sum(r.warmup for r in c.records) == 2
    assert all(r.output_tokens == 16 and sum(r.chunk_tokens) == 16 for r in c.records)
    assert c.metrics["num_requests"] == 10 and c.metrics["valid"] == 1.0 and c.invalid_reasons == []
    assert c.metrics["client_lag_p99_ms"] == 0.0
    assert c.metrics["achieved_concurrency"] == pytest.approx(3.0, rel=0.05)
    # open loop: sends follow LoadPoint.send_offsets() exactly, from the point's start
    o = LoadPoint(num_requests=20, rate=50.0, seed=7, warmup_requests=1)
    r = predict_trial(argv, [LoadPoint(num_requests=2, concurrency=1), o], spec)[1]
    t0 = min(rec.send_time for rec in r.records)
    sends = sorted(rec.send_time - t0 for rec in r.records)
    assert sends == pytest.approx(list(o.send_offsets()), abs=1e-9)
    assert r.metrics["offered_rate"] == 50.0 and r.metrics["schedule_lag_p99_ms"] == 0.0
    # max_concurrency holds requests back
    capped = LoadPoint(num_requests=30, rate=10_000.0, max_concurrency=2)
    assert predict_point(argv, capped, spec).metrics["peak_concurrency"] == 2
    # server info without serving, and bad flags raise instead of exiting
    info = resolved_server_info(argv)
    assert info["engine"] == "parasweep-sim" and info["pp_size"] == 2
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == info["max_running_requests"]
    with pytest.raises(ValueError, match="unrecognized arguments"):
        load_config([*argv, "--pp", "2"])
    with pytest.raises(ValueError, match="exceeds the 8 GPUs"):
        load_config([*argv, "--dp-size", "8"])


def test_four_trial_demo_sweep_predicts_in_well_under_a_second_of_cpu() -> None:
    import time

    spec = RequestSpec(api="generate", input_len=256, output_len=32)
    points = [
        LoadPoint(num_requests=n, concurrency=c, warmup_requests=2) for c, n in ((1, 8), (8, 16), (32, 64))
    ]
    t = time.process_time()
    results = [
        predict_trial([*KIMI_PP8, "--pp-async-batch-depth", str(d)], points, spec) for d in (0, 1, 2, 4)
    ]
    assert time.process_time() - t < 2.0
    assert all(r.metrics["valid"] == 1.0 for trial in results for r in trial)
