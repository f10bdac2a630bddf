"""The comparison's plots: throughput and latency against load, and Pareto fronts, measured and predicted
series told apart in legends and titles."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt

from analysis.compare.columns import lower_is_better
from analysis.compare.slo import pareto_front
from vocab.status import PLAYS

SERIES_STYLE = {"measured": {"marker": "o", "linestyle": "-"},
                "predicted": {"marker": "^", "linestyle": "--"}}


def _series_name(label: str, kind: str, engine: str) -> str:
    if kind == "predicted":
        return f"{label} (predicted, simulator)"
    return f"{label} (sim engine)" if engine in PLAYS else label


def _title(base: str, df: pd.DataFrame) -> str:
    if not df["simulated"].any():
        return base
    what = []
    if (df["kind"] == "predicted").any():
        what.append("predictions")
    if ((df["kind"] == "measured") & df["simulated"]).any():
        what.append("the simulated engine")
    return f"{base}\nincludes simulated numbers ({' and '.join(what)}), not GPU measurements"


def _colours(df: pd.DataFrame) -> dict[str, Any]:
    cmap = plt.get_cmap("tab20" if df["label"].nunique() > 10 else "tab10")
    return {label: cmap(i % cmap.N) for i, label in enumerate(dict.fromkeys(df["label"]))}


def _save(fig: Any, path: Path, title: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # the title also goes into the PNG's Title chunk, so a script can tell simulated plots apart
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Title": title.replace("\n", " — ")})
    plt.close(fig)
    return path


def _legend(ax: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="x-small")


def _series(df: pd.DataFrame) -> Iterable[tuple[str, pd.DataFrame]]:
    for (label, kind, engine), part in df.groupby(["label", "kind", "engine"], sort=False):
        yield _series_name(str(label), str(kind), str(engine)), part.sort_values("concurrency")


def plot_throughput(df: pd.DataFrame, path: Path) -> Path:
    """Output tok/s against concurrency, a line per run (predictions dashed)."""
    colours = _colours(df)
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for name, part in _series(df):
        ax.plot(part["concurrency"], part["output_tok_s"], color=colours[part["label"].iloc[0]],
                label=name, **SERIES_STYLE[part["kind"].iloc[0]])
    xs = sorted(df["concurrency"].unique())
    if xs[-1] >= 8 * xs[0]:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])  # the load points themselves
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    title = _title("output throughput against concurrency", df)
    ax.set(xlabel="concurrency", ylabel="output tok/s", title=title)
    _legend(ax)
    return _save(fig, path, title)


def plot_latency(df: pd.DataFrame, path: Path) -> Path:
    """TTFT p99 and ITL p99 against output tok/s, a line per run."""
    colours = _colours(df)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    panels = (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99"))
    for ax, (metric, name) in zip(axes, panels, strict=True):
        for series, part in _series(df):
            ax.plot(part["output_tok_s"], part[metric], color=colours[part["label"].iloc[0]], label=series,
                    **SERIES_STYLE[part["kind"].iloc[0]])
        ax.set(xlabel="output tok/s", ylabel=f"{name}, ms", title=name)
        values = pd.to_numeric(df[metric], errors="coerce")
        values = values[values > 0]
        if not values.empty and values.max() >= 10 * values.min():  # a log axis only for a wide range
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    title = _title("latency against throughput", df)
    fig.suptitle(title)
    _legend(axes[1])
    return _save(fig, path, title)


def plot_pareto(df: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str, path: Path) -> Path:
    """Every row as a point (measured ●, predicted ▲, invalid hollow), coloured by run, and the Pareto
    front of the valid rows of each kind joined by a line, its points named by concurrency."""
    colours = _colours(df)
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    for name, part in _series(df):
        style = SERIES_STYLE[part["kind"].iloc[0]]
        colour = colours[part["label"].iloc[0]]
        for valid, sub in part.groupby("valid"):
            ax.scatter(sub[x], sub[y], marker=style["marker"], s=36,
                       label=name if valid else f"{name}, invalid",
                       facecolors=colour if valid else "none", edgecolors=colour)
    for kind, line in (("measured", "-"), ("predicted", "--")):
        rows = df[(df["kind"] == kind) & df["valid"]]
        if rows.empty:
            continue
        front = rows[pareto_front(rows, x, y)].sort_values(x)
        if front.empty:
            continue
        ax.plot(front[x], front[y], color="black", linestyle=line, linewidth=1, zorder=0,
                label=f"Pareto front ({kind})")
        for _, row in front.drop_duplicates([x, y]).iterrows():  # equal runs share one label
            ax.annotate(f"c{row['concurrency']}", (row[x], row[y]), textcoords="offset points", xytext=(4, 4),
                        fontsize="x-small")
    ax.grid(alpha=0.3)
    better = "lower" if lower_is_better(x) else "higher"
    title = _title(f"{ylabel} against {xlabel} ({better} x is better; invalid points hollow)", df)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    _legend(ax)
    return _save(fig, path, title)


def write_plots(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """throughput.png, latency.png, pareto_per_user.png, pareto_ttft.png in ``out_dir``."""
    return [plot_throughput(df, out_dir / "throughput.png"),
            plot_latency(df, out_dir / "latency.png"),
            plot_pareto(df, "tok_s_per_user", "tok_s_per_gpu", "output tok/s per user",
                        "output tok/s per GPU", out_dir / "pareto_per_user.png"),
            plot_pareto(df, "ttft_p99_ms", "tok_s_per_gpu", "TTFT p99, ms", "output tok/s per GPU",
                        out_dir / "pareto_ttft.png")]
