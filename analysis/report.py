"""The end-of-sweep table: one row per trial, throughput and tail latency at each load point,
read back from the MLflow store (so what is printed is what landed)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from vocab.metric_keys import MetricKey, point_metrics
from vocab.status import Tag


def points_from_metrics(metrics: dict[str, float]) -> dict[int, dict[str, float]]:
    """``{"c8/output_tok_s": x}`` -> ``{8: {"output_tok_s": x}}`` (closed-loop points only)."""
    return {label.concurrency: values for label, values in point_metrics(metrics).items()
            if label.concurrency is not None}


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def point_labels(runs: list[Any]) -> list[str]:
    """Every load point with a measured throughput in any of the runs, closed loop first, by load."""
    labels = set()
    for run in runs:
        for key in run.data.metrics:
            parsed = MetricKey.parse(key)
            if parsed and parsed.point and not parsed.prefix and parsed.metric == "output_tok_s":
                labels.add(parsed.point)
    return [str(label) for label in sorted(labels)]


def sweep_table(runs: list[Any], title: str) -> Table:
    runs = sorted(runs, key=lambda r: int(r.data.tags.get(Tag.TRIAL_NUM, 0)))
    labels = point_labels(runs)
    with_pred = any(point_metrics(r.data.metrics, "pred") for r in runs)
    table = Table(title=title, title_justify="left")
    table.add_column("trial")
    table.add_column("status")
    for label in labels:
        table.add_column(f"{label} tok/s" + (" (predicted)" if with_pred else ""), justify="right")
        table.add_column(f"{label} TTFT p99 ms", justify="right")
        table.add_column(f"{label} ITL p99 ms", justify="right")
    for run in runs:
        tags = run.data.tags
        measured = {str(k): v for k, v in point_metrics(run.data.metrics).items()}
        predicted = {str(k): v for k, v in point_metrics(run.data.metrics, "pred").items()}
        status = tags.get(Tag.STATUS, "?")
        style = {"ok": "green", "failed": "red", "killed": "yellow"}.get(status, "")
        row = [f"#{tags.get(Tag.TRIAL_NUM, '?')} {tags.get(Tag.OVERRIDES, '')}",
               f"[{style}]{status}[/{style}]" if style else status]
        for label in labels:
            m = measured.get(label, {})
            mark = " !" if m.get("valid", 1.0) != 1.0 else ""
            tok = _num(m.get("output_tok_s")) + mark
            if "output_tok_s" in predicted.get(label, {}):
                tok += f" ({_num(predicted[label]['output_tok_s'])})"
            row += [tok, _num(m.get("ttft_p99_ms")), _num(m.get("itl_p99_ms"), "{:.2f}")]
        table.add_row(*row)
    return table


def print_sweep_summary(runs: list[Any], title: str, console: Console | None = None) -> None:
    console = console or Console()
    console.print(sweep_table(runs, title))
    if any(r.data.metrics.get(k) == 0.0 for r in runs for k in r.data.metrics if k.endswith("/valid")):
        console.print("[yellow]! = the load generator fell behind at that point (valid=0): "
                      "not a server number[/yellow]")
