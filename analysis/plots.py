"""Plots against load: per trial (throughput and latency) and per sweep (every trial on one chart).

Drawn by the driver once trials have ended, from what landed in MLflow, so a trial's GPUs are never
held while matplotlib renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt

Points = Mapping[int, Mapping[str, float]]  # concurrency -> metrics
LATENCIES = (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99"), ("tpot_p50_ms", "TPOT p50"))


def _nan(m: Mapping[str, float], key: str) -> float:
    return m.get(key, float("nan"))


def plot_trial(points: Points, title: str, out_dir: Path) -> list[Path]:
    """Writes ``throughput.png`` and ``latency.png`` for one trial's closed-loop points."""
    if not points:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    xs = sorted(points)
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [_nan(points[x], "output_tok_s") for x in xs], marker="o")
    ax.set(xlabel="concurrency", ylabel="output tok/s", title=f"{_short(title)}: throughput")
    _concurrency_axis(ax, xs)
    paths.append(_save(fig, out_dir / "throughput.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in LATENCIES:
        ax.plot(xs, [_nan(points[x], key) for x in xs], marker="o", label=label)
    ax.set(xlabel="concurrency", ylabel="ms", title=f"{_short(title)}: latency")
    _concurrency_axis(ax, xs)
    ax.set_yscale("log")
    ax.legend()
    paths.append(_save(fig, out_dir / "latency.png"))
    return paths


def plot_sweep(trials: Mapping[str, Points], title: str, out_dir: Path) -> list[Path]:
    """Every trial's throughput and TPOT against concurrency on one figure (``sweep.png``)."""
    trials = {label: pts for label, pts in trials.items() if pts}
    if not trials:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, pts in trials.items():
        xs = sorted(pts)
        left.plot(xs, [_nan(pts[x], "output_tok_s") for x in xs], marker="o", label=label)
        right.plot(xs, [_nan(pts[x], "tpot_p50_ms") for x in xs], marker="o", label=label)
    left.set(xlabel="concurrency", ylabel="output tok/s", title="throughput")
    right.set(xlabel="concurrency", ylabel="ms", title="TPOT p50")
    every_x = sorted({x for pts in trials.values() for x in pts})
    for ax in (left, right):
        _concurrency_axis(ax, every_x)
    handles, names = left.get_legend_handles_labels()
    fig.suptitle(title)
    fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize="small")
    fig.tight_layout(rect=(0, 0.06 + 0.04 * ((len(names) - 1) // 4), 1, 1))  # room for the legend below
    return [_save(fig, out_dir / "sweep.png", layout=False)]


def _concurrency_axis(ax: plt.Axes, xs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])  # the load points themselves, not powers of two
    ax.minorticks_off()
    ax.grid(alpha=0.3)


def _short(title: str, limit: int = 48) -> str:
    return title if len(title) <= limit else title[: limit - 1] + "…"


def _save(fig: plt.Figure, path: Path, layout: bool = True) -> Path:
    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
