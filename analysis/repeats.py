"""Repeated trials of one configuration (``repeats=N``: trials ``repeat=0`` ... ``repeat=N-1``, each on
a fresh engine) seen as one: every point metric is the median over the repeats, and the numbers the
"best" is judged by carry the 95 % interval of the repeats' mean (Student's t over N values), which
covers what one run's window cannot see: what changes from one engine start to the next.

The view has the shape of an MLflow run (``.data.tags``, ``.data.params``, ``.data.metrics``,
``.info``), so the summary table and the report read it as they read a trial.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vocab.metric_keys import MetricKey
from vocab.status import Tag

_REPEAT = re.compile(r"(?:^|\s)repeat=\d+")
# the metrics whose interval comes from the repeats' spread (the summary table's columns)
JUDGED = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "j_per_output_token")


def configuration(run: Any) -> str:
    """A trial's label without its ``repeat=k``: the configuration its repeats share."""
    return _REPEAT.sub("", run.data.tags.get(Tag.OVERRIDES, "")).strip()


def repeats_of(runs: Sequence[Any]) -> int:
    """How many repeats the sweep asked for (1: none)."""
    counts = [int(r.data.params.get("repeats", "1") or 1) for r in runs if r.data.params.get("repeats")]
    return max(counts, default=1)


@dataclass
class _Data:
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RepeatedRun:
    """N repeats of one configuration, read like one run."""

    data: _Data
    info: Any
    runs: list[Any]


def _t95(n: int) -> float:
    from scipy.stats import t  # imported late: scipy is large

    return float(t.ppf(0.975, n - 1))


def _combined(group: list[Any]) -> RepeatedRun:
    first = group[0]
    statuses = [r.data.tags.get(Tag.STATUS, "") for r in group]
    tags = dict(first.data.tags)
    tags[Tag.OVERRIDES] = f"{configuration(first)} ×{len(group)}".strip()
    tags[Tag.STATUS] = "ok" if all(s in ("ok", "skipped") for s in statuses) else next(
        s for s in statuses if s not in ("ok", "skipped"))
    values: dict[str, list[float]] = {}
    for run in group:
        for key, value in run.data.metrics.items():
            values.setdefault(key, []).append(value)
    metrics = {key: statistics.median(vals) for key, vals in values.items()}
    for key, vals in values.items():
        parsed = MetricKey.parse(key)
        if parsed is None or parsed.point is None or parsed.prefix:
            continue
        if parsed.metric == "valid":
            metrics[key] = min(vals)  # a point is valid only where every repeat was
        if parsed.metric not in JUDGED:
            continue
        finite = [v for v in vals if math.isfinite(v)]
        half = (_t95(len(finite)) * statistics.stdev(finite) / math.sqrt(len(finite))
                if len(finite) >= 2 else float("nan"))
        base = str(MetricKey.at(parsed.point, parsed.metric))
        metrics[f"{base}_ci95"] = half
        metrics.pop(f"{base}_ci95_lo", None)  # one run's interval: the repeats' spread replaces it
        metrics.pop(f"{base}_ci95_hi", None)
        if parsed.metric == "output_tok_s":
            median = metrics[key]
            metrics[f"{base}_ci95_rel"] = half / median if median else float("nan")
    return RepeatedRun(_Data(tags, dict(first.data.params), metrics), first.info, group)


def combine_repeats(runs: Sequence[Any]) -> list[Any]:
    """The runs with each configuration's repeats combined into one (in the order of their first
    trial); the runs as they are when the sweep has no repeats."""
    if repeats_of(runs) <= 1:
        return list(runs)
    groups: dict[str, list[Any]] = {}
    for run in sorted(runs, key=lambda r: int(r.data.tags.get(Tag.TRIAL_NUM, 0) or 0)):
        groups.setdefault(configuration(run), []).append(run)
    return [_combined(group) for group in groups.values()]
