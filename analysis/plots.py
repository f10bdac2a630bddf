"""Per-trial plots: throughput and latency against load."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt


def plot_trial(points: Mapping[int, Mapping[str, float]], title: str, out_dir: Path) -> list[Path]:
    """``points``: concurrency -> metrics. Writes plots/throughput.png and plots/latency.png."""
    if not points:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    xs = sorted(points)
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [points[x].get("output_tok_s", float("nan")) for x in xs], marker="o")
    ax.set(xlabel="concurrency", ylabel="output tok/s", title=f"{title}: throughput")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out_dir / "throughput.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99"), ("tpot_p50_ms", "TPOT p50")):
        ax.plot(xs, [points[x].get(key, float("nan")) for x in xs], marker="o", label=label)
    ax.set(xlabel="concurrency", ylabel="ms", title=f"{title}: latency")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out_dir / "latency.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written
