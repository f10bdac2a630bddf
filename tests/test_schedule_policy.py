"""The waiting queue's order under each ``--schedule-policy``, on a real prefix cache: what SGLang's
``SchedulePolicy.calc_priority`` does with the same queue (each case says which rule it shows)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from simulator.entities import Request
from simulator.prefix_cache import RadixCache
from simulator.schedule_policy import SchedulePolicy


def req(name: str, prompt: list[int], max_new: int = 8, arrival_work: int = 0) -> Request:
    r = Request(name, len(prompt), max_new, 0, prompt=np.asarray(prompt, dtype=np.int64))
    r.arrival_work = arrival_work
    return r


def order(policy: str, reqs: list[Request], cache: RadixCache | None, computed: int = 0) -> list[str]:
    queue = deque(reqs)
    SchedulePolicy(policy, cache, seed=0).order(queue, computed)
    return [r.rid for r in queue]


def cache_with(*prompts: list[int]) -> RadixCache:
    cache = RadixCache(1, lambda: 0.0)
    for p in prompts:
        cache.insert(np.asarray(p, dtype=np.int64))
    return cache


A, B = list(range(100, 150)), list(range(200, 250))  # two 50-token prefixes


def test_fcfs_and_routing_key_keep_arrival_order_and_lof_puts_long_answers_first() -> None:
    reqs = [req("a", [1, 2], 4), req("b", [3, 4], 64), req("c", [5, 6], 16)]
    assert order("fcfs", reqs, None) == order("routing-key", reqs, None) == ["a", "b", "c"]
    assert order("lof", reqs, None) == ["b", "c", "a"]
    assert sorted(order("random", reqs, None)) == ["a", "b", "c"]


def test_lpm_puts_the_longest_cached_prefix_first() -> None:
    cache = cache_with([*A, 1, 2, 3], B[:10])
    reqs = [req("short", [*B[:10], 7, 7]), req("none", [9] * 12), req("long", [*A, 5, 5])]
    assert order("lpm", reqs, cache) == ["long", "short", "none"]
    # more than 128 waiting: matching every one costs more than it saves, arrival order
    many = [req(f"r{i}", [9, i]) for i in range(128)] + [req("long", [*A, 5, 5])]
    assert order("lpm", many, cache)[-1] == "long"


def test_requests_sharing_an_uncached_prefix_wait_behind_the_first() -> None:
    cache = cache_with()
    reqs = [req("a1", [*A, 1]), req("b1", [*B, 1]), req("a2", [*A, 2]), req("other", [5, 6, 7])]
    # a2 shares 50 uncached tokens with a1, ahead of it: to the back, so a1 computes them once
    assert order("lpm", reqs, cache) == ["a1", "b1", "other", "a2"]
    assert order("shortest-prefill-first", reqs, cache)[-1] == "a2"


def test_dfs_weight_walks_the_heavier_branch_first_and_a_nodes_own_requests_last() -> None:
    cache = cache_with([*A, 1, 1], B)
    reqs = [req("b1", [*B, 4]), req("a-own", [*A, 9]), req("a1", [*A, 1, 1, 3]), req("a2", [*A, 1, 1, 4])]
    # A's branch holds three waiting requests, B's one; under A, the [1 1] child's two come before the
    # request that ends at A itself
    assert order("dfs-weight", reqs, cache) == ["a1", "a2", "a-own", "b1"]


def test_hrrn_favours_the_request_that_waited_longest_for_its_remaining_work() -> None:
    cache = cache_with(A)
    reqs = [req("young", [7] * 40, arrival_work=900), req("old", [8] * 40, arrival_work=0),
            req("cached", [*A, 3], arrival_work=950)]
    # ratios at 1,000 computed tokens: young 100/40, old 1000/40; cached: 50 of 51 tokens cached
    assert order("hrrn", reqs, cache, computed=1000) == ["cached", "old", "young"]


def test_shortest_prefill_first_counts_only_what_is_left_to_compute() -> None:
    cache = cache_with(A)
    reqs = [req("mid", [7] * 30), req("cached-long", A + [3] * 20), req("short", [8] * 10)]
    assert order("shortest-prefill-first", reqs, cache) == ["short", "cached-long", "mid"]


def test_without_the_cache_the_cache_aware_policies_are_fcfs() -> None:
    reqs = [req("a", [1] * 5), req("b", A)]
    assert order("lpm", reqs, None) == order("dfs-weight", reqs, None) == ["a", "b"]
    with pytest.raises(ValueError, match="requires prefix caching"):
        SchedulePolicy("shortest-prefill-first", None, 0)
    with pytest.raises(ValueError, match="Unknown schedule_policy"):
        SchedulePolicy("priority", cache_with(), 0)
