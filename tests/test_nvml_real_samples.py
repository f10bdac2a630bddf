"""The GPU telemetry path on samples a real GPU gave (tests/data/nvml/README.md): the check's phase
verdict and the per-point summaries read real NVML rows as they read the stand-in's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.telemetry import point_telemetry
from orchestrator.telemetry.gpu_check import failures, phase_stats

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
