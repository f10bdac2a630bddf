"""Live and predicted results of the same configuration agree within 5 %.

The live side is the real thing: ``python -m simulator`` as its own process, real HTTP, driven by
``workloads.run_point``. The predicted side is ``simulator.predict.predict_point`` with the same argv and
load point. Both are compared on the model's own clock: the live server's latency histograms are in
simulated seconds (``/metrics``), so the comparison does not depend on how fast or loaded the machine is;
only the arrival times of requests (HTTP, client CPU) differ between the two runs. The live server runs
at ``--sim-time-scale 4`` to keep the test short, and the client measures it on the engine's clock
(``workloads.clock.engine_clock``), so its records agree with the engine's own histograms.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.predict import predict_point, resolved_server_info
from tests.test_simulator_server import TINY, Server
from workloads import LoadPoint, RequestSpec, clock, run_point

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# Kimi K2 PP8 on the PCIe box, one request per micro-batch: 8 micro-batches fill the ring, so the
# composition of each micro-batch does not depend on how the client's requests interleave in time.
# At the default cap it does (the first request of a burst rides alone, the rest together, unless
# the burst reaches the engine spread out): which grouping a live run lands on depends on the
# machine's load, so that comparison is a benchmark (benchmarks/demo_live_vs_predicted.py), not a test;
# the prediction's side of it is test_first_request_of_a_burst_rides_alone.
ARGV = [
    "--model-path",
    str(REPO / "models" / "kimi-k2"),
    "--pp-size",
    "8",
    "--pp-max-micro-batch-size",
    "1",
    "--sim-hardware",
    "rtx-pro-6000-pcie-x8",
    "--random-seed",
    "1",
]
POINT = LoadPoint(num_requests=16, concurrency=8)
SPEC = RequestSpec(api="generate", input_len=32, output_len=128)


def _histogram_mean(text: str, name: str) -> float:
    """Sum / count of a Prometheus histogram over all its label sets."""
    total = {"sum": 0.0, "count": 0.0}
    for part in total:
        for m in re.finditer(rf"^{re.escape(name)}_{part}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE):
            total[part] += float(m.group(1))
    assert total["count"] > 0, name
    return total["sum"] / total["count"]


def test_live_server_and_prediction_agree_within_5_percent(tmp_path: Path) -> None:
    pred = predict_point(ARGV, POINT, SPEC)
    server = Server([*ARGV, "--sim-time-scale", "4", "--enable-metrics"], tmp_path)
    try:
        info = json.loads(server.get("/server_info")[1])
        # measured on the engine's clock, as a trial measures a time-scaled engine
        # (a stall of the client's counts four times on it: on a busy machine its loop lags beyond the
        # 20 ms that marks a point invalid, while requests of seconds move by a fraction of a percent)
        with clock.engine_clock(4.0, info["sim_wall_origin"]):
            live = run_point(server.url, POINT, SPEC, lag_threshold_ms=250.0)
        metrics = server.get("/metrics")[1].decode()
    finally:
        server.stop()
    assert live.valid and pred.valid, (live.invalid_reasons, pred.invalid_reasons)
    assert live.metrics["completed"] == pred.metrics["completed"] == 16
    pm = pred.metrics
    # per-token latency and end-to-end latency, both in simulated seconds on both sides
    live_itl_ms = 1e3 * _histogram_mean(metrics, "sglang:inter_token_latency_seconds")
    live_e2e_ms = 1e3 * _histogram_mean(metrics, "sglang:e2e_request_latency_seconds")
    assert live_itl_ms == pytest.approx(pm["itl_mean_ms"], rel=0.05), (live_itl_ms, pm["itl_mean_ms"])
    assert live_e2e_ms == pytest.approx(pm["e2e_mean_ms"], rel=0.05), (live_e2e_ms, pm["e2e_mean_ms"])
    # the client's own records on the engine's clock: the engine's latencies, not a quarter of them
    lm = live.metrics
    assert lm["e2e_mean_ms"] == pytest.approx(live_e2e_ms, rel=0.02), (lm["e2e_mean_ms"], live_e2e_ms)
    assert lm["itl_mean_ms"] == pytest.approx(live_itl_ms, rel=0.05), (lm["itl_mean_ms"], live_itl_ms)
    # the engine's queue times (meta_info) are on its clock too: a share of the TTFT, not 4x less
    assert 0.0 < lm["server_queue_mean_ms"] < lm["ttft_mean_ms"]
    # the same resolved configuration on both sides
    predicted = resolved_server_info(ARGV)
    keys = ("max_running_requests", "pp_max_micro_batch_size", "max_total_num_tokens", "sim_stage_layers")
    for key in keys:
        assert info[key] == predicted[key]


def test_the_load_generator_times_a_time_scaled_engine_on_its_own_clock(tmp_path: Path) -> None:
    # python -m workloads against a simulated engine at 4x real time: it finds the engine's clock in
    # /server_info, sends the open loop's schedule in the engine's seconds (20 req/s of them, 5 of the
    # wall clock's) and measures its latencies there: the engine's own histograms agree
    server = Server(["--model-path", TINY, "--sim-hardware", "h100-sxm-x8", "--sim-time-scale", "4",
                     "--enable-metrics"], tmp_path)
    try:
        proc = subprocess.run([sys.executable, "-m", "workloads", "--url", server.url, "--api", "generate",
                               "--rate", "20", "--arrival", "constant", "--requests", "40",
                               "--input-len", "32", "--output-len", "256", "--json",
                               "--workers", "2"],  # the worker processes take the parent's clock
                              capture_output=True, text=True, timeout=120)
        metrics = server.get("/metrics")[1].decode()
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    assert "a simulated engine at 4x real time: timed on its own clock" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["offered_rate"] == 20.0
    # the schedule is in the engine's seconds: 20 a second of them (one in wall seconds would read 5)
    assert out["scheduled_rate"] == pytest.approx(20.0, rel=1e-6)
    engine_e2e_ms = 1e3 * _histogram_mean(metrics, "sglang:e2e_request_latency_seconds")
    # the client adds its own overhead and never takes any away: at least the engine's e2e, far from
    # the quarter the wall clock would read
    assert 0.97 * engine_e2e_ms <= out["e2e_mean_ms"], (out["e2e_mean_ms"], engine_e2e_ms)
    # How closely the sends followed the schedule, and how much the client added, is the client's pace
    # on this machine, each of its wall milliseconds four on the engine's clock: beside two CPU burners
    # the first send came 35 wall ms late (the rate read 21.5) and a starved client read 2.3 s of e2e
    # against the engine's 0.26. Judged where the client says it kept up (the point is valid: its rate,
    # its sends' lateness and its loop lag within their lines): a sender sleeping in wall seconds would
    # read 5 a second, one timing on the engine's clock twice over 4x the e2e. Where it did not keep
    # up, it must say so in its own pace's terms (a CI run read loop lag 18 ms and sends 19 ms late,
    # both under the 20 ms line, and still the rate over 40 requests missed by more than its tolerance)
    if out["valid"] == 1.0:
        assert out["achieved_rate"] == pytest.approx(20.0, rel=0.05)
        assert out["e2e_mean_ms"] < 2 * engine_e2e_ms, (out["e2e_mean_ms"], engine_e2e_ms)
    else:
        reasons = out["invalid_reasons"]
        pace = ("req/s vs", "sends were late", "event-loop lag")
        assert reasons and all(any(p in r for p in pace) for r in reasons), reasons
