"""The simulated engine's GPU telemetry: the rows ``GET /parasweep_sim/gpus`` serves (``simulator/gpus.py``),
the per-point summaries predictions report under the NVML summary names, millisecond log stamps, and
(slow tier) the live server sampled by the ``GpuSampler`` through ``SimulatedGpuReader``.

Expected busy times are summed from the cost model step by step, independently of the busy-time
accounting the rows are built from, so a wrong integral or a wrong GPU placement fails here.
"""

from __future__ import annotations

import io
import math
import os
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from orchestrator.process.server import ServerProcess, free_port
from orchestrator.telemetry.gpu_sampler import GpuSampler, read_gpu_samples
from orchestrator.telemetry.server_log import parse_log_line, server_log_frame
from orchestrator.telemetry.sim_gpu_source import SimulatedGpuReader
from simulator.costs import decode_shape, prefill_shape
from simulator.entities import Request
from simulator.gpus import GPUS_PATH, gpu_rows
from simulator.logs import LogWriter, decode_line
from simulator.predict import load_config, predict_trial
from simulator.replica import ReplicaModel
from simulator.timebase import Simulation
from vocab.hardware import load_hardware
from vocab.telemetry import (
    ENERGY_J,
    GPU_COLUMNS,
    J_PER_TOKEN,
    KV_USAGE_MAX,
    POWER_FRAC_MAX_GPU,
    POWER_FRAC_MEAN,
    POWER_FRAC_MIN_GPU,
    POWER_FRAC_PEAK,
    STAGE_ACTIVITY_MAX,
    STAGE_ACTIVITY_MEAN,
    STAGE_ACTIVITY_MIN,
    UTIL_MEAN,
    per_gpu,
    per_stage,
)
from workloads import LoadPoint, RequestSpec, clock
from workloads.window import steady_window, tokens_between

REPO = Path(__file__).resolve().parent.parent
TINY = str(REPO / "models" / "tiny-test")
H200 = "h200-nvlink-x8"
# tiny-test on 8 GPUs: 2 replicas x 2 stages x 2 TP ranks
TP2PP2DP2 = ["--model-path", TINY, "--sim-hardware", H200, "--tp-size", "2", "--pp-size", "2",
             "--dp-size", "2", "--random-seed", "1"]


# -- rows of the simulated GPUs ------------------------------------------------------------------------------

def test_gpu_rows_place_gpus_like_sglang_and_integrate_the_power_model() -> None:
    cfg = load_config(TP2PP2DP2)
    hw = cfg.hw
    sim = Simulation()
    reps = [ReplicaModel(cfg, sim) for _ in range(cfg.dp)]
    n_in, n_out = 64, 8
    req = Request("r0", n_in, n_out, 7)
    reps[0].submit(req, 0.0)  # replica 1 gets nothing: its GPUs idle throughout
    # halfway through the prefill on stage 0, which starts after stage 0's pass has polled, shared the
    # request with its other TP rank, relayed it to stage 1, built the batch and prepared its forward
    prefill_0 = cfg.cost.stage_time(0, prefill_shape([(n_in, 0)]))
    h = cfg.cost.host_costs()
    mid = h.poll + h.tp_broadcast + h.gloo_send + h.schedule(1) + h.prepare(1) + prefill_0 / 2
    sim.run_until(mid)
    busy_now = gpu_rows(cfg, reps, mid)
    sim.run_until(100.0)
    assert req.finished and len(req.output_ids) == n_out

    # one prefill of the prompt, then a decode step per further token at growing context
    expected = [cfg.cost.stage_time(s, prefill_shape([(n_in, 0)]))
                + sum(cfg.cost.stage_time(s, decode_shape([n_in + k])) for k in range(1, n_out))
                for s in range(cfg.pp)]
    t = req.finish_time + 0.25
    rows = gpu_rows(cfg, reps, t)
    assert [r["gpu"] for r in rows] == list(range(8))
    assert all(list(r) == list(GPU_COLUMNS[1:]) for r in rows)
    by_gpu = {r["gpu"]: r for r in rows}
    for gpu, (dp, pp) in enumerate((d, p) for d in range(2) for p in range(2) for _ in range(2)):
        r = by_gpu[gpu]
        assert r["uuid"] == f"sim-{gpu}" and r["power_limit_w"] == hw.power_limit_w
        busy = expected[pp] if dp == 0 else 0.0
        energy = hw.idle_power_w * t + (hw.power_limit_w - hw.idle_power_w) * busy
        assert r["energy_j"] == pytest.approx(energy, rel=1e-9)
        assert r["throttle_reasons"] == 0 and math.isnan(r["temp_c"]) and math.isnan(r["sm_clock_mhz"])
        # the last second holds the whole request (it took far less): power is its busy share
        frac = busy / 1.0
        assert r["util_gpu_pct"] == pytest.approx(100 * frac, rel=1e-9)
        assert r["power_w"] == pytest.approx(hw.idle_power_w + frac * (hw.power_limit_w - hw.idle_power_w))
    # mid-prefill: both TP ranks of stage 0 have been busy for half of it; stage 1 and replica 1 not yet
    assert busy_now[0]["util_gpu_pct"] == busy_now[1]["util_gpu_pct"] == pytest.approx(100 * prefill_0 / 2)
    assert all(r["util_gpu_pct"] == 0 and r["power_w"] == hw.idle_power_w for r in busy_now[2:])
    # two seconds later the busy window is empty: idle power, and energy grows at exactly idle power
    later = gpu_rows(cfg, reps, t + 2.0)
    for a, b in zip(rows, later, strict=True):
        assert b["util_gpu_pct"] == 0 and b["power_w"] == hw.idle_power_w
        assert b["energy_j"] - a["energy_j"] == pytest.approx(2.0 * hw.idle_power_w, rel=1e-9)


def test_gpu_memory_is_the_static_pool_plus_what_sglang_keeps_outside_it() -> None:
    cfg = load_config(TP2PP2DP2)
    total = cfg.hw.memory_gb * 1e9
    rows = gpu_rows(cfg, [ReplicaModel(cfg, Simulation()) for _ in range(cfg.dp)], 0.0)
    for r in rows:
        st = cfg.stages[(r["gpu"] % (cfg.tp * cfg.pp)) // cfg.tp]
        static = st.weight_bytes + st.kv_bytes  # allocated at startup; mem_fraction_static bounds it
        assert static <= cfg.mem_fraction_static * total
        assert r["mem_total_bytes"] == total
        assert static < r["mem_used_bytes"] <= total
        assert r["mem_used_bytes"] - static <= (1 - cfg.mem_fraction_static) * total


# -- predictions report the same summaries -------------------------------------------------------------------

def test_predictions_report_the_gpu_summary_names_consistently() -> None:
    spec = RequestSpec(api="generate", input_len=100, output_len=20)
    points = [LoadPoint(num_requests=6, concurrency=4, warmup_requests=2),
              LoadPoint(num_requests=16, concurrency=8)]
    cfg = load_config(TP2PP2DP2)
    hw = cfg.hw
    for res in predict_trial(TP2PP2DP2, points, spec):
        m = res.metrics
        assert not [k for k in m if k.startswith(("sim_stage_busy", "sim_gpu_power"))]
        gpus = [m[per_gpu(g, "power_frac_mean")] for g in range(8)]
        stages = [m[per_stage(s, "activity_mean")] for s in range(cfg.pp)]
        fractions = [m[n] for n in (POWER_FRAC_MEAN, POWER_FRAC_PEAK, POWER_FRAC_MIN_GPU, POWER_FRAC_MAX_GPU)]
        fractions += gpus
        assert all(hw.idle_power_w / hw.power_limit_w < f <= 1 for f in fractions)  # every GPU did work
        assert m[POWER_FRAC_MEAN] == pytest.approx(sum(gpus) / 8)
        assert m[POWER_FRAC_MIN_GPU] == min(gpus) and m[POWER_FRAC_MAX_GPU] == max(gpus) == m[POWER_FRAC_PEAK]
        # energy over the point's window (the one its throughput is measured over) = mean power x time,
        # summed over GPUs; per output token delivered in that window, as output_tok_s counts them
        window = steady_window(res.records, res.point)
        assert window is not None and m["window_s"] == pytest.approx(window.width, rel=1e-12)
        assert m[ENERGY_J] == pytest.approx(sum(gpus) * hw.power_limit_w * window.width, rel=1e-9)
        assert m["output_tokens"] == tokens_between(res.records, window.start, window.end) > 0
        assert m[J_PER_TOKEN] * m["output_tokens"] == pytest.approx(m[ENERGY_J], rel=1e-12)
        # a stage's activity is the power above idle of its GPUs (both replicas, both TP ranks)
        for s, a in enumerate(stages):
            mine = [gpus[r * 4 + s * 2 + t] for r in range(2) for t in range(2)]
            above = [(pf * hw.power_limit_w - hw.idle_power_w) / (hw.power_limit_w - hw.idle_power_w)
                     for pf in mine]
            assert a == pytest.approx(sum(above) / 4, rel=1e-9)
        assert m[STAGE_ACTIVITY_MEAN] == pytest.approx(sum(stages) / len(stages))
        assert m[STAGE_ACTIVITY_MIN] == min(stages) and m[STAGE_ACTIVITY_MAX] == max(stages)
        assert m[UTIL_MEAN] == pytest.approx(100 * m[STAGE_ACTIVITY_MEAN])


def test_warm_up_requests_are_outside_the_energy_window() -> None:
    argv = ["--model-path", TINY, "--sim-hardware", H200, "--random-seed", "1"]
    spec = RequestSpec(api="generate", input_len=100, output_len=50)
    # one at a time, identical requests: two measured after three warm-ups cost what two after one cost
    # (one warm-up is the stream's turnover, so the window opens at the first measured send either way)
    points = [LoadPoint(num_requests=2, concurrency=1, warmup_requests=1),
              LoadPoint(num_requests=2, concurrency=1, warmup_requests=3)]
    alone, after_warmup = predict_trial(argv, points, spec)
    assert after_warmup.metrics[ENERGY_J] == pytest.approx(alone.metrics[ENERGY_J], rel=1e-6)
    assert after_warmup.metrics[J_PER_TOKEN] == pytest.approx(alone.metrics[J_PER_TOKEN], rel=1e-6)
    assert after_warmup.metrics["duration_s"] == pytest.approx(alone.metrics["duration_s"], rel=1e-6)


def test_kv_usage_max_is_the_peak_of_the_pool() -> None:
    # without the overlap scheduler, whose next batch is built before a request sent just after the first
    # one is in (it would join a batch later)
    argv = ["--model-path", TINY, "--sim-hardware", H200, "--random-seed", "1", "--disable-overlap-schedule"]
    cfg = load_config(argv)
    spec = RequestSpec(api="generate", input_len=100, output_len=20)
    # four requests prefilled in one batch and decoded together: at their last decode step each holds
    # its prompt and 19 generated tokens (the 20th is sampled, never stored)
    four, one = predict_trial(argv, [LoadPoint(num_requests=4, concurrency=4),
                                     LoadPoint(num_requests=1, concurrency=1)], spec)
    assert four.metrics[KV_USAGE_MAX] == pytest.approx(4 * (100 + 19) / cfg.max_total_num_tokens)
    assert one.metrics[KV_USAGE_MAX] == pytest.approx((100 + 19) / cfg.max_total_num_tokens)


# -- millisecond log stamps --------------------------------------------------------------------------------

@pytest.mark.parametrize("env", ["1", "true", None])
def test_log_stamps_carry_milliseconds_with_sglang_log_ms(monkeypatch: pytest.MonkeyPatch,
                                                          env: str | None) -> None:
    if env is None:
        monkeypatch.delenv("SGLANG_LOG_MS", raising=False)
    else:
        monkeypatch.setenv("SGLANG_LOG_MS", env)
    t = 1_700_000_000.98765
    out = io.StringIO()
    log = LogWriter(stream=out, wall=lambda: t)
    log.lines([(" PP1 TP0", decode_line(3, 120, 0.01, True, 512.0, 0))])
    line = out.getvalue()
    row = parse_log_line(line)
    assert row is not None and row["pp"] == 1 and row["running_req"] == 3
    if env is None:
        assert row["ts"] == int(t)
    else:
        assert ".987 PP1 TP0]" in line
        assert row["ts"] == pytest.approx(int(t) + 0.987, abs=1e-6)


# -- the live server, sampled ----------------------------------------------------------------------------

@pytest.mark.slow
def test_live_server_gpu_samples_follow_the_load(tmp_path: Path) -> None:
    from workloads import run_point

    port = free_port()
    argv = [sys.executable, "-m", "simulator", "--model-path", TINY, "--sim-hardware", H200,
            "--tp-size", "2", "--pp-size", "2", "--decode-log-interval", "1", "--port", str(port)]
    env = {**os.environ, "SGLANG_LOG_MS": "1"}
    log_path = tmp_path / "server.log"
    samples = tmp_path / "gpu.jsonl"
    with ServerProcess(argv, log_path, "127.0.0.1", port, env=env, stop_grace_s=2.0) as server:
        server.wait_ready(30.0)
        with urllib.request.urlopen(server.url + GPUS_PATH, timeout=10) as resp:
            payload = orjson.loads(resp.read())
        assert payload["source"] == "simulated" and payload["sim_time_s"] > 0 and len(payload["gpus"]) == 4
        with pytest.raises(RuntimeError, match="HTTP 404"):
            SimulatedGpuReader(server.url + "/no-such-prefix").read()

        # two clocks: the samples are on the load generator's (epoch at import, then perf_counter, so it
        # can drift from the wall clock over a long test session); the server's log on the wall clock
        before, wall_before = clock.now(), time.time()
        sampler = GpuSampler(SimulatedGpuReader(server.url), samples, hz=20).start()
        time.sleep(1.5)  # idle, longer than the busy window (1 s) so the health probe has left it
        load_start = clock.now()
        result = run_point(server.url, LoadPoint(num_requests=96, concurrency=16),
                           RequestSpec(api="generate", input_len=64, output_len=128))
        load_end = clock.now()
        sampler.stop()
        after, wall_after = clock.now(), time.time()
        assert result.metrics["completed"] == 96
    with pytest.raises(OSError):  # the server is gone: a read fails (the sampler would count it)
        SimulatedGpuReader(server.url, timeout_s=1.0).read()

    assert sampler.errors == 0 and sampler.samples >= 20
    df = read_gpu_samples(samples)
    assert df is not None and list(df.columns) == list(GPU_COLUMNS)
    per_sample = df.groupby("ts")["gpu"].apply(lambda g: sorted(g.astype(int)))
    assert all(gpus == [0, 1, 2, 3] for gpus in per_sample)  # every GPU in every sample
    assert set(df["uuid"]) == {f"sim-{g}" for g in range(4)}
    assert df["ts"].between(before, after).all()  # stamped on the load generator's clock
    assert df["sm_clock_mhz"].isna().all() and (df["throttle_reasons"] == 0).all()
    idle = df[df["ts"] < load_start]
    loaded = df[(df["ts"] > load_start + 0.3) & (df["ts"] < load_end)]
    assert len(idle) >= 4 * 10 and len(loaded) >= 4 * 5
    assert loaded["util_gpu_pct"].mean() > idle["util_gpu_pct"].mean() + 1
    assert loaded["power_w"].mean() > idle["power_w"].mean() + 5
    hw = load_hardware(H200)
    for _, g in df.sort_values("ts").groupby("gpu"):
        energy = g["energy_j"].to_numpy()
        assert (energy[1:] - energy[:-1] >= -1e-9).all()  # a counter: it never goes down
        # at --sim-time-scale 1 it grows between idle and limit power per wall second
        rate = (energy[-1] - energy[0]) / (g["ts"].iloc[-1] - g["ts"].iloc[0])
        assert 0.9 * hw.idle_power_w < rate < hw.power_limit_w

    # the scheduler's batch lines carry milliseconds and land inside the sampled span, on the wall clock
    stages = server_log_frame(log_path)
    decode = stages[stages["kind"] == "decode"]
    assert len(decode) > 10 and (decode["ts"] % 1 != 0).any()
    assert decode["ts"].between(wall_before - 0.01, wall_after + 0.01).all()
