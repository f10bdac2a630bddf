"""The HTML report's plots across trials, each a PNG as a ``data:`` URI: throughput and tail latency
against load (measured solid, predicted dashed), energy per token, and predicted against measured."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from analysis.report_view import Trial, engines, short, telemetry_words
from vocab.metric_keys import PointLabel


def _fig_uri(fig: Any) -> str:
    import matplotlib.pyplot as plt

    from analysis.plots import tight_layout

    buf = io.BytesIO()
    tight_layout(fig)
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _series(points: Mapping[PointLabel, Mapping[str, float]], key: str, open_loop: bool
            ) -> tuple[list[float], list[float], list[bool]]:
    """x (load), y and the valid flag of every point of one loop kind that has ``key``."""
    xs, ys, valid = [], [], []
    for point in sorted(points):
        value = points[point].get(key)
        if point.open_loop == open_loop and value is not None and math.isfinite(value):
            xs.append(point.load)
            ys.append(value)
            valid.append(points[point].get("valid", 1.0) == 1.0)
    return xs, ys, valid


def _legend_label(trial: Trial) -> str:
    return short(trial.label, 40)


def figures(trials: Sequence[Trial]) -> list[tuple[str, str]]:
    """(caption, data URI) for every plot across trials that has data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    simulated, _ = engines(trials)
    tail = " (simulated engine, not measured)" if simulated else ""
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figures = []
    for open_loop in (False, True):
        if not any(p.open_loop == open_loop for t in trials for p in (*t.measured, *t.predicted)):
            continue
        xlabel = "request rate (req/s, open loop)" if open_loop else "concurrency (requests in flight)"
        # throughput, measured solid and predicted dashed in the trial's colour
        fig, ax = plt.subplots(figsize=(8, 4.2))
        any_pred = False
        for i, trial in enumerate(trials):
            colour = colours[i % len(colours)]
            xs, ys, valid = _series(trial.measured, "output_tok_s", open_loop)
            if xs:
                ax.plot(xs, ys, marker="o", color=colour, label=_legend_label(trial))
                bad = [(x, y) for x, y, ok in zip(xs, ys, valid, strict=True) if not ok]
                if bad:
                    ax.scatter(*zip(*bad, strict=True), s=110, facecolors="none", edgecolors="red", zorder=3)
            pxs, pys, _ = _series(trial.predicted, "output_tok_s", open_loop)
            if pxs:
                any_pred = True
                ax.plot(pxs, pys, ls="--", marker="x", color=colour, alpha=0.7)
        if any_pred:
            ax.plot([], [], ls="--", marker="x", color="grey", label="dashed: simulator's prediction")
        if any(m.get("valid", 1.0) != 1.0 for t in trials for m in t.measured.values()):
            ax.scatter([], [], s=110, facecolors="none", edgecolors="red", label="red ring: valid=0")
        ax.set(xlabel=xlabel, ylabel="output tokens / s", title=f"Output throughput{tail}")
        _load_ticks([ax], trials, open_loop)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
        figures.append((f"Output throughput against {xlabel.split(' (')[0]}, one line per trial.",
                        _fig_uri(fig)))

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, (key, name) in zip(axes, (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99")),
                                   strict=True):
            for i, trial in enumerate(trials):
                xs, ys, _ = _series(trial.measured, key, open_loop)
                if xs:
                    ax.plot(xs, ys, marker="o", color=colours[i % len(colours)], label=_legend_label(trial))
            ax.set(xlabel=xlabel, ylabel="ms", title=f"{name}{tail}")
            low, high = ax.dataLim.y0, ax.dataLim.y1
            if ax.has_data() and low > 0 and high / low > 20:  # log only where it spreads the lines apart
                ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
        _load_ticks(axes, trials, open_loop)
        if axes[0].has_data():
            axes[0].legend(fontsize="small")
        figures.append(("Tail latency: time to first token (TTFT) and inter-token latency (ITL), 99th "
                        "percentile.", _fig_uri(fig)))

        if any("j_per_output_token" in m for t in trials for m in t.measured.values()):
            fig, ax = plt.subplots(figsize=(8, 4))
            for i, trial in enumerate(trials):
                xs, ys, _ = _series(trial.measured, "j_per_output_token", open_loop)
                if xs:
                    ax.plot(xs, ys, marker="o", color=colours[i % len(colours)], label=_legend_label(trial))
            source = telemetry_words(trials)
            ax.set(xlabel=xlabel, ylabel="joules per output token", title=f"Energy per token ({source})")
            _load_ticks([ax], trials, open_loop)
            ax.grid(alpha=0.3)
            if ax.has_data():
                ax.legend(fontsize="small")
                figures.append((f"GPU energy per output token ({source}); lower is better.", _fig_uri(fig)))
            else:
                plt.close(fig)

    pairs = [(t, p, t.measured[p], t.predicted[p]) for t in trials for p in t.predicted if p in t.measured]
    if pairs:
        fig, axes = plt.subplots(1, 3, figsize=(12, 4))
        index = {id(t): i for i, t in enumerate(trials)}
        for ax, (key, name) in zip(axes, (("output_tok_s", "output tok/s"), ("ttft_p99_ms", "TTFT p99 ms"),
                                          ("itl_p99_ms", "ITL p99 ms")), strict=True):
            vals = []
            for trial, point, m, p in pairs:
                if key in m and key in p and math.isfinite(m[key]) and math.isfinite(p[key]):
                    ax.scatter(p[key], m[key], color=colours[index[id(trial)] % len(colours)])
                    ax.annotate(str(point), (p[key], m[key]), fontsize="x-small", xytext=(3, 3),
                                textcoords="offset points")
                    vals += [m[key], p[key]]
            if vals:
                lo, hi = min(vals), max(vals)
                ax.plot([lo, hi], [lo, hi], color="grey", ls=":", label="measured = predicted")
                ax.legend(fontsize="x-small", loc="upper left")
            ax.set(xlabel=f"predicted {name}", ylabel=f"measured {name}", title=name)
            ax.grid(alpha=0.3)
        fig.suptitle("Predicted (simulator, virtual time) vs measured, one dot per trial and point")
        figures.append(("Each dot is one trial at one load point (colour = trial, as above); on the dotted "
                        "line the prediction matched the measurement.", _fig_uri(fig)))
    return figures


def _load_ticks(axes: Iterable[Any], trials: Sequence[Trial], open_loop: bool) -> None:
    """Ticks at the loads that were run (1, 4, 16), not at values nobody ran (2.5); a log axis when
    they double from point to point (1 ... 256), so the low ones are not crowded into a corner."""
    from matplotlib.ticker import NullFormatter

    loads = sorted({p.load for t in trials for p in (*t.measured, *t.predicted) if p.open_loop == open_loop})
    if not loads:
        return
    spread = loads[0] > 0 and loads[-1] / loads[0] >= 16
    for ax in axes:
        if spread:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_minor_formatter(NullFormatter())
        if len(loads) <= 12:
            ax.set_xticks(loads, [f"{x:g}" for x in loads])
