"""Per-load-point summaries of the engine's own series (counters turned into rates over the window).

Works on the scraped ``/metrics`` rows (columns ts, name, labels, value). The simulated engine's
series are prefixed ``parasweep_sim:`` and summarised under ``sim_*`` names, so a simulated busy
fraction is never mistaken for a GPU measurement.
"""

from __future__ import annotations

import json

import pandas as pd

SIM_STAGE_BUSY = "parasweep_sim:stage_busy_seconds_total"
SIM_POWER = "parasweep_sim:gpu_power_watts"


def _window(df: pd.DataFrame, name: str, start: float, end: float) -> pd.DataFrame:
    rows = df[(df["name"] == name) & (df["ts"] >= start) & (df["ts"] <= end)]
    return rows


def counter_rates(df: pd.DataFrame, name: str, start: float, end: float, label: str) -> dict[str, float]:
    """Increase per second of a counter over [start, end], per value of ``label``."""
    rows = _window(df, name, start, end)
    out: dict[str, float] = {}
    for labels, group in rows.groupby("labels"):
        group = group.sort_values("ts")
        if len(group) < 2:
            continue
        dt = group["ts"].iloc[-1] - group["ts"].iloc[0]
        if dt <= 0:
            continue
        key = json.loads(labels).get(label, "")
        out[key] = (group["value"].iloc[-1] - group["value"].iloc[0]) / dt
    return out


def gauge_means(df: pd.DataFrame, name: str, start: float, end: float, label: str) -> dict[str, float]:
    rows = _window(df, name, start, end)
    return {json.loads(labels).get(label, ""): float(g["value"].mean())
            for labels, g in rows.groupby("labels")}


def point_telemetry(df: pd.DataFrame | None, start: float, end: float) -> dict[str, float]:
    """Telemetry summary metrics for one load point window (empty where the series are absent)."""
    if df is None or df.empty:
        return {}
    out: dict[str, float] = {}
    busy = counter_rates(df, SIM_STAGE_BUSY, start, end, "pp_rank")
    if busy:
        fractions = list(busy.values())
        out["sim_stage_busy_mean"] = sum(fractions) / len(fractions)
        out["sim_stage_busy_min"] = min(fractions)
        out["sim_stage_busy_max"] = max(fractions)
    power = gauge_means(df, SIM_POWER, start, end, "gpu")
    if power:
        out["sim_gpu_power_w_mean"] = sum(power.values()) / len(power)
    return out
