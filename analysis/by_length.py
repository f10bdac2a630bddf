"""TTFT per prompt-length class, for the terminal summary and the HTML report.

Reads the per-class metrics the load generator writes where a point's prompt lengths vary
(``c8/ttft_p99_ms_in_1k-4k``, ``c8/requests_in_1k-4k``; see ``workloads/length_classes.py``), and
nothing else: a sweep of fixed-length points shows no such section.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vocab.metric_keys import MetricKey
from workloads.length_classes import CLASSES, PREFIX


@dataclass(frozen=True)
class ClassRow:
    """One trial at one point: each class's requests and TTFT p50 / p99 (ms)."""

    point: str
    trial: str
    classes: tuple[tuple[str, int, float, float], ...]


def class_rows(trials: Sequence[tuple[str, Mapping[str, float]]]) -> list[ClassRow]:
    """(trial label, its run's metrics) -> a row per trial and point with per-class numbers, points in
    load order, trials in the order given."""
    found: dict[str, dict[str, dict[str, tuple[int, float, float]]]] = {}
    order: dict[str, object] = {}
    for trial, metrics in trials:
        for key, value in metrics.items():
            parsed = MetricKey.parse(key)
            if not (parsed and parsed.point and not parsed.prefix
                    and parsed.metric.startswith(f"requests{PREFIX}")):
                continue
            cls = parsed.metric[len(f"requests{PREFIX}"):]
            label = str(parsed.point)
            order[label] = parsed.point
            p50 = metrics.get(f"{label}/ttft_p50_ms{PREFIX}{cls}", float("nan"))
            p99 = metrics.get(f"{label}/ttft_p99_ms{PREFIX}{cls}", float("nan"))
            found.setdefault(label, {}).setdefault(trial, {})[cls] = (int(value), p50, p99)
    rows = []
    for label in sorted(found, key=lambda k: order[k]):  # type: ignore[arg-type,return-value]
        for trial, _ in trials:
            per = found[label].get(trial)
            if per:
                rows.append(ClassRow(label, trial, tuple((c, *per[c]) for c in CLASSES if c in per)))
    return rows


def class_lines(rows: Sequence[ClassRow], width: int) -> list[str]:
    """The terminal's section: a heading, then one wrapped line per trial and point."""
    if not rows:
        return []
    out = ["TTFT p99 by prompt length (tokens; requests sent in the steady window, n of each):"]
    for row in rows:
        parts = [f"{c}: {p99:,.0f} ms (n={n})" for c, n, _p50, p99 in row.classes]
        out += textwrap.wrap(" · ".join(parts), width=width, initial_indent=f"  {row.point} {row.trial}  ",
                             subsequent_indent=" " * 6)
    return out
