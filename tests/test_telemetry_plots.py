"""Telemetry pictures: each writes a PNG for a small frame, draws nothing for nothing, and says in its
title (kept in the PNG's Title text chunk) whether the numbers were measured or simulated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from analysis.plots import (
    plot_energy_per_token,
    plot_gpu_timeline,
    plot_stage_queues,
    plot_sweep,
    plot_trial,
)
from vocab.telemetry import GPU_COLUMNS, STAGE_COLUMNS, GpuSource, engine_layout

WINDOWS = {"c1": (1002.0, 1006.0), "c8": (1007.0, 1012.0)}


def gpu_frame() -> pd.DataFrame:
    rows = [{"ts": 1000 + 0.5 * i, "gpu": g, "uuid": f"sim-{g}", "power_w": 100 + 50 * g + 10 * (i % 3),
             "power_limit_w": 600.0, "util_gpu_pct": 100.0 if i > 4 else 0.0, "energy_j": 100.0 * i}
            for i in range(30) for g in range(4)]
    return pd.DataFrame(rows).reindex(columns=list(GPU_COLUMNS))


def stage_frame() -> pd.DataFrame:
    rows = [{"ts": 1000.0 + i, "source": "log", "kind": "decode", "dp": 0, "pp": pp, "tp": tp,
             "running": min(i, 8), "queue": max(0, i - 8), "token_usage": 0.1}
            for i in range(15) for pp in (0, 1) for tp in (0, 1)]
    return pd.DataFrame(rows).reindex(columns=list(STAGE_COLUMNS))


def title_of(path: Path) -> str:
    with Image.open(path) as im:
        assert im.size[0] > 300 and im.size[1] > 200
        return im.text["Title"]


@pytest.mark.parametrize("source", ["nvml", "simulated"])
def test_gpu_timeline(tmp_path: Path, source: str) -> None:
    path = plot_gpu_timeline(gpu_frame(), engine_layout(tp=2, pp=2), WINDOWS, source, "tp2 pp2",
                             tmp_path / "plots" / "gpu.png")
    assert path is not None and path.exists()
    title = title_of(path)
    assert GpuSource(source).describe() in title and "tp2 pp2" in title


def test_gpu_timeline_nothing_to_draw(tmp_path: Path) -> None:
    layout = engine_layout(tp=2, pp=2)
    assert plot_gpu_timeline(None, layout, WINDOWS, "nvml", "t", tmp_path / "a.png") is None
    assert plot_gpu_timeline(pd.DataFrame(columns=list(GPU_COLUMNS)), layout, WINDOWS, "nvml", "t",
                             tmp_path / "b.png") is None
    no_readings = gpu_frame().assign(power_w=np.nan, util_gpu_pct=np.nan)
    assert plot_gpu_timeline(no_readings, layout, WINDOWS, "nvml", "t", tmp_path / "c.png") is None
    assert not list(tmp_path.iterdir())


def test_stage_queues(tmp_path: Path) -> None:
    source = "engine log / metrics of the simulated engine, not measured"
    path = plot_stage_queues(stage_frame(), WINDOWS, source, "tp2 pp2", tmp_path / "stages.png")
    assert path is not None and source in title_of(path)
    assert plot_stage_queues(None, WINDOWS, source, "t", tmp_path / "x.png") is None
    assert plot_stage_queues(pd.DataFrame(columns=list(STAGE_COLUMNS)), WINDOWS, source, "t",
                             tmp_path / "y.png") is None


def test_energy_per_token(tmp_path: Path) -> None:
    trials = {"pp=2": {1: 4.0, 8: 1.2, 32: 0.6}, "tp=2": {1: 3.5, 8: 0.9, 32: float("nan")}}
    path = plot_energy_per_token(trials, "simulated", "sweep", tmp_path / "energy.png")
    assert path is not None and "simulated GPU telemetry, not measured" in title_of(path)
    mixed = plot_energy_per_token(trials, "mixed: NVML and simulated", "sweep", tmp_path / "mixed.png")
    assert mixed is not None and "mixed: NVML and simulated" in title_of(mixed)
    assert plot_energy_per_token({}, "nvml", "sweep", tmp_path / "e1.png") is None
    assert plot_energy_per_token({"pp=2": {1: float("nan")}}, "nvml", "sweep", tmp_path / "e2.png") is None


@pytest.mark.slow  # draws every load plot
def test_the_load_plots_still_draw(tmp_path: Path) -> None:
    points = {1: {"output_tok_s": 50.0, "ttft_p99_ms": 30.0, "itl_p99_ms": 20.0, "tpot_p50_ms": 18.0},
              8: {"output_tok_s": 300.0, "ttft_p99_ms": 60.0, "itl_p99_ms": 25.0, "tpot_p50_ms": 22.0}}
    paths = plot_trial(points, "trial", tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "latency.png"] and all(p.exists() for p in paths)
    assert all("simulated" not in title_of(p) for p in paths)
    # the simulated engine's numbers (live or predicted) say so, in the title and the PNG's Title chunk
    sim = plot_trial(points, "trial", tmp_path / "sim", simulated=True)
    assert all("simulated engine, not measured" in title_of(p) for p in sim)
    sweep = plot_sweep({"#0 pp=1": points, "#1 pp=2": points}, "every trial", tmp_path / "s", simulated=True)
    assert [p.name for p in sweep] == ["sweep.png"] and "simulated engine, not measured" in title_of(sweep[0])
    measured = plot_sweep({"#0 pp=1": points}, "every trial", tmp_path / "m")
    assert "simulated" not in title_of(measured[0])
    # a trial whose engine failed before any answer: a point with a throughput of 0 and no latency
    failed = plot_trial({1: {"output_tok_s": 0.0}}, "failed", tmp_path / "failed")
    assert [p.name for p in failed] == ["throughput.png", "latency.png"] and all(p.exists() for p in failed)
