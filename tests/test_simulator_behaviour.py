"""What the simulated engine must show about PP, TP and batching, in virtual time through the public
prediction API.

Every test configures the engine with the live server's flags (``predict_point(argv, ...)``), drives it
with ``workloads``' load modes and asserts numbers: hand-computed ones (derivation in the comment and in
docs/simulator.md, "Worked example"), monotonicity, invariants, or comparisons between configurations.
Nothing here touches the wall clock, so each test runs in milliseconds to a fraction of a second and is
deterministic.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from simulator.costs import decode_shape
from simulator.predict import load_config, predict_point, predict_trial, resolved_server_info
from vocab.telemetry import POWER_FRAC_MEAN, STAGE_ACTIVITY_MAX, STAGE_ACTIVITY_MEAN, STAGE_ACTIVITY_MIN
from workloads import LoadPoint, RequestSpec

REPO = Path(__file__).resolve().parent.parent

KIMI = str(REPO / "models" / "kimi-k2")
PCIE = "rtx-pro-6000-pcie-x8"
NVLINK = "h200-nvlink-x8"
# The numbers below are worked by hand from the roofline (docs/simulator.md, "Worked example"), so these
# tests ask for it; the measured step costs have tests of their own (test_measured_costs.py).
ROOFLINE = ["--sim-step-costs", "roofline"]
KIMI_PP8 = ["--model-path", KIMI, "--pp-size", "8", "--sim-hardware", PCIE, *ROOFLINE]
# Decode-dominated requests: a short prompt and a long answer, so throughput is decode throughput.
DECODE = RequestSpec(api="generate", input_len=32, output_len=256)
# The same, shorter: where a test runs many points, a quarter of the tokens still makes decode dominate.
SHORT_DECODE = RequestSpec(api="generate", input_len=32, output_len=64)
# A layer split that balances Kimi's LM-head stage (SGLANG_PP_LAYER_PARTITION: layers per PP stage).
BALANCED = "8,8,8,8,8,8,8,5"


def closed(c: int, n: int | None = None, warmup: int = 0) -> LoadPoint:
    return LoadPoint(num_requests=n or c, concurrency=c, warmup_requests=warmup)


def tok_s(argv: list[str], point: LoadPoint, spec: RequestSpec = DECODE) -> float:
    return predict_point(argv, point, spec).metrics["output_tok_s"]


# The hand-worked cases below send a point's first requests all at once (``send_spacing_s=0``), the
# textbook case where every request joins the first micro-batch. The live client's sends, 20 µs apart,
# put the first request in a micro-batch of its own: test_first_request_of_a_burst_rides_alone.
AT_ONCE = 0.0


def test_pp8_depth0_default_cap_runs_one_microbatch_and_stages_idle_7_of_8() -> None:
    cfg = load_config(KIMI_PP8)
    assert cfg.depth == 0 and cfg.pp_max_micro_batch_size == cfg.max_running_requests // 8 >= 8
    m = predict_point(KIMI_PP8, closed(8, 24, warmup=8), DECODE, AT_ONCE).metrics
    assert m["sim_peak_microbatches_in_flight"] == 1  # all 8 requests fit the first slot's cap
    assert m["sim_peak_running_reqs"] == 8
    # one micro-batch circles the ring: each stage works on it 1/8 of the period (less the hops and
    # host time, and spread by the LM-head stage being heavier)
    assert m[STAGE_ACTIVITY_MEAN] == pytest.approx(1 / 8, abs=0.01)
    assert m[STAGE_ACTIVITY_MAX] < 0.16 and m[STAGE_ACTIVITY_MIN] > 0.09
    # every token costs one full ring trip of an 8-request micro-batch: 99.4 ms, worked by hand in
    # test_micro_batch_size_1_fills_the_ring
    assert m["tpot_p50_ms"] == pytest.approx(99.4, rel=0.02)
    # simulated power follows busy time: on the PCIe profile (idle 40 W, limit 600 W) a GPU busy 1/8 of
    # the time draws about 40 + 560 / 8 = 110 W; and the mean over GPUs is linear in the mean busy time
    hw = cfg.hw
    assert m[POWER_FRAC_MEAN] * hw.power_limit_w == pytest.approx(110.0, abs=6.0)
    assert m[POWER_FRAC_MEAN] * hw.power_limit_w == pytest.approx(
        hw.idle_power_w + m[STAGE_ACTIVITY_MEAN] * (hw.power_limit_w - hw.idle_power_w), rel=1e-9
    )


def test_first_request_of_a_burst_rides_alone() -> None:
    """A closed-loop point's first requests leave the client ~20 µs apart. Stage 0's turn starts when the
    first one arrives and takes it alone; the others arrive during that turn's host time and form the
    next micro-batch; the closed loop keeps that grouping. A live simulated server does the same (its
    batch log shows #new-seq 1 then 7 at C = 8), which is why predictions send that way."""
    demo = RequestSpec(api="generate", input_len=256, output_len=32)
    point = closed(8, 16, warmup=2)
    spaced = predict_point(KIMI_PP8, point, demo).metrics
    at_once = predict_point(KIMI_PP8, point, demo, AT_ONCE).metrics
    assert at_once["sim_peak_microbatches_in_flight"] == 1
    assert spaced["sim_peak_microbatches_in_flight"] == 2
    # two micro-batches share the ring, but the one of 7 replays the CUDA graph of 8 (SGLang pads a batch
    # to the next captured size): 9 slots of expert work a round against 8, no faster than one batch
    assert spaced["output_tok_s"] != at_once["output_tok_s"]
    assert spaced["output_tok_s"] < at_once["output_tok_s"]
    # the grouping, hence the result, holds for any small gap; a much slower client splits the burst
    # further (at C = 32, gaps above ~150 µs)
    for gap in (1e-6, 150e-6):
        assert predict_point(KIMI_PP8, point, demo, gap).metrics["output_tok_s"] == pytest.approx(
            spaced["output_tok_s"], rel=1e-3)
    c32 = closed(32, 64, warmup=2)
    near = predict_point(KIMI_PP8, c32, demo).metrics
    slow = predict_point(KIMI_PP8, c32, demo, 400e-6).metrics
    assert slow["sim_peak_microbatches_in_flight"] > near["sim_peak_microbatches_in_flight"]


def test_micro_batch_size_1_fills_the_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    mb1 = [*KIMI_PP8, "--pp-max-micro-batch-size", "1"]
    # Worked by hand from models/kimi-k2/config.json and the PCIe profile (1,792 GB/s; docs/simulator.md,
    # "Worked example"), for 8 requests at about 160 tokens of context:
    # * default cap: all 8 share one micro-batch, so each token costs one ring trip of a batch of 8:
    #   non-expert weights 21.09 GB at 0.75 x 1,792 GB/s = 15.69 ms, plus 60 MoE layers x 59.5 experts
    #   touched x 24.77 MB at 0.60 x 1,792 GB/s = 82.28 ms, plus KV reads, graph launches, 7 hops, the
    #   return and stage 0's host work between the ids landing and the next launch (1.45 ms): 99.4 ms;
    # * micro-batch size 1: 8 micro-batches of one request; the last stage (8 MoE layers and the LM head:
    #   4.715 GB / 1,344 GB/s = 3.51 ms, 8 layers x 8 experts x 24.77 MB / 1,075 GB/s = 1.47 ms, graph
    #   launch 0.015 ms: 5.0 ms per step) is the slowest and paces the ring. At depth 0 its host waits for
    #   each forward to end (the ids it sends are queued behind it) before processing a result and building,
    #   receiving and preparing the next micro-batch: about 1.2 ms with nothing on its GPU, so a token
    #   every 8 x (5.0 + 1.2) ms.
    base = predict_point(KIMI_PP8, closed(8), DECODE, AT_ONCE).metrics
    full = predict_point(mb1, closed(8), DECODE, AT_ONCE).metrics
    cfg = load_config(mb1)
    h = cfg.cost.host_costs()
    gap = h.process(1) + h.gloo_recv + h.schedule(1) + h.object_recv + h.prepare(1)
    last = cfg.cost.stage_time(7, decode_shape([160]))
    assert base["tpot_p50_ms"] == pytest.approx(99.4, rel=0.02)
    assert full["tpot_p50_ms"] / 1e3 == pytest.approx(8 * (last + gap), rel=0.03)
    assert base["sim_peak_microbatches_in_flight"] == 1 and full["sim_peak_microbatches_in_flight"] == 8
    assert full[STAGE_ACTIVITY_MAX] == pytest.approx(last / (last + gap), abs=0.02)
    assert 1.8 < full["output_tok_s"] / base["output_tok_s"] < 3.0
    # Balanced stages (the LM-head stage gets 5 layers): the pacing stage is lighter, so the same change
    # gains more.
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", BALANCED)
    base_b = predict_point(KIMI_PP8, closed(8), DECODE, AT_ONCE).metrics["output_tok_s"]
    full_b = tok_s(mb1, closed(8))
    assert full_b / base_b >= 2.2
    assert full_b / base_b > full["output_tok_s"] / base["output_tok_s"]
    assert resolved_server_info(mb1)["sim_stage_layers"] == [8, 8, 8, 8, 8, 8, 8, 5]


def test_pp_throughput_rises_with_concurrency_until_the_caps_bind() -> None:
    argv = [*KIMI_PP8, "--max-running-requests", "32"]  # per-slot cap 4, request pool 32
    assert load_config(argv).pp_max_micro_batch_size == 4
    points = [closed(c, 2 * c) for c in (1, 2, 4, 8, 16, 32, 64, 128)]
    results = predict_trial(argv, points, SHORT_DECODE, AT_ONCE)
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
        argv = ["--model-path", KIMI, "--tp-size", "8", "--sim-hardware", hw, *ROOFLINE]
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
    # enough requests for 12 slots of one, after a warm-up wave (the window opens once it turned over)
    point = closed(12, 24, warmup=12)

    def gain(argv: list[str]) -> float:
        return (tok_s([*argv, "--pp-async-batch-depth", "4"], point, SHORT_DECODE)
                / tok_s(argv, point, SHORT_DECODE))

    # The last stage's own wait: on the PCIe box the LM-head stage paces the ring (8 x 5.0 ms > the 28 ms
    # ring trip). At depth 0 its host waits for each of its forwards to end before building the next, a
    # gap of about 1.2 ms on that GPU every step; at depth 4 the ids it sends are those of a forward 4
    # passes old, so it launches the next forward while this one runs: it idles only for prefills.
    hidden = [*KIMI_PP8, *mb1]
    cfg = load_config(hidden)
    sh = decode_shape([160])
    h = cfg.cost.host_costs()
    gap = h.process(1) + h.gloo_recv + h.schedule(1) + h.object_recv + h.prepare(1)
    last = cfg.cost.stage_time(7, sh)
    assert cfg.cost.ring_trip(sh) < 8 * last
    assert gain(hidden) == pytest.approx((last + gap) / last, rel=0.03)
    deep = predict_point([*hidden, "--pp-async-batch-depth", "4"], point, SHORT_DECODE).metrics
    assert deep[STAGE_ACTIVITY_MAX] > 0.93  # the rest: the prefills of the requests that follow
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
    assert gain(exposed) > 1.05


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


def test_closed_loop_bounded_by_duration_stops_sending_when_the_window_closes() -> None:
    argv = ["--model-path", str(REPO / "models" / "tiny-test"), "--pp-size", "2", "--sim-hardware", PCIE]
    spec = RequestSpec(api="generate", input_len=64, output_len=16)
    point = LoadPoint(concurrency=4, duration_s=0.5, warmup_requests=3)
    assert point.measured_requests is None  # the count is not known before the point runs
    r = predict_point(argv, point, spec)
    measured = sorted(rec.send_time for rec in r.records if not rec.warmup)
    # the window opens at the first measured send; nothing is sent after it closes, and the workers
    # keep the server busy until then (so it takes many more than the minimum of warmup + C requests)
    assert measured[-1] - measured[0] < 0.5 <= measured[-1] - measured[0] + 0.1
    assert len(r.records) > 4 * point.total_requests
    assert sorted(rec.index for rec in r.records) == list(range(len(r.records)))
    assert r.metrics["valid"] == 1.0 and r.metrics["num_requests"] == len(r.records) - 3
    # a count bound that comes first wins
    both = predict_point(argv, LoadPoint(concurrency=4, duration_s=0.5, num_requests=10), spec)
    assert len(both.records) == 10


def test_request_lengths_follow_the_spec_as_the_load_generator_sends_them() -> None:
    from workloads.payloads import build_body

    argv = ["--model-path", str(REPO / "models" / "tiny-test"), "--sim-hardware", PCIE]
    spec = RequestSpec(api="completions", input_len=64, output_len=16, input_dist="uniform:0.5",
                       output_dist="exponential")
    r = predict_point(argv, LoadPoint(num_requests=20, concurrency=4), spec)
    want = [build_body(spec, i)[1:] for i in range(20)]
    assert [(rec.input_tokens, rec.output_tokens) for rec in r.records] == want
    assert len({n_in for n_in, _ in want}) > 5  # the distribution really varies the lengths


def test_four_trial_demo_sweep_is_valid_and_depth_costs_little_with_nothing_to_hide() -> None:
    """The demo's loads put one or two micro-batches in the ring (the first request alone, then the rest:
    256-token prompts fit one prefill), too few for the last stage's wait to matter. Depth then buys
    nothing; it costs a little: at depth > 0 each stage receives the next slot's outputs before its
    forward, on the stream the forward waits for, and the stage before passes them on behind the hidden
    states it is itself waiting for, so a small micro-batch waits at stage k for the bigger one behind it
    to finish at stage k - 2 (docs/simulator.md, "What each stage's host does")."""
    spec = RequestSpec(api="generate", input_len=256, output_len=32)
    points = [
        LoadPoint(num_requests=n, concurrency=c, warmup_requests=2) for c, n in ((1, 8), (8, 16), (32, 64))
    ]
    results = [
        predict_trial([*KIMI_PP8, "--pp-async-batch-depth", str(d)], points, spec) for d in (0, 1, 2, 4)
    ]
    assert all(r.metrics["valid"] == 1.0 for trial in results for r in trial)
    for i in range(len(points)):
        tput = [trial[i].metrics["output_tok_s"] for trial in results]
        assert all(b <= 1.01 * tput[0] for b in tput[1:]), tput
        assert all(b >= 0.92 * tput[0] for b in tput[1:]), tput
