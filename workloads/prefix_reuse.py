"""Prefix reuse of one point: what the server's prefix cache hit, and what the workload offered.

* Achieved, from the server's own per-request reports (``RequestRecord.cached_tokens``): the prompt
  tokens found in the cache and those computed, and their ratio, the hit rate, over the point's
  measured requests.
* Offered, from the prompts sent: what a cache that never evicts would have hit. Each measured
  request's prompt is compared, in send order, with every prompt sent before it in the point (warm-up
  requests included: they fill the cache as much as any), and its longest shared beginning counts,
  less one token (an engine always computes a prompt's last token). Known where the client sends token
  ids; a text prompt's ids are the server's to make.

Achieved far below offered means the cache lost what it could have kept (evicted under pressure, or
split across replicas that each see a share of the traffic).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

from vocab.records import RequestRecord
from vocab.token_ids import shared_prefix_len

NAN = float("nan")


def achieved_reuse(records: Sequence[RequestRecord]) -> dict[str, float]:
    """``prefill_cached_tokens``, ``prefill_computed_tokens`` and ``cache_hit_rate`` of the measured,
    successful requests the server reported on ({} when it reported none)."""
    reported = [r for r in records if not r.warmup and r.error is None and r.cached_tokens is not None]
    if not reported:
        return {}
    cached = sum(r.cached_tokens for r in reported)  # type: ignore[misc]
    prompt = sum(r.input_tokens for r in reported)
    return {"prefill_cached_tokens": float(cached), "prefill_computed_tokens": float(prompt - cached),
            "cache_hit_rate": cached / prompt if prompt else NAN}


def offered_reuse(records: Sequence[RequestRecord],
                  prompt_of: Callable[[int], np.ndarray | None]) -> dict[str, float]:
    """``offered_hit_rate``: the share of the measured requests' prompt tokens an unlimited cache would
    have held when each was sent ({} when a prompt's ids are unknown). ``prompt_of(i)``: request ``i``'s
    token ids."""
    sent = sorted((r for r in records if r.send_time is not None), key=lambda r: (r.send_time, r.index))
    # the prompts seen so far, sorted: a prompt's longest match is with a neighbour. Each is keyed by its
    # ids as big-endian 4-byte words, whose byte order is the ids' order (a prefix first), so the sort
    # and the search compare bytes in C, not tuples of ints
    seen: list[bytes] = []
    by_key: dict[bytes, np.ndarray] = {}
    hit = total = 0
    for r in sent:
        ids = prompt_of(r.index)
        if ids is None:
            return {}
        key = ids.astype(">u4").tobytes()
        if not r.warmup:
            at = bisect.bisect_left(seen, key)
            neighbours = (by_key[seen[j]] for j in (at - 1, at) if 0 <= j < len(seen))
            best = max((shared_prefix_len(ids, n) for n in neighbours), default=0)
            hit += min(best, len(ids) - 1)
            total += len(ids)
        if key not in by_key:
            by_key[key] = ids
            bisect.insort(seen, key)
    return {"offered_hit_rate": hit / total} if total else {}
