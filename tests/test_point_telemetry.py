"""Per-point telemetry summaries on frames built by hand: every number below is worked out from the
construction, so a summary that reads the wrong samples, integrates power or double-counts a replica
fails."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.telemetry import point_telemetry
from vocab.telemetry import (
    ENERGY_J,
    GPU_COLUMNS,
    J_PER_TOKEN,
    KV_USAGE_MAX,
    MEM_USED_MAX,
    POWER_FRAC_MAX_GPU,
    POWER_FRAC_MEAN,
    POWER_FRAC_MIN_GPU,
    POWER_FRAC_PEAK,
    QUEUE_GROWTH,
    RETRACTED,
    RUNNING_MEAN,
    STAGE_ACTIVITY_MAX,
    STAGE_ACTIVITY_MEAN,
    STAGE_ACTIVITY_MIN,
    STAGE_COLUMNS,
    THROTTLED_S,
    UTIL_MEAN,
    engine_layout,
    per_gpu,
    per_stage,
)

GIB = 1 << 30
IDLE_W, LIMIT_W = 100.0, 600.0
START, END = 102.25, 107.5  # between samples at both edges: samples at 103..107 fall inside
POWER = {0: 300.0, 1: 200.0, 2: 500.0, 3: 400.0}
UTIL = {0: 90.0, 1: 80.0, 2: 70.0, 3: 60.0}
THROTTLED_AT = {1: (104, 105), 3: (102, 106, 107)}
# GPU 0's energy counter at t = 100, 101, ...: interval k (100+k -> 101+k) adds 10*(k+1) J; GPU g's
# counter is (g+1) times that on top of an arbitrary base (a counter counts since the driver loaded)
COUNTER = np.concatenate([[0.0], np.cumsum([10.0 * (k + 1) for k in range(10)])])


def gpu_frame() -> pd.DataFrame:
    """2 stages x 2 TP ranks (engine_layout(tp=2, pp=2): GPUs 0,1 stage 0; 2,3 stage 1), sampled at
    1 Hz from t=100 to t=110."""
    rows = []
    for i, ts in enumerate(range(100, 111)):
        for g in range(4):
            power = POWER[g]
            if g == 2 and ts == 105:
                power = 590.0  # a spike inside the window: the peak
            if g == 0 and ts == 109:
                power = 600.0  # outside the window: must not count
            rows.append({"ts": float(ts), "gpu": g, "uuid": f"sim-{g}", "power_w": power,
                         "power_limit_w": LIMIT_W, "util_gpu_pct": UTIL[g], "util_mem_pct": 50.0,
                         "sm_clock_mhz": 1980.0,
                         "mem_used_bytes": float((70 if ts == 101 else 10 + g) * GIB),
                         "mem_total_bytes": 80.0 * GIB, "pcie_tx_bytes_s": 0.0, "pcie_rx_bytes_s": 0.0,
                         "temp_c": 50.0, "throttle_reasons": 4 if ts in THROTTLED_AT.get(g, ()) else 0,
                         "energy_j": 1e6 + (g + 1) * COUNTER[i]})
    return pd.DataFrame(rows, columns=list(GPU_COLUMNS))


def stage_frame() -> pd.DataFrame:
    """Log reports of two stages at 1 Hz (queue grows 2 req/s) and /metrics rows that disagree with
    them (they must lose), plus the only retraction counter (metrics)."""
    rows = []
    for ts in range(100, 111):
        for pp in (0, 1):
            rows.append({"ts": float(ts), "source": "log", "kind": "decode", "dp": 0, "pp": pp, "tp": 0,
                         "running": 8.0 if pp == 0 else 6.0, "queue": 2.0 * (ts - 100),
                         "token_usage": 0.05 * (ts - 100), "gen_throughput": 1000.0,
                         "retracted_total": np.nan})
        if ts % 2 == 0:
            retracted = {100: 5, 102: 5, 104: 7, 106: 9, 108: 12, 110: 12}[ts]
            for pp in (0, 1):  # every stage replicates the scheduler: the same counter twice
                rows.append({"ts": float(ts), "source": "metrics", "kind": "gauge", "dp": 0, "pp": pp,
                             "tp": 0, "running": 99.0, "queue": 0.0, "token_usage": 0.99,
                             "gen_throughput": np.nan, "retracted_total": float(retracted)})
    return pd.DataFrame(rows, columns=list(STAGE_COLUMNS))


def summary() -> dict[str, float]:
    return point_telemetry(gpu_frame(), stage_frame(), START, END, output_tokens=565,
                           idle_power_w=IDLE_W, layout=engine_layout(tp=2, pp=2))


def test_power_utilisation_and_memory_from_the_window_only() -> None:
    s = summary()
    gpu2_mean = (4 * 500.0 + 590.0) / 5  # samples 103..107, one of them the spike
    fracs = [300 / 600, 200 / 600, gpu2_mean / 600, 400 / 600]
    assert s[POWER_FRAC_MEAN] == pytest.approx(sum(fracs) / 4)
    assert s[POWER_FRAC_MIN_GPU] == pytest.approx(200 / 600)
    assert s[POWER_FRAC_MAX_GPU] == pytest.approx(gpu2_mean / 600)
    assert s[POWER_FRAC_PEAK] == pytest.approx(590 / 600)  # not the 600 W sample at t=109
    assert s[per_gpu(2, "power_frac_mean")] == pytest.approx(gpu2_mean / 600)
    assert s[per_gpu(2, "power_frac_peak")] == pytest.approx(590 / 600)
    assert s[per_gpu(0, "power_frac_peak")] == pytest.approx(300 / 600)
    assert s[per_gpu(3, "util_mean_pct")] == pytest.approx(60.0)
    assert s[UTIL_MEAN] == pytest.approx(75.0)
    assert s[MEM_USED_MAX] == pytest.approx(13.0)  # GPU 3's 13 GiB; the 70 GiB at t=101 is outside


def test_energy_comes_from_the_counter_interpolated_at_the_window_edges() -> None:
    s = summary()
    # GPU 0: at 102.25, 30 + 0.25 * 30 = 37.5 J; at 107.5, 280 + 0.5 * 80 = 320 J
    gpu0 = 320.0 - 37.5
    assert s[ENERGY_J] == pytest.approx(gpu0 * (1 + 2 + 3 + 4))
    assert s[J_PER_TOKEN] == pytest.approx(gpu0 * 10 / 565)
    # the power integral would say about (300 + 200 + 500 + 400) W x 5.25 s: the counter must win
    assert abs(s[ENERGY_J] - 1400 * (END - START)) > 1000


def test_a_window_between_two_samples_still_gets_its_energy_share() -> None:
    s = point_telemetry(gpu_frame(), None, 104.2, 104.7, output_tokens=0, idle_power_w=IDLE_W,
                        layout=engine_layout(tp=2, pp=2))
    assert s[ENERGY_J] == pytest.approx(0.5 * 50.0 * 10)  # half of the 50 J interval, x (1+2+3+4)
    assert J_PER_TOKEN not in s  # no tokens: no per-token figure
    assert POWER_FRAC_MEAN not in s  # no sample inside the window
    assert s[THROTTLED_S] == pytest.approx(0.5)  # GPU 1's throttled sample at 104 covers it


def test_throttled_seconds_each_sample_standing_for_the_interval_to_the_next() -> None:
    # GPU 1: samples 104 and 105 -> [104, 106) = 2 s. GPU 3: 102 -> [102.25, 103) = 0.75 s,
    # 106 -> 1 s, 107 -> [107, 107.5] = 0.5 s: 2.25 s, the longest
    assert summary()[THROTTLED_S] == pytest.approx(2.25)


def test_stage_activity_follows_the_layout() -> None:
    s = summary()
    activity = {g: (p - IDLE_W) / (LIMIT_W - IDLE_W) for g, p in POWER.items()}
    activity[2] = (4 * 0.8 + 0.98) / 5
    stage0, stage1 = (activity[0] + activity[1]) / 2, (activity[2] + activity[3]) / 2
    assert s[per_stage(0, "activity_mean")] == pytest.approx(stage0)
    assert s[per_stage(1, "activity_mean")] == pytest.approx(stage1)
    assert s[STAGE_ACTIVITY_MEAN] == pytest.approx((stage0 + stage1) / 2)
    assert (s[STAGE_ACTIVITY_MIN], s[STAGE_ACTIVITY_MAX]) == pytest.approx((stage0, stage1))
    # the same GPUs as one TP group of four: one stage, the mean of all four
    flat = point_telemetry(gpu_frame(), None, START, END, 0, IDLE_W, engine_layout(tp=4, pp=1))
    assert flat[STAGE_ACTIVITY_MEAN] == pytest.approx(sum(activity.values()) / 4)
    assert per_stage(1, "activity_mean") not in flat


def test_gpus_outside_the_layout_count_for_power_only_and_nan_limits_are_skipped() -> None:
    gpu = gpu_frame()
    gpu.loc[gpu["gpu"] == 1, "power_limit_w"] = np.nan
    s = point_telemetry(gpu, None, START, END, 0, IDLE_W, engine_layout(tp=1, pp=1))  # GPU 0 only
    assert per_gpu(1, "power_frac_mean") not in s
    assert s[POWER_FRAC_MIN_GPU] == pytest.approx(300 / 600)  # GPU 1 (200 W) has no fraction
    assert s[STAGE_ACTIVITY_MEAN] == pytest.approx(0.4)  # GPU 0 alone: (300 - 100) / 500
    assert set(s) >= {ENERGY_J, THROTTLED_S}


def test_missing_columns_give_what_can_be_computed() -> None:
    gpu = gpu_frame()[["ts", "gpu", "power_w", "power_limit_w"]]
    s = point_telemetry(gpu, None, START, END, 100, IDLE_W, engine_layout(tp=2, pp=2))
    assert s[POWER_FRAC_MEAN] > 0 and STAGE_ACTIVITY_MEAN in s
    assert not {ENERGY_J, J_PER_TOKEN, THROTTLED_S, UTIL_MEAN, MEM_USED_MAX} & set(s)
    assert all(math.isfinite(v) for v in s.values())


def test_scheduler_series_prefer_the_log_and_count_a_replica_once() -> None:
    s = summary()
    assert s[per_stage(0, "running_mean")] == pytest.approx(8.0)  # the log's, not the metrics' 99
    assert s[per_stage(1, "running_mean")] == pytest.approx(6.0)
    assert s[RUNNING_MEAN] == pytest.approx(7.0)
    assert s[per_stage(0, "queue_mean")] == pytest.approx(10.0)  # 6, 8, 10, 12, 14 at t=103..107
    assert s[QUEUE_GROWTH] == pytest.approx(2.0)  # the log's slope, not the flat metrics queue
    assert s[KV_USAGE_MAX] == pytest.approx(0.35)  # the log's usage at t=107, not 0.99
    # the only counter is the metrics': 5 at t=102 (the last report before the window) to 9 at t=106
    # (the last inside); both stages report it, the replica counts once
    assert s[RETRACTED] == pytest.approx(4.0)


def test_scheduler_series_fall_back_to_metrics_and_replicas_add_up() -> None:
    stages = stage_frame()
    metrics = stages[stages["source"] == "metrics"].copy()
    s = point_telemetry(None, metrics, START, END, 0, IDLE_W, [])
    assert s[RUNNING_MEAN] == pytest.approx(99.0) and s[KV_USAGE_MAX] == pytest.approx(0.99)
    assert QUEUE_GROWTH not in s  # two reports per stage in the window: no slope
    second = metrics.assign(dp=1)  # a second DP replica with the same history
    s2 = point_telemetry(None, pd.concat([metrics, second]), START, END, 0, IDLE_W, [])
    assert s2[RETRACTED] == pytest.approx(8.0)


def test_queue_slope_is_least_squares() -> None:
    ts = np.array([0.0, 1.0, 2.0, 3.0])
    queue = np.array([0.0, 3.0, 2.0, 7.0])
    rows = pd.DataFrame({"ts": 1000 + ts, "source": "log", "kind": "decode", "dp": 0, "pp": 0, "tp": 0,
                         "running": 1.0, "queue": queue, "token_usage": 0.1, "gen_throughput": 1.0,
                         "retracted_total": np.nan})
    s = point_telemetry(None, rows, 1000, 1003, 0, IDLE_W, [])
    assert s[QUEUE_GROWTH] == pytest.approx(np.polyfit(ts, queue, 1)[0])
    assert RETRACTED not in s  # not reported: absent, not zero


def test_nothing_recorded_gives_an_empty_summary() -> None:
    layout = engine_layout(tp=2, pp=2)
    assert point_telemetry(None, None, START, END, 10, IDLE_W, layout) == {}
    assert point_telemetry(pd.DataFrame(columns=list(GPU_COLUMNS)), pd.DataFrame(columns=list(STAGE_COLUMNS)),
                           START, END, 10, IDLE_W, layout) == {}
    # a window after every sample
    assert point_telemetry(gpu_frame(), stage_frame(), 200.0, 210.0, 10, IDLE_W, layout) == {}
