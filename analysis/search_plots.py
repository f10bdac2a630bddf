"""A search's Pareto fronts, drawn from its table of candidates (``search/candidates.parquet``): output
tokens per second per GPU against tokens per second per user (what one stream sees), and against TTFT
p99, each candidate at its highest load within the SLOs. The front is the set of candidates no other
beats on both axes. Every title says whether the numbers are predicted or measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import pandas as pd

FRONT_LABELS = 8  # front candidates named on the plot at most


def pareto_front(xs: Sequence[float], ys: Sequence[float], x_higher_better: bool = True) -> list[int]:
    """Indices of the points no other point beats on both axes (y higher is better), by x."""
    sign = 1.0 if x_higher_better else -1.0
    order = sorted(range(len(xs)), key=lambda i: (-sign * xs[i], -ys[i]))
    front, best_y = [], float("-inf")
    for i in order:
        if ys[i] > best_y:
            front.append(i)
            best_y = ys[i]
    return sorted(front, key=lambda i: xs[i])


def frontier_table(table: pd.DataFrame) -> pd.DataFrame:
    """The candidates within the SLOs with the plotted quantities: ``tok_s_per_gpu``,
    ``tok_s_per_user`` (output tokens per second over the concurrency) and ``ttft_p99_ms``."""
    ok = table[(table["status"] == "ok") & (table["same_as"].fillna("") == "")].copy()
    ok = ok[ok["output_tok_s"].notna() & (ok["gpus"] > 0) & (ok["concurrency"] > 0)]
    ok["tok_s_per_gpu"] = ok["output_tok_s"] / ok["gpus"]
    ok["tok_s_per_user"] = ok["output_tok_s"] / ok["concurrency"]
    return ok.reset_index(drop=True)


def pareto_plots(table: pd.DataFrame, keys: Sequence[str], folder: Path, title: str,
                 source: str) -> list[Path]:
    """The two front plots as PNG files in ``folder``; ``source`` says where the numbers come from
    ("predicted by the simulated engine in virtual time, not measured")."""
    ok = frontier_table(table)
    if ok.empty:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    labels = [" ".join(f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in keys) for _, row in ok.iterrows()]
    out = []
    for name, x, x_label, higher in (
            ("pareto_per_user.png", "tok_s_per_user", "output tokens/s per user (one stream)", True),
            ("pareto_ttft.png", "ttft_p99_ms", "TTFT p99 (ms)", False)):
        xs, ys = ok[x].tolist(), ok["tok_s_per_gpu"].tolist()
        front = pareto_front(xs, ys, x_higher_better=higher)
        fig, ax = plt.subplots(figsize=(8, 5.5))
        ax.scatter(xs, ys, s=18, color="0.65", label="candidates within the SLOs")
        ax.plot([xs[i] for i in front], [ys[i] for i in front], "o-", color="tab:blue", label="Pareto front")
        for i in front[:FRONT_LABELS]:
            ax.annotate(labels[i], (xs[i], ys[i]), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel(x_label)
        ax.set_ylabel("output tokens/s per GPU")
        ax.set_title(f"{title}\n{source}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = folder / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out
