"""Rules on latency that the pool does not explain: prefills stalling the running decodes (the ITL tail),
and requests queueing for the scheduler (the TTFT)."""

from __future__ import annotations

import math

from analysis.diagnose.data_parallel import dealt_unevenly
from analysis.diagnose.evidence import (
    EXTRA_ARGS_PREFIX,
    by_load,
    per_replica,
    scheduler_evidence,
    some,
    suggest,
)
from analysis.diagnose.facts import RESOLVED, TrialFacts
from analysis.diagnose.kv_pool import kv_bound, ttft_split_at
from analysis.diagnose.token_budget import starved_at
from vocab.findings import Finding
from vocab.telemetry import (
    PREFILL_TOKENS_MAX,
    PREFILL_TOKENS_MEAN,
    PREFILL_WITH_DECODES,
)
from vocab.values import float_or_none, int_or_none


def _smaller_chunk(chunk: int, mean_batch: float, itl_p50: float, itl_p99: float) -> int:
    """A chunked-prefill size whose prefill stalls a decode about 3 ITL p50: the mean prefill batch,
    whose stall the ITL p99 shows, scaled by 3 x p50 / p99 (prefill time grows about linearly with its
    tokens), rounded down to a power of two, at least 256 and at most half the current size."""
    target = max(256.0, mean_batch * 3 * itl_p50 / itl_p99)
    return max(256, min(chunk // 2, 1 << int(math.log2(target))))


def prefill_interference(f: TrialFacts) -> list[Finding]:
    """Long prefills stall the decodes that run beside them. SGLang runs a prefill batch before any
    decode (the running requests wait the whole prefill, and every chunk of a chunked prompt, one
    after another), unless ``--enable-mixed-chunk`` puts their decode tokens into the prefill's forward;
    a decode then waits one chunk, not one prompt. Fires at the busiest valid point where ITL p99 is at
    least 3x ITL p50 and 10 ms above it (load generator) and the engine log shows prefill batches of at
    least 256 prompt tokens on average, at least a quarter of them run while requests were decoding.

    The change turns mixed chunks on (when off) with a chunk whose prefill stalls a decode about 3 ITL
    p50 (:func:`_smaller_chunk`); the alternatives, each alone. Its goal is ITL p99: it is predicted,
    and kept, for what it does to ITL p99, and the TTFT it costs is said beside it."""
    chunk = int_or_none(f.resolved.get("chunked_prefill_size"))
    mixed_on = str(f.resolved.get("enable_mixed_chunk")).lower() == "true"
    for label in by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        values = [float_or_none(f.points[label].get(k)) for k in
                  ("itl_p50_ms", "itl_p99_ms", PREFILL_TOKENS_MAX, PREFILL_TOKENS_MEAN, PREFILL_WITH_DECODES)]
        known = [v for v in values if v is not None and math.isfinite(v)]
        if len(known) < len(values):
            continue
        p50, p99, largest, mean, beside = known
        if p50 <= 0 or p99 < 3 * p50 or p99 - p50 < 10 or mean < 256 or beside < 0.25:
            continue
        # chunked prefill off (-1): a prompt is one batch, as large as the largest seen
        enabled = chunk is not None and chunk > 0
        current = chunk if enabled else int(largest)
        mixed = {f"{EXTRA_ARGS_PREFIX}enable-mixed-chunk": True}
        smaller = ({"server.chunked_prefill_size": _smaller_chunk(current, mean, p50, p99)}
                   if current and current > 512 else None)
        if mixed_on and enabled:
            changes = some(smaller)
        else:  # mixed chunks need chunked prefill: alone they are an alternative only when it is on
            changes = some({**mixed, **(smaller or {})}, mixed if smaller and enabled else None, smaller)
        change, alternatives = (changes[0], changes[1:]) if changes else ({}, [])
        why = ("Let the running requests decode inside the prefill's forward, in shorter chunks, so a "
               "long prompt costs them one chunk's time instead of the whole prefill (a trade against "
               "TTFT).")
        return [Finding(
            "prefill_interference", "warning", f"Prefills stall the running decodes at {label}",
            f"ITL p99 {p99:.1f} ms is {p99 / p50:.1f}x ITL p50 {p50:.1f} ms at {label} (load generator); "
            f"prefill batches of {mean:,.0f} prompt tokens on average (largest {largest:,.0f}), {beside:.0%} "
            f"of them while requests were decoding, chunked_prefill_size={chunk}, mixed chunk "
            f"{'on' if mixed_on else 'off'} ({scheduler_evidence(f)[1:-1]}; sizes {RESOLVED})",
            suggest(why, change), point=label, change=change, alternatives=alternatives,
            goal="itl_p99_ms")]
    return []


# A request that comes while a step runs waits for the rest of it and, under the overlap scheduler, for
# the step built ahead of it (docs/simulator.md, "The scheduler model"): up to two decode steps in the
# queue that say nothing about the server taking requests in slower than they come
LOOP_LAG_STEPS = 2


def ttft_queueing(f: TrialFacts) -> list[Finding]:
    """TTFT is mostly waiting in the server's queue, and no cap explains it: at the busiest point where
    the queueing part of the TTFT (:func:`ttft_split_at`) is at least half of it and at least 100 ms, so is
    the median request's (when the server reported per-request times: a tail alone is a burst) and longer
    than the scheduler's own loop makes a request wait (``LOOP_LAG_STEPS`` decode steps), and
    neither the KV pool (:func:`kv_bound`, and the ``kv_capacity`` finding) nor ``max_running_requests``
    holds admission back there, nor (vLLM) do the decodes starve the prompts of the step's token budget
    (:func:`token_budget.starved_at`, the ``prefill_starved`` finding), nor are requests dealt to full DP
    ranks while others have room (:func:`data_parallel.dealt_unevenly`, the ``dp_dispatch_imbalance``
    finding): those findings carry the split
    themselves. What remains is a server
    that takes requests in slower than they come. Its own changes: twice the chunked-prefill size (fewer,
    larger prefill batches take prompts in faster) where the engine resolved one, and twice the DP
    replicas (more GPUs, where the node has them: a TTFT bought with GPUs, and the effect says so); the
    advice check adds every split of the same GPUs. All are predicted for TTFT p99 (its goal)."""
    mrr = int_or_none(f.resolved.get("max_running_requests"))
    for label in by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        split = ttft_split_at(f, label)
        if split is None or split.queue_ms < 100 or split.queue_ms < 0.5 * split.ttft_ms:
            continue
        m = f.points[label]
        p50_queue, p50_ttft = float_or_none(m.get("server_queue_p50_ms")), float_or_none(m.get("ttft_p50_ms"))
        if p50_queue is not None and p50_ttft and p50_queue < 0.5 * p50_ttft:
            continue  # only a burst queued (a closed loop's first requests all at once), not the typical one
        step = float_or_none(m.get("itl_p50_ms"))
        if p50_queue is not None and step and p50_queue < LOOP_LAG_STEPS * step:
            continue  # the typical request waited no longer than the scheduler's own loop makes it
        c = f.concurrency.get(label)
        if (kv_bound(f, label) or (mrr and c and per_replica(f, c) > mrr) or starved_at(f, label)
                or dealt_unevenly(f, label)):
            return []  # those findings carry the split themselves
        chunk = int_or_none(f.resolved.get("chunked_prefill_size"))
        # more replicas: more GPUs, bought for the TTFT. On vLLM a MoE model's DP ranks tie ep.size to
        # them (the experts span every rank), so its wider splits are left to the layouts the check adds
        own = some({"server.chunked_prefill_size": 2 * chunk} if chunk and chunk > 0 else None,
                    {"dp.size": 2 * f.dp_size} if f.plays == "sglang" or not f.moe else None)
        change, alternatives = own[0], own[1:]
        return [Finding(
            "ttft_queueing", "warning", f"Requests wait in the queue for most of their TTFT at {label}",
            f"{split.text()} at {label}; no admission cap or KV limit holds them back: the server "
            "admits requests as fast as it can prefill and run them",
            suggest("Take requests in faster (larger prefill batches, or more replicas: a wider split of "
                     "the GPUs, or more GPUs), or offer less load per replica.", change),
            point=label, change=change, alternatives=alternatives, goal="ttft_p99_ms")]
    return []
