"""Rules on the KV pool: where a point's TTFT went (queueing against compute), whether admission was
bound by the pool's room, and the finding when the pool is full or requests are retracted."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from analysis.diagnose.evidence import (
    EXTRA_ARGS_PREFIX,
    by_load,
    per_replica,
    scheduler_evidence,
    some,
    suggest,
)
from analysis.diagnose.facts import TrialFacts
from vocab.findings import Finding
from vocab.model import CLIP_MAX_NEW_TOKENS
from vocab.telemetry import (
    KV_USAGE_MAX,
    LOG_CACHE_HIT_RATE,
    QUEUE_MEAN,
    RETRACTED,
    RUNNING_MEAN,
    per_stage,
)
from vocab.values import float_or_none, int_or_none


@dataclass(frozen=True)
class TtftSplit:
    """Where a point's TTFT went: ``stat`` ("p99" or "mean") of TTFT, of which ``queue_ms`` was spent
    waiting in the server's queue, read from ``source``."""

    stat: str
    ttft_ms: float
    queue_ms: float
    source: str

    def text(self) -> str:
        return (f"TTFT {self.stat} {_ms(self.ttft_ms)}, of which {_ms(self.queue_ms)} "
                f"({self.queue_ms / self.ttft_ms:.0%}) queueing ({self.source})")


def _ms(value: float) -> str:
    return f"{value / 1e3:.1f} s" if value >= 1e3 else f"{value:.0f} ms"


def ttft_split_at(f: TrialFacts, label: str) -> TtftSplit | None:
    """The TTFT split at a point: from the server's own per-request queue time where it reported one
    (the requests in the TTFT p99 tail), else the mean wait by Little's law from the engine's queue
    reports (mean waiting requests / completed requests per second) against the mean TTFT."""
    m = f.points[label]
    simulated = scheduler_evidence(f) != "(engine log / metrics)"
    ttft, queue = float_or_none(m.get("ttft_p99_ms")), float_or_none(m.get("ttft_p99_queue_ms"))
    if ttft is not None and queue is not None and math.isfinite(ttft) and ttft > 0:
        reported = "simulated engine's report, not measured" if simulated else "reported by the engine"
        return TtftSplit("p99", ttft, queue, f"each request's queue time, {reported}")
    waiting, rate = float_or_none(m.get(QUEUE_MEAN)), float_or_none(m.get("request_s"))
    mean = float_or_none(m.get("ttft_mean_ms"))
    if waiting is None or not rate or mean is None or not math.isfinite(mean) or mean <= 0:
        return None
    return TtftSplit("mean", mean, min(1e3 * waiting / rate, mean),
                     f"Little's law: {waiting:.1f} waiting / {rate:.2f} req/s, "
                     f"{scheduler_evidence(f)[1:-1]}")


def running_total(f: TrialFacts, m: Mapping[str, float]) -> float | None:
    """Requests one replica runs: the series' running count, times the micro-batches in flight under
    PP (where the series reports one micro-batch)."""
    running = float_or_none(m.get(RUNNING_MEAN))
    slots = f.pp_size + f.async_depth if f.pp_size > 1 else 1
    return running * slots if running is not None else None


def _waiting(f: TrialFacts, m: Mapping[str, float]) -> float | None:
    """Mean requests waiting at one replica."""
    total = float_or_none(m.get(QUEUE_MEAN))
    if total is not None:
        return total / max(1, f.dp_size * f.attn_dp)
    stages = [float_or_none(m.get(per_stage(s, "queue_mean"))) for s in range(f.pp_size)]
    known = [q for q in stages if q is not None]
    return max(known) if known else None


def _kv_pool_fit(f: TrialFacts, m: Mapping[str, float] | None = None) -> tuple[int, float, int] | None:
    """(pool tokens, tokens one request takes, whole requests the pool holds) at the workload's mean
    lengths. A request is admitted only with room for its prompt and every decode token it may still
    produce (SGLang reserves them in full for a request that ignores EOS, as a benchmark's do, and clips
    the reservation at 4,096), so a request takes prompt + output tokens of the pool from admission on.
    Where the point's prompts were found in the prefix cache (``m``'s hit rate), only the uncached share
    of a prompt is its own: the shared part is held once, for all. The pool holds whole requests: a
    12,000-token pool holds 5 requests of 2,080 tokens, not 5.8."""
    pool = int_or_none(f.resolved.get("max_total_num_tokens"))
    if not pool or f.input_len <= 0 or f.output_len <= 0:
        return None
    hit = 0.0
    if m is not None:
        hit = float_or_none(m.get("cache_hit_rate")) or float_or_none(m.get(LOG_CACHE_HIT_RATE)) or 0.0
    need = f.input_len * (1.0 - min(max(hit, 0.0), 1.0)) + min(f.output_len, CLIP_MAX_NEW_TOKENS)
    return pool, need, int(pool // need)


def kv_bound(f: TrialFacts, label: str) -> str | None:
    """Why admission at ``label`` was held back by the KV pool, or None: requests waited (mean queue
    >= 1) while the running requests stayed below the concurrency and both admission caps, and the
    pool, used plus reserved for their remaining decode tokens, had no room for one more request
    (fewer than 1.5 requests' worth left at the mean lengths, so most of the time none). vLLM's:
    :func:`_vllm_kv_bound`."""
    m = f.points[label]
    if f.plays == "vllm":
        return _vllm_kv_bound(f, m)
    fit = _kv_pool_fit(f, m)
    waiting, total = _waiting(f, m), running_total(f, m)
    if fit is None or waiting is None or total is None or waiting < 1:
        return None
    pool, need, fits = fit
    mrr = int_or_none(f.resolved.get("max_running_requests"))
    cap = int_or_none(f.resolved.get("pp_max_micro_batch_size"))
    running = float_or_none(m.get(RUNNING_MEAN))
    c = f.concurrency.get(label)
    offered = per_replica(f, c) if c else None
    if (mrr is not None and total >= 0.9 * mrr) or (offered is not None and total >= 0.9 * offered) or (
            cap is not None and f.pp_size > 1 and running is not None and running >= 0.9 * cap):
        return None
    if fits - total >= 1.5:
        return None
    prompt = need - min(f.output_len, CLIP_MAX_NEW_TOKENS)  # less what the prefix cache shares
    below = " and ".join(x for x in (f"the concurrency {offered}" if offered else "",
                                  f"max_running_requests={mrr}" if mrr else "") if x)
    return (f"{waiting:.1f} requests waited on average while about {total:.1f} ran"
            + (f", below {below}" if below else "")
            + f"; at {prompt:,.0f} + {min(f.output_len, CLIP_MAX_NEW_TOKENS):,.0f} tokens a request "
              f"({'prompt' if prompt >= f.input_len else 'uncached prompt'} and every decode token, "
              f"reserved at admission) the {pool:,}-token KV pool holds "
              f"{fits} request{'s' if fits != 1 else ''}" + pool_cap_text(f))


def _vllm_kv_bound(f: TrialFacts, m: Mapping[str, float]) -> str | None:
    """vLLM reserves no decode tokens at admission (it preempts when they run out); a waiting request is
    admitted when its prompt (from 0.19; before, its first chunk) fits in the free blocks. So admission
    was held by the cache where requests waited while it ran full (``kv_token_usage_max`` >= 0.95)."""
    waiting, total = _waiting(f, m), running_total(f, m)
    usage = float_or_none(m.get(KV_USAGE_MAX))
    if waiting is None or total is None or usage is None or waiting < 1 or usage < 0.95:
        return None
    return (f"{waiting:.1f} requests waited on average while about {total:.1f} ran and the KV cache ran "
            "full: vLLM admits a request only when its prompt fits in the free blocks")


def pool_cap(f: TrialFacts) -> int | None:
    """``--max-total-tokens`` where it is what sizes the pool (the pool is no larger than it), else None."""
    cap = int_or_none(f.resolved.get("max_total_tokens"))
    pool = int_or_none(f.resolved.get("max_total_num_tokens"))
    return cap if cap and pool and pool <= cap else None


def pool_cap_text(f: TrialFacts) -> str:
    cap = pool_cap(f)
    return f" (the pool is capped by --max-total-tokens={cap:,})" if cap else ""


def kv_capacity(f: TrialFacts) -> list[Finding]:
    """The KV pool, not a request cap, limits how many requests run. At a point it fires on any of:

    * the pool ran full: ``kv_token_usage_max >= 0.95``;
    * the engine retracted requests (``retracted_reqs > 0``): it admitted more than the pool holds;
    * KV-bound admission, read the way SGLang's scheduler decides it (:func:`kv_bound`): requests
      wait while the running requests sit below the concurrency and both admission caps and the pool,
      used plus reserved for the running requests' remaining decode tokens, has no room for another
      (the used share alone stays below 0.95 then: the reservation is not in it). In closed and open
      loops. Under PP the series' ``running`` is one micro-batch, so the replica runs about running x
      (pp + async depth) requests.

    The point reported is the busiest that fires; the evidence says how many requests the pool holds at
    the workload's lengths and, where known, how much of the TTFT was queueing. The change raises
    ``mem_fraction_static`` by 0.05 (at most 0.95) while it is known and below 0.9; the alternatives,
    predicted when it does not help: a ``max_running_requests`` that keeps the pool about 90 % full
    (when it ran full or retracted: the running requests x 0.9 / usage, usage 1 after a retraction), an
    FP8 KV cache (half the bytes per token). The advice check adds every split of the same GPUs (a wider
    TP group spreads the weights thinner and leaves more room for KV; more replicas take fewer requests
    each).
    """
    mrr = int_or_none(f.resolved.get("max_running_requests"))
    fired: dict[str, tuple[list[str], int | None, bool]] = {}
    for label, m in f.points.items():
        usage, retracted = float_or_none(m.get(KV_USAGE_MAX)), float_or_none(m.get(RETRACTED))
        total = running_total(f, m)
        reasons = []
        if usage is not None and usage >= 0.95:
            reasons.append(f"KV pool usage reached {usage:.0%}")
        if retracted is not None and retracted > 0:
            reasons.append(f"{retracted:.0f} requests preempted (the KV cache ran out: each is computed "
                           "again from its first token)" if f.plays == "vllm" else
                           f"{retracted:.0f} requests retracted (KV pool full)")
        bound = kv_bound(f, label)
        if bound:
            reasons.append(bound)
        retracting = retracted is not None and retracted > 0
        fits = None
        if total is not None and ((usage is not None and usage >= 0.95) or retracting):
            # what keeps the pool about 90 % full: the running requests scaled by 0.9 / usage (a
            # retraction means the pool was full, whatever the reports between them caught)
            full = 1.0 if retracting or usage is None else usage
            fits = max(1, math.floor(total * 0.9 / full))
        if reasons:
            fired[label] = (reasons, fits, retracting)
    if not fired:
        return []
    label = by_load(f, list(fired))[0]
    reasons, fits, retracting = fired[label]
    mfs = float_or_none(f.resolved.get("mem_fraction_static"))
    cap = pool_cap(f)
    # a pool capped by --max-total-tokens grows only with the cap: more memory would not reach it
    raise_cap = {f"{EXTRA_ARGS_PREFIX}max_total_tokens": 2 * cap} if cap else None
    # SGLang's fraction holds weights and KV only (0.9 leaves the rest little); vLLM's
    # --gpu-memory-utilization is everything the engine takes, 0.9 by default, 0.95 commonly run
    highest = 0.95 if f.plays == "vllm" else 0.9
    raise_mfs = ({"server.mem_fraction_static": round(min(mfs + 0.05, 0.95), 3)}
                 if mfs is not None and mfs < highest and not cap else None)
    lower_mrr = ({"server.max_running_requests": fits} if fits is not None and (mrr is None or fits < mrr)
                 else None)
    fp8 = (None if str(f.resolved.get("kv_cache_dtype") or "auto").startswith(("fp8", "mxfp8"))
           else {f"{EXTRA_ARGS_PREFIX}kv-cache-dtype": "fp8_e4m3"})
    # MLA's latent is the same on every GPU of the TP group: each of them holds every request's cache.
    # Attention-DP ranks hold their own requests' only, up to tp times the tokens in all
    replicated = (f.latent_kv and f.tp_size > 1 and f.attn_dp == 1 and f.pp_size == 1 and f.pd is None
                  and f.plays == "sglang")  # attention DP is SGLang's
    attention_dp = {"dp.attention": f.tp_size} if replicated else None
    candidates = some(attention_dp, raise_cap, raise_mfs, lower_mrr, fp8)
    change, alternatives = (candidates[0], candidates[1:]) if candidates else ({}, [])
    split = ttft_split_at(f, label)
    why = (f"; each of the {f.tp_size} GPUs of the TP group holds every request's latent KV cache "
           f"(MLA), where {f.tp_size} attention-DP ranks would each hold only their own requests'"
           if replicated else "")
    return [Finding(
        "kv_capacity", "critical" if retracting else "warning",
        f"The KV cache limits the running requests at {label}",
        f"{'; '.join(reasons)} at {label} {scheduler_evidence(f)}{why}"
        + (f"; {split.text()}" if split and split.queue_ms > 0 else ""),
        suggest("Split the TP group into attention-DP ranks, each caching only its own requests."
                if replicated else "Raise the pool's --max-total-tokens cap." if cap else
                "Give the KV cache more memory (--gpu-memory-utilization), or store fewer bytes per token, "
                "or run fewer sequences at once (--max-num-seqs)." if f.plays == "vllm" else
                "Give the KV pool more memory, or store fewer bytes per token, or admit only what it "
                "holds.", change),
        point=label, change=change, alternatives=alternatives)]
