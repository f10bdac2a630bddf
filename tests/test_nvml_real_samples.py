"""The GPU telemetry path on samples a real GPU gave (tests/data/nvml/README.md): the check's phase
verdict and the per-point summaries read real NVML rows as they read the stand-in's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.telemetry import point_telemetry
from orchestrator.telemetry.gpu_check import failures, phase_stats
from vocab.telemetry import J_PER_TOKEN

SAMPLES = Path(__file__).parent / "data" / "nvml" / "h200-gpu-check-20s.parquet"


@pytest.fixture(scope="module")
def h200() -> pd.DataFrame:
    return pd.read_parquet(SAMPLES)


def _phases(df: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """The check's schedule: a quarter of the span idle, half under load, a quarter idle."""
    t0, t1 = float(df["ts"].min()), float(df["ts"].max())
    q = (t1 - t0) / 4
    return {"idle": (t0, t0 + q), "load": (t0 + q, t0 + 3 * q), "after": (t0 + 3 * q, t1)}


def test_the_check_passes_on_the_real_gpu_and_fails_with_the_phases_swapped(h200: pd.DataFrame) -> None:
    phases = {name: phase_stats(h200, name, a, b) for name, (a, b) in _phases(h200).items()}
    assert failures(phases["idle"], phases["load"]) == []
    assert failures(phases["load"], phases["after"])  # load after idle is what the check demands


def test_the_energy_counter_agrees_with_the_power_readings(h200: pd.DataFrame) -> None:
    a, b = _phases(h200)["load"]
    a, b = a + 0.5, b - 0.5  # away from the edges, where power lags the load
    summary = point_telemetry(h200, None, a, b, output_tokens=1000, idle_power_w=0.0, layout=[])
    inside = h200[h200["ts"].between(a, b)]
    integral_j = float(np.trapezoid(inside["power_w"], inside["ts"]))
    # two independent NVML readings of one quantity: the counter, and power sampled at 20 Hz
    assert summary["energy_j"] == pytest.approx(integral_j, rel=0.03)
    assert summary["j_per_output_token"] == pytest.approx(summary["energy_j"] / 1000)


def test_load_and_idle_windows_read_as_such(h200: pd.DataFrame) -> None:
    windows = _phases(h200)
    idle_w = float(h200[h200["ts"] < windows["idle"][1]]["power_w"].median())
    load = point_telemetry(h200, None, *windows["load"], output_tokens=0, idle_power_w=idle_w, layout=[])
    idle = point_telemetry(h200, None, *windows["idle"], output_tokens=0, idle_power_w=idle_w, layout=[])
    assert load["gpu_power_frac_mean"] > 0.8 > 0.3 > idle["gpu_power_frac_mean"]
    assert load["gpu_util_mean_pct"] > 90 and idle["gpu_util_mean_pct"] < 5
    # at the power limit the GPU reported the power-cap clock reason for most of the load
    assert load["gpu_throttled_s"] > 0.8 * (windows["load"][1] - windows["load"][0])
    assert idle["gpu_throttled_s"] < 0.5


def _as_the_sampler_reads_energy(gpu0: pd.DataFrame, marks: list[float]) -> pd.DataFrame:
    """``gpu0``'s samples with the energy counter kept only where the sampler now reads it: the first
    sample (its start), the first at or after each mark (a point's start and end), once a second in
    between, and the last (its stop)."""
    keep = np.zeros(len(gpu0), dtype=bool)
    last, pending = -np.inf, sorted(marks)
    for i, t in enumerate(gpu0["ts"].to_numpy(float)):
        due = bool(pending) and t >= pending[0]
        if due:
            pending.pop(0)
        if i == 0 or i == len(gpu0) - 1 or due or t - last >= 1.0:
            keep[i], last = True, t
    sparse = gpu0.copy()
    sparse.loc[~keep, "energy_j"] = np.nan
    return sparse


def test_the_energy_counter_read_once_a_second_and_at_the_marks_gives_the_same_joules(
        h200: pd.DataFrame) -> None:
    # The counter costs milliseconds of CPU a read on this GPU, so the sampler reads it at a point's
    # edges and once a second; each window's energy (hence J per token) must stay within 2 % of what
    # the counter read at every sample (20 Hz) gives. The load's start and end are the points' edges.
    gpu0 = h200[h200["gpu"] == 0].sort_values("ts").reset_index(drop=True)
    phases = _phases(gpu0)
    (a, b), t0 = phases["load"], float(gpu0["ts"].min())
    sparse = _as_the_sampler_reads_energy(gpu0, [a, b])
    assert sparse["energy_j"].notna().sum() < len(gpu0) / 10
    windows = [(a + 1.0, b - 1.0),  # a steady window inside its point
               (a + 2.3, a + 7.7),  # one between counter readings at both ends
               (t0 + 2.0, a + 3.0),  # across the idle to load step
               (a, b)]
    for start, end in windows:
        every = point_telemetry(gpu0, None, start, end, output_tokens=1000, idle_power_w=0.0, layout=[])
        seldom = point_telemetry(sparse, None, start, end, output_tokens=1000, idle_power_w=0.0, layout=[])
        assert seldom[J_PER_TOKEN] == pytest.approx(every[J_PER_TOKEN], rel=0.02), (start - t0, end - t0)
