"""The end-of-sweep table: one row per trial, throughput and tail latency at each load point,
read back from the MLflow store (so what is printed is what landed)."""

from __future__ import annotations

import math
import re
from typing import Any

from rich.console import Console
from rich.table import Table

POINT_RE = re.compile(r"^([cr])([0-9.]+)/output_tok_s$")


def points_from_metrics(metrics: dict[str, float]) -> dict[int, dict[str, float]]:
    """``{"c8/output_tok_s": x}`` -> ``{8: {"output_tok_s": x}}`` (closed-loop points only)."""
    points: dict[int, dict[str, float]] = {}
    for key, value in metrics.items():
        head, _, name = key.partition("/")
        if name and head[:1] == "c" and head[1:].isdigit():
            points.setdefault(int(head[1:]), {})[name] = value
    return points


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def point_labels(runs: list[Any]) -> list[str]:
    labels = set()
    for run in runs:
        for key in run.data.metrics:
            m = POINT_RE.match(key)
            if m:
                labels.add((m.group(1), float(m.group(2)), f"{m.group(1)}{m.group(2)}"))
    return [label for _, _, label in sorted(labels)]


def sweep_table(runs: list[Any], title: str) -> Table:
    runs = sorted(runs, key=lambda r: int(r.data.tags.get("parasweep.trial_num", 0)))
    labels = point_labels(runs)
    with_pred = any(k.startswith("pred/") for r in runs for k in r.data.metrics)
    table = Table(title=title, title_justify="left")
    table.add_column("trial")
    table.add_column("status")
    for label in labels:
        table.add_column(f"{label} tok/s" + (" (predicted)" if with_pred else ""), justify="right")
        table.add_column(f"{label} TTFT p99 ms", justify="right")
        table.add_column(f"{label} ITL p99 ms", justify="right")
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        status = tags.get("parasweep.status", "?")
        style = {"ok": "green", "failed": "red", "killed": "yellow"}.get(status, "")
        row = [f"#{tags.get('parasweep.trial_num', '?')} {tags.get('parasweep.overrides', '')}",
               f"[{style}]{status}[/{style}]" if style else status]
        for label in labels:
            valid = metrics.get(f"{label}/valid", 1.0)
            mark = "" if valid == 1.0 or label + "/valid" not in metrics else " !"
            tok = _num(metrics.get(f"{label}/output_tok_s")) + mark
            if f"pred/{label}/output_tok_s" in metrics:
                tok += f" ({_num(metrics[f'pred/{label}/output_tok_s'])})"
            row += [tok,
                    _num(metrics.get(f"{label}/ttft_p99_ms")),
                    _num(metrics.get(f"{label}/itl_p99_ms"), "{:.2f}")]
        table.add_row(*row)
    return table


def print_sweep_summary(runs: list[Any], title: str, console: Console | None = None) -> None:
    console = console or Console()
    console.print(sweep_table(runs, title))
    if any(r.data.metrics.get(k) == 0.0 for r in runs for k in r.data.metrics if k.endswith("/valid")):
        console.print("[yellow]! = the load generator fell behind at that point (valid=0): "
                      "not a server number[/yellow]")
