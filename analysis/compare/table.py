"""The comparison on the terminal: the table of rows and the SLO choice, in words."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.compare.columns import TABLE_WIDTH
from analysis.compare.slo import Slo, SloChoice


def _fmt(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    if math.isnan(v):
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _source(row: pd.Series) -> str:
    """``sglang`` (measured on GPUs), ``sim`` (measured over HTTP on the simulated engine) or ``pred``
    (the simulator's prediction in virtual time)."""
    return "pred" if row["kind"] == "predicted" else str(row["engine"])


def _cut(text: str, width: int) -> str:
    """Cut in the middle: the sweep id at the front and the last override at the end both stay."""
    if len(text) <= width:
        return text
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + "…" + text[len(text) - tail:]


def compare_table(df: pd.DataFrame, title: str, width: int = TABLE_WIDTH) -> Table:
    """The rows as a table at most ``width`` columns wide: the numbers are never cut, the run labels
    are (their full text is in the CSV)."""
    headers = ["source", "GPUs", "C", "valid", "tok/s", "tok/s\n/GPU", "tok/s\n/user", "TTFT\np99 ms",
               "ITL\np99 ms"]
    with_energy = df["j_per_output_token"].notna().any()
    if with_energy:
        headers.append("J/tok")
    rows = []
    for _, row in df.iterrows():
        cells = [_source(row), str(row["gpus"]), str(row["concurrency"]), "yes" if row["valid"] else "NO",
                 _fmt(row["output_tok_s"]), _fmt(row["tok_s_per_gpu"]), _fmt(row["tok_s_per_user"]),
                 _fmt(row["ttft_p99_ms"]), _fmt(row["itl_p99_ms"])]
        rows.append((str(row["label"]), cells + ([_fmt(row["j_per_output_token"])] if with_energy else []),
                     bool(row["valid"])))
    widths = [max([len(line) for line in h.split("\n")] + [len(cells[i]) for _, cells, _ in rows])
              for i, h in enumerate(headers)]
    # what is left for the label once every number has its width and each column its 2-character gap
    budget = max(width - sum(widths) - 2 * len(widths), 8)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1, 0, 0), show_edge=False)
    table.add_column("run", no_wrap=True, max_width=budget)
    for i, header in enumerate(headers):
        justify = "left" if i in (0, 3) else "right"  # source and valid are words
        table.add_column(header, justify=justify, no_wrap=True, min_width=widths[i])
    for label, cells, valid in rows:
        table.add_row(escape(_cut(label, budget)), *cells, style=None if valid else "dim")
    return table


def _describe_row(row: pd.Series) -> str:
    origin = {"pred": "predicted by the simulator, not measured",
              "sim": "measured on the simulated engine, not a GPU",
              "sim-vllm": "measured on the simulated engine playing vLLM, not a GPU"}.get(_source(row),
                                                                       f"measured, {row['engine']}")
    return (f"{row['label']} at concurrency {row['concurrency']} ({origin}): {_fmt(row['tok_s_per_gpu'])} "
            f"tok/s per GPU ({_fmt(row['output_tok_s'])} tok/s on {row['gpus']} GPU(s)), "
            f"TTFT p99 {_fmt(row['ttft_p99_ms'])} ms, ITL p99 {_fmt(row['itl_p99_ms'])} ms; "
            f"run {row['run_id']}")


def print_choice(choice: SloChoice, slos: Sequence[Slo], console: Console) -> None:
    wanted = f"{', '.join(str(s) for s in slos)} (among {choice.among} rows)"
    if choice.best is not None:
        console.print(f"Best under {wanted}: " + escape(_describe_row(choice.best)))
        if choice.runner_up is not None and choice.verdict is not None:
            nxt = escape(_describe_row(choice.runner_up))
            if choice.verdict.clear:
                console.print(f"  ahead of the next, beyond the noise of both: {nxt}")
            else:
                console.print(f"  {choice.verdict.text()} of the next, so not measurably better: {nxt}")
    elif choice.closest is not None:
        misses = ", ".join(f"{k} by {v * 100:.0f} %" for k, v in choice.misses.items())
        console.print(f"No valid configuration meets {wanted}. Closest: "
                      + escape(_describe_row(choice.closest)) + f"; misses {misses}")
    else:
        console.print(f"No valid configuration meets {wanted}: no {choice.among} row is valid (the load "
                      "generator fell behind at every point)")
