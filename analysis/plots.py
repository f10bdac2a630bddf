"""Plots against load: per trial (throughput and latency) and per sweep (every trial on one chart);
telemetry over time (GPU power and utilisation, requests per pipeline stage) and energy per token.

Drawn by the driver once trials have ended, from what landed in MLflow and the trial directory, so a
trial's GPUs are never held while matplotlib renders. Every telemetry picture names its source in the
title (measured by NVML, or simulated), as does every load plot of the simulated engine's numbers;
the title is also written into the PNG's ``Title`` text chunk so a script can tell the source without
looking.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt

from vocab.telemetry import GpuPlace, GpuSource

Points = Mapping[int, Mapping[str, float]]  # concurrency -> metrics
LATENCIES = (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99"), ("tpot_p50_ms", "TPOT p50"))


def _nan(m: Mapping[str, float], key: str) -> float:
    return m.get(key, float("nan"))


SIMULATED_NOTE = "simulated engine, not measured"


def _marked(title: str, simulated: bool) -> str:
    """The title, on a second line naming the simulated engine when the numbers came from it."""
    return f"{title}\n({SIMULATED_NOTE})" if simulated else title


def plot_trial(points: Points, title: str, out_dir: Path, simulated: bool = False) -> list[Path]:
    """Writes ``throughput.png`` and ``latency.png`` for one trial's closed-loop points. ``simulated``:
    the numbers came from the simulated engine (live or predicted), and the titles say so."""
    if not points:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    xs = sorted(points)
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [_nan(points[x], "output_tok_s") for x in xs], marker="o")
    full = _marked(f"{_short(title)}: throughput", simulated)
    ax.set(xlabel="concurrency", ylabel="output tok/s", title=full)
    _concurrency_axis(ax, xs)
    paths.append(_save(fig, out_dir / "throughput.png", title=full))

    fig, ax = plt.subplots(figsize=(6, 4))
    shown = []
    for key, label in LATENCIES:
        ys = [_nan(points[x], key) for x in xs]
        shown += ys
        ax.plot(xs, ys, marker="o", label=label)
    full = _marked(f"{_short(title)}: latency", simulated)
    ax.set(xlabel="concurrency", ylabel="ms", title=full)
    _concurrency_axis(ax, xs)
    if any(y > 0 for y in shown):  # NaN compares false: a trial that failed before any answer has none
        ax.set_yscale("log")
    ax.legend()
    paths.append(_save(fig, out_dir / "latency.png", title=full))
    return paths


def plot_sweep(trials: Mapping[str, Points], title: str, out_dir: Path,
               simulated: bool = False) -> list[Path]:
    """Every trial's throughput and TPOT against concurrency on one figure (``sweep.png``);
    ``simulated``: some of them came from the simulated engine, and the title says so."""
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
    full = _marked(title, simulated)
    fig.suptitle(full)
    fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize="small")
    tight_layout(fig, rect=(0, 0.06 + 0.04 * ((len(names) - 1) // 4), 1, 1))  # room for the legend below
    return [_save(fig, out_dir / "sweep.png", layout=False, title=full)]


def tight_layout(fig: plt.Figure, **kwargs: object) -> None:
    """matplotlib's tight layout. Where it cannot fit (long labels in a small figure) matplotlib warns
    "Tight layout not applied" and keeps the layout it had: the figure is still drawn, and the warning
    would only reach the user's terminal."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning)
        fig.tight_layout(**kwargs)  # type: ignore[arg-type]


def _concurrency_axis(ax: plt.Axes, xs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])  # the load points themselves, not powers of two
    ax.minorticks_off()
    ax.grid(alpha=0.3)


def _short(title: str, limit: int = 48) -> str:
    return title if len(title) <= limit else title[: limit - 1] + "…"


def _save(fig: plt.Figure, path: Path, layout: bool = True, title: str = "") -> Path:
    if layout:
        tight_layout(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    # newlines would not survive every PNG reader's Title chunk
    fig.savefig(path, dpi=100, metadata={"Title": title.replace("\n", " ")} if title else None)
    plt.close(fig)
    return path


# ---- telemetry -----------------------------------------------------------------------------------

Windows = Mapping[str, tuple[float, float]]  # load-point label -> (start, end), epoch seconds
# one colour family per pipeline stage; GPUs of a stage take shades of it
STAGE_COLOURS = ("Blues", "Oranges", "Greens", "Purples", "Reds", "YlOrBr", "PuRd", "Greys")


def _ranges(gpus: Sequence[int]) -> str:
    """``0–1, 4–5``: GPU ids as runs (a stage's GPUs are contiguous within each DP replica)."""
    runs: list[list[int]] = []
    for g in sorted(gpus):
        if runs and g == runs[-1][-1] + 1:
            runs[-1].append(g)
        else:
            runs.append([g])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _shade_points(axes: Sequence[plt.Axes], windows: Windows, t0: float) -> None:
    """Shade each load point's window on every panel and name it above the top panel."""
    for i, (label, (start, end)) in enumerate(sorted(windows.items(), key=lambda kv: kv[1][0])):
        for ax in axes:
            ax.axvspan(start - t0, end - t0, color="0.85" if i % 2 == 0 else "0.92", zorder=0, lw=0)
        top = axes[0]
        top.text((start + end) / 2 - t0, 1.01, label, transform=top.get_xaxis_transform(), ha="center",
                 va="bottom", fontsize="small")


def describe_source(source: str) -> str:
    """How a title names a GPU telemetry source: the :class:`GpuSource` description ("NVML, measured",
    "simulated GPU telemetry, not measured"), or the words given when they are not a source's value
    (a sweep mixing sources says so in its own words)."""
    try:
        return GpuSource(source).describe()
    except ValueError:
        return source


def _numeric(df: pd.DataFrame, column: str) -> pd.Series:
    if column not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[column], errors="coerce").astype(float)


def plot_gpu_timeline(gpu: pd.DataFrame | None, layout: list[GpuPlace], windows: Windows, source: str,
                      title: str, path: Path) -> Path | None:
    """Per-GPU power (% of its limit) and utilisation (%) over the trial, GPUs coloured by pipeline
    stage, load points shaded. None when there is no sample to draw."""
    if gpu is None or gpu.empty or "ts" not in gpu or "gpu" not in gpu:
        return None
    ts, ids = _numeric(gpu, "ts"), _numeric(gpu, "gpu")
    power = 100 * _numeric(gpu, "power_w") / _numeric(gpu, "power_limit_w").where(lambda x: x > 0)
    df = pd.DataFrame({"ts": ts, "gpu": ids, "power": power, "util": _numeric(gpu, "util_gpu_pct")})
    df = df[df["ts"].notna() & df["gpu"].notna()].sort_values("ts", kind="stable")
    if df.empty or (df["power"].isna().all() and df["util"].isna().all()):
        return None
    df["gpu"] = df["gpu"].astype(int)
    t0 = float(df["ts"].iloc[0])
    stage_of = {p.gpu: p.pp for p in layout}
    stages: dict[int, list[int]] = {}
    for g in sorted(df["gpu"].unique()):
        stages.setdefault(stage_of.get(int(g), -1), []).append(int(g))

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for stage, gpus in sorted(stages.items()):
        cmap = plt.get_cmap("Greys" if stage < 0 else STAGE_COLOURS[stage % len(STAGE_COLOURS)])
        name = "GPUs not in the layout" if stage < 0 else f"stage {stage}"
        legend = f"{name} (GPU{'s' if len(gpus) > 1 else ''} {_ranges(gpus)})"
        for i, g in enumerate(gpus):
            colour = cmap(0.85 - 0.45 * i / max(1, len(gpus) - 1))  # darkest first, never white
            rows = df[df["gpu"] == g]
            x = rows["ts"] - t0
            top.plot(x, rows["power"], color=colour, lw=1, label=legend if i == 0 else None)
            bottom.plot(x, rows["util"], color=colour, lw=1)
    _shade_points((top, bottom), windows, t0)
    top.set(ylabel="power, % of limit", ylim=(0, 105))
    bottom.set(ylabel="GPU utilisation, %", ylim=(0, 105),
               xlabel="seconds from the first sample")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="pipeline stage")
    bottom.text(1.01, 0.0, "utilisation counts any resident kernel,\nincluding one waiting on a peer",
                transform=bottom.transAxes, fontsize="x-small", va="bottom")
    full = f"{_short(title, 70)}: GPU power and utilisation ({describe_source(source)})"
    fig.suptitle(full)
    return _save(fig, path, title=full)


def plot_stage_queues(stages: pd.DataFrame | None, windows: Windows, source: str, title: str,
                      path: Path) -> Path | None:
    """Running and waiting requests per pipeline stage over the trial (the engine log's reports when
    there are any, else its ``/metrics`` gauges), load points shaded. ``source`` names where the series
    came from (e.g. "engine log / metrics of SGLang"). None when there is nothing to draw."""
    if stages is None or stages.empty or "ts" not in stages:
        return None
    df = pd.DataFrame({c: _numeric(stages, c) for c in ("ts", "dp", "pp", "tp", "running", "queue")})
    if "source" in stages and (stages["source"] == "log").any():
        df = df[stages["source"] == "log"]
    df[["dp", "pp", "tp"]] = df[["dp", "pp", "tp"]].fillna(0)
    df = df[df["ts"].notna() & (df["running"].notna() | df["queue"].notna())].sort_values("ts", kind="stable")
    if df.empty:
        return None
    t0 = float(df["ts"].iloc[0])
    # the TP ranks of a stage replicate its scheduler: draw the lowest rank of each (replica, stage)
    df = df[df["tp"] == df.groupby(["dp", "pp"])["tp"].transform("min")]
    replicas = df["dp"].nunique() > 1
    groups = list(df.groupby(["dp", "pp"]))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for i, ((dp, pp), rows) in enumerate(groups):
        name = f"replica {int(dp)} stage {int(pp)}" if replicas else f"stage {int(pp)}"
        colour = plt.get_cmap(STAGE_COLOURS[int(pp) % len(STAGE_COLOURS)])(0.8 - 0.3 * int(dp % 2))
        # stages usually report the same numbers (they replicate the scheduler): wide lines first,
        # narrower on top, so every stage stays visible where they coincide
        style = {"color": colour, "lw": 1 + 2.5 * (len(groups) - 1 - i) / max(1, len(groups) - 1)}
        x = rows["ts"] - t0
        top.step(x, rows["running"], where="post", label=name, **style)
        bottom.step(x, rows["queue"], where="post", **style)
    _shade_points((top, bottom), windows, t0)
    top.set(ylabel="running requests\n(per micro-batch under PP)", ylim=(0, None))
    bottom.set(ylabel="waiting requests", xlabel="seconds from the first report", ylim=(0, None))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    full = f"{_short(title, 70)}: requests per stage ({source})"
    fig.suptitle(full)
    return _save(fig, path, title=full)


def plot_energy_per_token(trials: Mapping[str, Mapping[int, float]], source: str, title: str,
                          path: Path) -> Path | None:
    """GPU energy per output token against concurrency, one line per trial; ``source`` is the
    :class:`GpuSource` value of the energy counters (other words are shown as given). None when no
    trial has a finite value."""
    series = {label: {c: v for c, v in pts.items() if np.isfinite(v)} for label, pts in trials.items()}
    series = {label: pts for label, pts in series.items() if pts}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in series.items():
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", label=label)
    ax.set(xlabel="concurrency", ylabel="J per output token")
    _concurrency_axis(ax, sorted({x for pts in series.values() for x in pts}))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    full = f"{_short(title, 60)}: energy per token ({describe_source(source)})"
    ax.set_title(full, fontsize="medium")
    return _save(fig, path, title=full)
