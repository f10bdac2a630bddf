"""Service-level objectives: upper bounds on a load point's latency statistics, in milliseconds
(``search.slo``: ``{itl_p99_ms: 200}``). A search finds the highest load within them; a sweep that
declares them has every suggested change of its diagnosis, and the configuration it recommends at its
end, judged within them too."""

from __future__ import annotations

import math
from collections.abc import Mapping

from orchestrator.errors import ConfigError
from workloads.metrics import STATS

# the latency statistics every load point reports (workloads/metrics.py), per-token ITL only
SLO_METRICS = tuple(f"{lat}_{stat}_ms" for lat in ("ttft", "itl", "tpot", "e2e") for stat in STATS)


def check_slo(slo: Mapping[str, float]) -> None:
    """A ``ConfigError`` naming ``search.slo.<metric>`` for an unknown metric or a bound that is not a
    positive number of milliseconds."""
    for metric, bound in slo.items():
        if metric not in SLO_METRICS:
            raise ConfigError(f"search.slo.{metric}", bound,
                              f"a bound on one of {', '.join(SLO_METRICS)}", why="unknown metric")
        if isinstance(bound, bool) or not (isinstance(bound, int | float) and bound > 0
                                           and math.isfinite(bound)):
            raise ConfigError(f"search.slo.{metric}", bound, "a positive number of milliseconds")


def worst_ratio(metrics: Mapping[str, float], slo: Mapping[str, float]) -> tuple[str, float] | None:
    """The SLO missed by the most (metric, metric / bound), or None when there is none to miss. A
    metric the point has no sample of (no ITL when every request has one token) has nothing to
    violate."""
    worst = None
    for metric, bound in slo.items():
        value = metrics.get(metric)
        if value is None or not math.isfinite(value):
            continue
        ratio = value / bound
        if worst is None or ratio > worst[1]:
            worst = (metric, ratio)
    return worst
