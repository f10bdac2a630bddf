"""The prefix cache's hit rate beside what the workload offered, for the terminal summary.

Reads the per-point metrics the load generator writes (``c8/cache_hit_rate``, ``c8/offered_hit_rate``,
``c8/prefill_computed_tokens``, ``c8/cache_flushed``; see ``workloads/prefix_reuse.py``), and behind the
router package each replica's share of the requests and hit rate (``analysis/dp_routing.py``); shows them
only where prompts shared something: random prompts offer nothing and get no section.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence

from vocab.metric_keys import MetricKey

# below this share of prompt tokens offered and hit, a sweep's prompts share nothing worth a section
NOTHING_SHARED = 0.01


def reuse_lines(trials: Sequence[tuple[str, Mapping[str, float]]], width: int) -> list[str]:
    """(trial label, its run's metrics) -> a heading and one line per trial and point, points in load
    order; [] when no point's prompts shared anything."""
    rows: list[tuple[object, str, str]] = []
    shared = False
    for trial, metrics in trials:
        for key, value in metrics.items():
            parsed = MetricKey.parse(key)
            if not (parsed and parsed.point and not parsed.prefix and parsed.metric == "cache_hit_rate"):
                continue
            label = str(parsed.point)
            offered = metrics.get(f"{label}/offered_hit_rate", math.nan)
            shared |= value > NOTHING_SHARED or offered > NOTHING_SHARED
            computed = metrics.get(f"{label}/prefill_computed_tokens", math.nan)
            cached = metrics.get(f"{label}/prefill_cached_tokens", math.nan)
            text = f"hit {100 * value:.1f} %"
            text += f" (offered {100 * offered:.1f} %)" if not math.isnan(offered) else " (offered: unknown)"
            if not math.isnan(computed):
                text += f"; prompt tokens computed {computed:,.0f}, found cached {cached:,.0f}"
            replicas = _replicas(metrics, label)
            if replicas:
                text += f"; behind the router, {replicas}"
            if metrics.get(f"{label}/cache_flushed") == 0.0:
                text += "; the cache was not flushed before it (it may hit on earlier points' prompts)"
            rows.append((parsed.point, trial, f"  {label} {trial}  {text}"))
    if not shared:
        return []
    order = {str(p): i for i, p in enumerate(sorted({r[0] for r in rows}))}  # type: ignore[type-var]
    rows.sort(key=lambda r: order[str(r[0])])
    out = ["Prefix cache (prompt tokens of the measured requests found in the engine's cache; offered: "
           "what a cache that never evicts would have found):"]
    for _, _, line in rows:
        out += textwrap.wrap(line, width=width, subsequent_indent=" " * 6)
    return out


def _replicas(metrics: Mapping[str, float], label: str) -> str:
    """``replica 0: 52 % of the requests, hit 93 %; replica 1: ...``: each DP replica's part behind the
    router package (``dp<i>_request_share``, ``dp<i>_cache_hit_rate``), or "" without a router."""
    parts = []
    rank = 0
    while f"{label}/dp{rank}_request_share" in metrics or f"{label}/dp{rank}_cache_hit_rate" in metrics:
        share = metrics.get(f"{label}/dp{rank}_request_share")
        hit = metrics.get(f"{label}/dp{rank}_cache_hit_rate")
        said = [f"{100 * share:.0f} % of the requests" if share is not None else "",
                f"hit {100 * hit:.0f} %" if hit is not None else ""]
        parts.append(f"replica {rank}: " + ", ".join(x for x in said if x))
        rank += 1
    return "; ".join(parts)
