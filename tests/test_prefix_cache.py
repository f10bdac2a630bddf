"""The simulated engine's prefix cache: the radix tree itself, the engine's use of it (admission,
eviction, policies), the shared-prefix workload, and the reuse a point reports, achieved and offered.

The worked example (docs/simulator.md, "The prefix cache"): 64 requests sharing one 4,000-token system
prompt, each with 100 tokens of its own, on Llama-3.1-8B on one H200. Without a cache every prompt is
computed whole: 64 × 4,100 = 262,400 tokens. With it the shared part is computed once: 4,000 + 64 × 100
= 10,400 tokens, a hit rate of 63 × 4,000 / 262,400 = 96.0 %."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import validate
from orchestrator.points.plan import request_spec
from simulator.predict import VirtualTrial, load_config, predict_point
from simulator.prefix_cache import RadixCache
from tests.conftest import refusal
from vocab.hardware import load_hardware
from vocab.load import LoadPoint, RequestSpec, SharedPrefix, Source
from vocab.records import RequestRecord
from workloads.prefix_reuse import achieved_reuse, offered_reuse
from workloads.sources import source_requests

REPO = Path(__file__).resolve().parent.parent
LLAMA8B_H200 = ["--model-path", str(REPO / "models" / "llama-3.1-8b"), "--sim-hardware", "h200-nvlink-x8"]


def ids(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# -- the tree ----------------------------------------------------------------------------------------


def test_a_match_ends_where_the_prompts_part_and_splits_the_node_there() -> None:
    cache = RadixCache(1, Clock())
    assert cache.insert(ids(1, 2, 3, 4, 5))[0] == 5
    n, node = cache.match(ids(1, 2, 3, 9))
    assert n == 3 and list(node.ids) == [1, 2, 3]  # the node was split after the shared part
    added, _ = cache.insert(ids(1, 2, 3, 9, 9))
    assert added == 2 and cache.total == 7 and cache.evictable == 7
    assert cache.match(ids(7, 1, 2))[0] == 0


def test_pages_match_and_keep_whole_pages_only() -> None:
    cache = RadixCache(4, Clock())
    assert cache.insert(ids(*range(10)))[0] == 8  # two pages; the 2-token tail is not kept
    assert cache.match(ids(*range(7), 99))[0] == 4  # a page that differs anywhere does not match
    assert cache.match(ids(*range(8), 99, 99))[0] == 8


def test_locked_tokens_are_protected_and_never_evicted() -> None:
    cache = RadixCache(1, Clock())
    _, node = cache.insert(ids(1, 2, 3))
    cache.lock(node)
    assert (cache.protected, cache.evictable) == (3, 0)
    assert cache.evict(3) == 0 and cache.total == 3
    cache.unlock(node)
    assert cache.evict(1) == 3 and cache.total == 0  # a node goes whole


def test_eviction_takes_the_least_recently_used_leaf_first_then_its_parent() -> None:
    clock = Clock()
    cache = RadixCache(1, clock)
    cache.insert(ids(1, 2, 3))  # t = 0
    clock.t = 1.0
    cache.insert(ids(1, 2, 4))  # splits [1 2 3] into [1 2] + [3]; leaf [4] used at t = 1
    clock.t = 2.0
    cache.match(ids(1, 2, 3))  # [3] used at t = 2: now [4] is the oldest leaf
    assert cache.evict(1) == 1 and cache.match(ids(1, 2, 4))[0] == 2
    assert cache.evict(2) == 3  # [3], then its parent [1 2] once it is a leaf
    assert cache.total == 0 and cache.evictable == 0


# -- the engine ------------------------------------------------------------------------------------


def shared_prefix(groups: int, per_group: int, system: int, question: int, out: int) -> RequestSpec:
    shape = SharedPrefix(groups=groups, prompts_per_group=per_group, system_len=system,
                         question_len=question, output_len=out)
    return RequestSpec(api="generate", vocab_size=128256, source=Source("shared-prefix", shared_prefix=shape))


SYSTEM_PROMPT_64 = shared_prefix(1, 64, 4000, 100, 64)
BURST_64 = LoadPoint(concurrency=64, num_requests=64, ramp_s=0.0)


def test_a_shared_system_prompt_is_computed_once_and_ttft_falls_with_it() -> None:
    cached = predict_point(LLAMA8B_H200, BURST_64, SYSTEM_PROMPT_64).metrics
    plain = predict_point([*LLAMA8B_H200, "--disable-radix-cache"], BURST_64, SYSTEM_PROMPT_64).metrics
    assert plain["prefill_computed_tokens"] == 64 * 4100 and plain["cache_hit_rate"] == 0.0
    # computed: the shared prompt once plus every request's own 100 tokens, within 5 %
    assert cached["prefill_computed_tokens"] == pytest.approx(4000 + 64 * 100, rel=0.05)
    assert cached["cache_hit_rate"] == pytest.approx(63 * 4000 / (64 * 4100), abs=0.01)
    # the same prompts offered the same reuse; only the engine with a cache took it
    # (a question can share its first id with an earlier answer, which the engine also caches: 1e-3)
    assert cached["offered_hit_rate"] == plain["offered_hit_rate"]
    assert cached["offered_hit_rate"] == pytest.approx(cached["cache_hit_rate"], rel=1e-3)
    # 100 tokens over a cached 4,000 instead of 4,100 from scratch: the queue of prefills drains ~40× faster
    assert cached["ttft_p50_ms"] * 5 < plain["ttft_p50_ms"]


def test_a_pool_too_small_for_the_groups_evicts_them_and_the_hit_rate_falls() -> None:
    spec = shared_prefix(8, 8, 2000, 64, 32)  # eight 2,000-token system prompts, shuffled
    point = LoadPoint(concurrency=8, num_requests=64, ramp_s=0.0)
    roomy = predict_point(LLAMA8B_H200, point, spec).metrics
    tight = predict_point([*LLAMA8B_H200, "--max-total-tokens", "12000"], point, spec).metrics
    # a roomy pool keeps every group; it misses only where requests of one group are prefilled in
    # the same batch, before either's prompt is cached (fcfs computes each)
    assert roomy["cache_hit_rate"] > 0.9 * roomy["offered_hit_rate"]
    # 12,000 tokens cannot keep eight groups of 2,000 beside the running requests: evicted, computed again
    assert tight["offered_hit_rate"] == roomy["offered_hit_rate"]
    assert tight["cache_hit_rate"] < 0.75 * roomy["cache_hit_rate"]
    assert tight["ttft_p50_ms"] > roomy["ttft_p50_ms"]


def test_lpm_keeps_a_tight_pool_on_one_group_where_fcfs_thrashes() -> None:
    spec = shared_prefix(4, 16, 3000, 64, 16)
    point = LoadPoint(concurrency=64, num_requests=64, ramp_s=0.0)
    tight = [*LLAMA8B_H200, "--max-total-tokens", "12000", "--max-running-requests", "8"]
    fcfs = predict_point(tight, point, spec).metrics
    lpm = predict_point([*tight, "--schedule-policy", "lpm"], point, spec).metrics
    # lpm admits the requests whose group is cached first; fcfs admits the queue's mix of groups and
    # evicts one group's prompt to compute another's
    assert lpm["cache_hit_rate"] == pytest.approx(lpm["offered_hit_rate"], abs=0.01)
    assert fcfs["cache_hit_rate"] < lpm["cache_hit_rate"] - 0.2
    assert lpm["ttft_p50_ms"] < fcfs["ttft_p50_ms"]


# -- the workload and the reuse a point reports -----------------------------------------------------


def test_requests_of_a_group_share_its_system_prompt_token_for_token() -> None:
    spec = shared_prefix(3, 4, 50, 10, 5)
    reqs = source_requests(spec)
    assert reqs.count == 12 and sorted(reqs.group(i) for i in range(12)) == [0] * 4 + [1] * 4 + [2] * 4
    by_group: dict[int, list[np.ndarray]] = {}
    for i in range(12):
        by_group.setdefault(reqs.group(i), []).append(reqs.request(i).ids)
    for prompts in by_group.values():
        assert all(len(p) == 60 and (p[:50] == prompts[0][:50]).all() for p in prompts)
        assert len({tuple(p[50:]) for p in prompts}) == 4  # each question its own
    assert not (by_group[0][0][:50] == by_group[1][0][:50]).all()


def test_zipf_groups_make_the_first_groups_popular() -> None:
    shape = SharedPrefix(groups=20, prompts_per_group=50, system_len=8, question_len=4, output_len=4,
                         zipf=1.2)
    reqs = source_requests(RequestSpec(vocab_size=1000, source=Source("shared-prefix", shared_prefix=shape)))
    counts = np.bincount([reqs.group(i) for i in range(reqs.count)], minlength=20)
    assert counts[0] > counts[5] > counts[19] and counts.sum() == 1000


def record(index: int, sent: float, n_in: int, cached: int | None, warmup: bool = False) -> RequestRecord:
    return RequestRecord(point="c1", index=index, warmup=warmup, send_time=sent, end_time=sent + 1,
                         input_tokens=n_in, cached_tokens=cached)


def test_offered_reuse_is_each_prompts_longest_beginning_sent_before_it() -> None:
    prompts = {0: ids(1, 2, 3, 4), 1: ids(1, 2, 3, 9), 2: ids(5, 6), 3: ids(1, 2, 3, 4)}
    recs = [record(0, 0.0, 4, 0, warmup=True), record(1, 1.0, 4, 3), record(2, 2.0, 2, 0),
            record(3, 3.0, 4, 3)]
    # request 1 shares [1 2 3] with the warm-up; 2 nothing; 3 is the warm-up's prompt again, of which an
    # engine still computes the last token
    assert offered_reuse(recs, prompts.get)["offered_hit_rate"] == pytest.approx((3 + 0 + 3) / 10)
    assert achieved_reuse(recs) == {"prefill_cached_tokens": 6.0, "prefill_computed_tokens": 4.0,
                                    "cache_hit_rate": 0.6}
    assert offered_reuse(recs, lambda i: None) == {}  # text prompts: the server's ids are unknown


# -- configs: one line each ---------------------------------------------------------------------------


def _cfg(**workload: object) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.predict = True
    cfg.model.name, cfg.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    cfg.workload.source = "shared-prefix"
    cfg.workload.concurrency = [8]
    for key, value in workload.items():
        setattr(cfg.workload, key, value)
    return cfg


def test_a_shared_prefix_workload_becomes_the_requests_it_describes() -> None:
    cfg = _cfg()
    cfg.workload.shared_prefix.groups, cfg.workload.shared_prefix.system_len = 3, 500
    validate(cfg)
    spec = request_spec(cfg)
    assert spec.source is not None and spec.source.shared_prefix.groups == 3
    assert len(source_requests(spec).request(0).ids) == 500 + 128


def test_bad_prefix_cache_keys_are_refused_in_one_line() -> None:
    cfg = _cfg()
    cfg.workload.shared_prefix.groups = 0
    assert "workload.shared_prefix.groups=0: invalid; valid: an integer >= 1" in refusal(cfg)
    cfg = _cfg()
    cfg.workload.shared_prefix.zipf = -1.0
    assert "workload.shared_prefix.zipf=-1.0" in refusal(cfg)
    assert "valid: generate or completions" in refusal(_cfg(api="chat"))
    cfg = _cfg()
    cfg.server.schedule_policy = "longest"
    assert ("server.schedule_policy=longest: invalid; valid: fcfs, lpm, dfs-weight, lof, random, "
            "routing-key, hrrn, shortest-prefill-first" in refusal(cfg))
    cfg.server.schedule_policy = "priority"
    assert "its scheduler then fails at start-up" in refusal(cfg)
    cfg.server.schedule_policy, cfg.server.radix_cache = "shortest-prefill-first", False
    assert "requires prefix caching" in refusal(cfg)
    cfg = _cfg()
    cfg.dp.router = "sticky"
    assert "dp.router=sticky: invalid; valid: round_robin, total_requests, cache_aware" in refusal(cfg)


def test_the_cache_is_flushed_only_when_nothing_runs_or_waits() -> None:
    trial = VirtualTrial(load_config(LLAMA8B_H200))
    adm = trial.replicas[0].admission
    assert adm.flush_cache()  # the engine's own warm-up request left its tokens, as SGLang's does
    req = trial.submit(np.arange(1, 600, dtype=np.int64), 50)
    trial.sim.run_until(trial.sim.peek())  # it arrives and is admitted
    assert adm.pool_used == 1 and not adm.flush_cache()  # SGLang refuses: a request is running
    while not req.finished:
        trial.sim.run_until(trial.sim.peek())
    trial.sim.run_until(trial.sim.now + 1.0)
    assert adm.cache is not None and adm.cache.total == 599 + 49  # its prompt and output, kept
    assert adm.held_tokens == 0  # nothing holds them: all evictable
    assert adm.flush_cache() and adm.cache.total == 0


def test_the_cache_keys_are_changes_a_search_or_the_advice_can_predict() -> None:
    # the path every suggested change and search candidate takes: the config changed, then predicted
    from orchestrator.prediction.modelled import apply_change, predict_at

    cfg = _cfg()
    sp = cfg.workload.shared_prefix
    sp.groups, sp.prompts_per_group, sp.system_len, sp.question_len, sp.output_len = 4, 16, 3000, 64, 16
    cfg.workload.concurrency, cfg.workload.requests_per_concurrency = [64], 1
    cfg.server.max_running_requests = 8
    cfg.server.extra_args = {"max_total_tokens": 12000}
    hit = {}
    for change in ({}, {"server.schedule_policy": "lpm"}, {"server.radix_cache": False},
                   {"dp.size": 2, "dp.router": "cache_aware"}):
        changed, env = apply_change(cfg, change)
        hit[str(change)] = predict_at(changed, env, None)["cache_hit_rate"]
    assert hit["{'server.schedule_policy': 'lpm'}"] > hit["{}"] + 0.2
    assert hit["{'server.radix_cache': False}"] == 0.0
    assert hit["{'dp.size': 2, 'dp.router': 'cache_aware'}"] > hit["{}"]
