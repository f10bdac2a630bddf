"""How a point's requests were spread over DP replicas behind the router package, and what each
replica's prefix cache found: from the router's own Prometheus metrics and each replica's ``/metrics``,
scraped through the trial (counters read at the window's two ends).

* ``dp<i>_request_share``: the share of the point's requests the router sent to replica ``i``
  (``smg_worker_requests_total``; scraped every ``telemetry.metrics_period_s`` of wall time, F of a
  time-scaled engine's seconds, so a share over a window of a few scrapes is approximate).
* ``dp<i>_cache_hit_rate``: replica ``i``'s prompt tokens found in its cache, of all it prefilled
  (``sglang:realtime_tokens_total``, modes ``prefill_cache`` and ``prefill_compute``).
* ``router_tree_match_frac``: the share of cache-aware decisions that followed a cached prefix (the
  rest spread load: the prefix was too short a part of the prompt, or the replicas out of balance).
* ``router_match_ratio_mean``: the mean share of a prompt the router's prefix tree matched.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd

from analysis.telemetry import counter_increase
from vocab.telemetry import per_replica

ROUTER_MATCH_FRAC = "router_tree_match_frac"
ROUTER_MATCH_RATIO = "router_match_ratio_mean"


def increase_of(rows: pd.DataFrame, start: float, end: float) -> float | None:
    """A scraped counter's increase over [start, end] (``counter_increase``)."""
    rows = rows.sort_values("ts")
    return counter_increase(rows["ts"].to_numpy(float), rows["value"].to_numpy(float), start, end)


def series_of(frame: pd.DataFrame | None, name: str, **labels: str) -> pd.DataFrame:
    """The samples of counter ``name`` whose labels include ``labels``, summed per scrape. A scrape
    that does not list the series reads 0: the router and the engines create a labelled counter at its
    first increment (the router's branch counters appear with its first cache-aware decision), so a
    scrape from before that is the counter's zero, not a missing reading."""
    if frame is None or frame.empty:
        return pd.DataFrame(columns=["ts", "value"])
    rows = frame[frame["name"] == name]
    if labels:
        parsed = [json.loads(text or "{}") for text in rows["labels"]]
        rows = rows[[all(p.get(k) == v for k, v in labels.items()) for p in parsed]]
    if rows.empty:
        return pd.DataFrame(columns=["ts", "value"])
    summed = rows.groupby("ts")["value"].sum()
    scrapes = pd.Index(sorted(frame["ts"].unique()), name="ts")
    return summed.reindex(scrapes, fill_value=0.0).reset_index()


def routing_summary(router: pd.DataFrame | None, replicas: list[pd.DataFrame | None], worker_urls: list[str],
                    start: float, end: float) -> dict[str, float]:
    """The point's summaries (see the module's docstring); replicas in rank order, as ``worker_urls``."""
    out: dict[str, float] = {}
    sent_by: dict[int, float] = {}
    for rank, url in enumerate(worker_urls):
        sent = increase_of(series_of(router, "smg_worker_requests_total", worker=url), start, end)
        if sent is not None:
            sent_by[rank] = sent
    total_sent = sum(sent_by.values())
    for rank, sent in sent_by.items():
        if total_sent > 0:
            out[per_replica(rank, "request_share")] = sent / total_sent
    for rank, frame in enumerate(replicas):
        name = "sglang:realtime_tokens_total"
        cached = increase_of(series_of(frame, name, mode="prefill_cache"), start, end)
        computed = increase_of(series_of(frame, name, mode="prefill_compute"), start, end)
        if cached is not None and computed is not None and cached + computed > 0:
            out[per_replica(rank, "cache_hit_rate")] = cached / (cached + computed)
    branches = series_of(router, "smg_cache_aware_policy_branch_total")
    if not branches.empty:
        total = increase_of(branches, start, end)
        tree_match = series_of(router, "smg_cache_aware_policy_branch_total", branch="tree_match")
        # no tree_match series while other branches are listed: no decision followed a cached prefix
        matched = increase_of(tree_match, start, end) if not tree_match.empty else 0.0
        if total and matched is not None:
            out[ROUTER_MATCH_FRAC] = matched / total
    ratio = histogram_mean([router], "smg_cache_aware_match_ratio", start, end)
    if ratio is not None:
        out[ROUTER_MATCH_RATIO] = ratio
    return out


def histogram_mean(frames: Sequence[pd.DataFrame | None], name: str, start: float, end: float,
                   **labels: str) -> float | None:
    """The mean of what histogram ``name`` counted over [start, end], over several servers' scrapes
    (the increases of its ``_sum`` and ``_count`` read at the window's ends, each summed); None where
    none counted anything."""
    total = count = 0.0
    for frame in frames:
        s = increase_of(series_of(frame, f"{name}_sum", **labels), start, end)
        n = increase_of(series_of(frame, f"{name}_count", **labels), start, end)
        if s is not None and n:
            total, count = total + s, count + n
    return total / count if count > 0 else None
