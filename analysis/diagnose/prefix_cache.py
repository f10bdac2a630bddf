"""Rules on the prefix cache: the hit rate far below what the prompts offered (thrash), and a shared prefix
split over DP replicas by round-robin routing."""

from __future__ import annotations

import math
from collections.abc import Mapping

from analysis.diagnose.evidence import EXTRA_ARGS_PREFIX, by_load, scheduler_evidence, some, suggest
from analysis.diagnose.facts import TrialFacts
from analysis.diagnose.kv_pool import pool_cap, pool_cap_text, running_total
from vocab.findings import Finding
from vocab.telemetry import (
    KV_USAGE_MAX,
    LOG_CACHE_HIT_RATE,
)
from vocab.values import float_or_none, int_or_none


def _reuse(m: Mapping[str, float]) -> tuple[float, float] | None:
    """(hit rate, offered hit rate) of a point's prompt tokens, where both are known: the engine's own
    per-request reports, else its log's prefill lines."""
    hit = float_or_none(m.get("cache_hit_rate"))
    if hit is None:
        hit = float_or_none(m.get(LOG_CACHE_HIT_RATE))
    offered = float_or_none(m.get("offered_hit_rate"))
    return (hit, offered) if hit is not None and offered is not None else None


def _reuse_text(label: str, hit: float, offered: float, m: Mapping[str, float]) -> str:
    computed = float_or_none(m.get("prefill_computed_tokens"))
    return (f"the engine found {hit:.0%} of the prompt tokens in its prefix cache at {label}, where the "
            f"prompts offered {offered:.0%} (what a cache that never evicts would have found)"
            + (f"; {computed:,.0f} prompt tokens computed" if computed is not None else ""))


def _round_robin_split(f: TrialFacts) -> bool:
    return f.dp_size > 1 and f.dp_router == "round_robin"


def prefix_cache_thrash(f: TrialFacts) -> list[Finding]:
    """The prefix cache loses what the workload offers it: at the busiest valid point whose prompts
    offered at least 20 % of their tokens, the engine found less than 80 % of that, and at least 10
    points less. A pool too small for the prefixes in play evicts them and computes them again. (With
    DP replicas behind round-robin, ``prefix_cache_split`` speaks instead: splitting the traffic loses
    more.) Changes, each predicted: a larger pool (the ``--max-total-tokens`` cap doubled where it sizes
    the pool, else ``mem_fraction_static`` + 0.05), ``lpm`` (admit the requests whose prefix is cached
    first, so a cached prefix is used before it is evicted), fewer running requests (what they hold and
    reserve leaves the cache no room)."""
    if _round_robin_split(f) or str(f.resolved.get("disable_radix_cache")) == "True":
        return []
    for label in by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        m = f.points[label]
        reuse = _reuse(m)
        if reuse is None:
            continue
        hit, offered = reuse
        if offered < 0.2 or hit >= 0.8 * offered or offered - hit < 0.1:
            continue
        usage = float_or_none(m.get(KV_USAGE_MAX))
        pool = int_or_none(f.resolved.get("max_total_num_tokens"))
        cap = pool_cap(f)
        mfs = float_or_none(f.resolved.get("mem_fraction_static"))
        bigger = ({f"{EXTRA_ARGS_PREFIX}max_total_tokens": 2 * cap} if cap else
                  {"server.mem_fraction_static": round(min(mfs + 0.05, 0.95), 3)}
                  if mfs is not None and mfs < 0.9 else None)
        policy = str(f.resolved.get("schedule_policy") or "fcfs")
        lpm = {"server.schedule_policy": "lpm"} if policy not in ("lpm", "dfs-weight") else None
        total = running_total(f, m)
        fewer = ({"server.max_running_requests": max(1, math.floor(total * 0.75))}
                 if total is not None and total >= 2 else None)
        own = some(bigger, lpm, fewer)
        if not own:
            return []
        pool_text = (f"; the KV pool holds {pool:,} tokens" + pool_cap_text(f)
                     + (f", used up to {usage:.0%}" if usage is not None else "") if pool else "")
        return [Finding(
            "prefix_cache_thrash", "warning", f"The prefix cache evicts what the requests share at {label}",
            _reuse_text(label, hit, offered, m) + pool_text + f" {scheduler_evidence(f)}",
            suggest("Give the cache room to keep the shared prefixes (a larger pool, or fewer running "
                     "requests), or admit the requests whose prefix is cached first (lpm).", own[0]),
            point=label, change=own[0], alternatives=own[1:])]
    return []


def prefix_cache_split(f: TrialFacts) -> list[Finding]:
    """Data parallelism splits the prefix cache: with DP replicas behind round-robin, each replica sees
    a share of every prefix's requests and computes the prefix for itself. Fires at the busiest valid
    point whose prompts offered at least 20 % of their tokens where the engine found at least 5 points
    less. Change, predicted: the cache-aware router (``dp.router=cache_aware``), which sends a prompt to
    the replica that already holds its beginning."""
    if not _round_robin_split(f) or str(f.resolved.get("disable_radix_cache")) == "True":
        return []
    for label in by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        m = f.points[label]
        reuse = _reuse(m)
        if reuse is None or reuse[1] < 0.2 or reuse[1] - reuse[0] < 0.05:
            continue
        hit, offered = reuse
        change = {"dp.router": "cache_aware"}
        return [Finding(
            "prefix_cache_split", "warning", f"{f.dp_size} replicas split the prefix cache at {label}",
            _reuse_text(label, hit, offered, m) + f"; {f.dp_size} DP replicas take requests in turn "
            f"(round-robin), so every replica computes and keeps each shared prefix {scheduler_evidence(f)}",
            suggest("Route each request to the replica that already holds its prefix.", change),
            point=label, change=change)]
    return []
