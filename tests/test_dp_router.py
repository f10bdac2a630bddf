"""DP replicas behind the router package (``dp.router_impl``): which trials get it, what is refused in
one line, the commands each replica and the router start with, and the per-point routing summaries on
metrics the router and the replicas really exported (tests/data/router/README.md)."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest

from analysis.dp_routing import ROUTER_MATCH_FRAC, ROUTER_MATCH_RATIO, routing_summary
from analysis.prefix_reuse import reuse_lines
from orchestrator.config.schema import ParasweepConf, router_process
from orchestrator.engines.router import replica_config, replica_gpus, router_argv, worker_urls
from orchestrator.search.runner import sglang_command
from orchestrator.telemetry.server_metrics import read_samples
from simulator.router import Router, over_spill_gate, spill_margin
from tests.conftest import refusal
from vocab.hardware import load_hardware

DATA = Path(__file__).parent / "data" / "router"
URLS = ["http://127.0.0.1:51191", "http://127.0.0.1:47883"]  # the replicas of that trial, rank order
WINDOW = (1796386861.1662953, 1796386862.3893576)


def _cfg(engine: str = "sim", router: str = "cache_aware", impl: str = "auto", dp: int = 2) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = engine
    cfg.dry_run = engine == "sglang"  # validated as a dry run would: no GPU here
    cfg.model.name, cfg.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    cfg.ray.num_gpus = 8
    cfg.dp.size, cfg.dp.router, cfg.dp.router_impl = dp, router, impl
    cfg.workload.concurrency = [8]
    return cfg


def test_the_router_runs_where_the_engine_lacks_the_policy_or_where_it_is_asked_for() -> None:
    assert router_process(_cfg("sglang"), "sglang")  # SGLang's DP controller has no cache-aware policy
    assert not router_process(_cfg("sglang", router="round_robin"), "sglang")
    assert not router_process(_cfg("sim"), "sim")  # the simulated engine models the policy itself
    assert router_process(_cfg("sim", impl="smg"), "sim")
    assert router_process(_cfg("sim", router="round_robin", impl="smg"), "sim")
    assert not router_process(_cfg("sglang", dp=1), "sglang")


def test_what_the_router_cannot_do_is_refused_in_one_line() -> None:
    assert "dp.router_impl=nginx: invalid; valid: auto, engine, smg" in refusal(_cfg(impl="nginx"))
    assert "SGLang's own DP controller has no cache-aware policy" in refusal(_cfg("sglang", impl="engine"))
    assert "needs at least two replicas" in refusal(_cfg(impl="smg", dp=1))
    cfg = _cfg(impl="smg")
    cfg.workload.api = "completions"
    assert "workload.api=completions" in (message := refusal(cfg)) and "token-id prompts" in message
    cfg = _cfg(impl="smg", dp=2)
    cfg.hardware, cfg.tp.size = load_hardware("h100-sxm-x8-2nodes-ib"), 8
    assert "spans 2" in refusal(cfg)


def test_each_replica_is_the_trial_as_one_replica_on_its_slice_of_the_gpus() -> None:
    cfg = _cfg()
    cfg.tp.size = 2
    one = replica_config(cfg)
    assert (one.dp.size, one.tp.size, one.dp.router_impl) == (1, 2, "engine") and cfg.dp.size == 2
    assert [replica_gpus("4,5,6,7", rank, 2) for rank in range(2)] == ["4,5", "6,7"]
    assert [replica_gpus(None, rank, 2) for rank in range(2)] == ["0,1", "2,3"]


def test_the_router_command_names_its_replicas_policy_and_thresholds() -> None:
    argv = router_argv(_cfg(), 30000, 29001, URLS)
    assert argv[1:3] == ["-m", "smg.launch_router"] and worker_urls(argv) == URLS
    assert argv[argv.index("--host") + 1] == argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--cache-threshold") + 1] == "0.3"
    assert argv[argv.index("--prometheus-port") + 1] == "29001"
    assert worker_urls(["python", "-m", "sglang.launch_server"]) == []


def test_a_suggested_sglang_layout_behind_the_router_is_every_replica_and_the_router() -> None:
    command = sglang_command(_cfg("sglang"), {})
    parts = [shlex.split(p) for p in command.split(" & ")]
    assert len(parts) == 3
    assert parts[0][0] == "CUDA_VISIBLE_DEVICES=0" and parts[1][0] == "CUDA_VISIBLE_DEVICES=1"
    for rank, part in enumerate(parts[:2]):
        assert part[part.index("--port") + 1] == str(30001 + rank)
        assert part[part.index("--dp-size") + 1] == "1"
    assert worker_urls(parts[2]) == ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]
    # SGLang's own DP controller spreads round-robin: one server, --dp-size 2
    plain = shlex.split(sglang_command(_cfg("sglang", router="round_robin"), {}))
    assert "&" not in plain and plain[plain.index("--dp-size") + 1] == "2"


@pytest.fixture(scope="module")
def scraped() -> tuple[object, list[object]]:
    router = read_samples(DATA / "smg-1.13.0-router-metrics.jsonl")
    replicas = [read_samples(DATA / f"sim-{name}.jsonl") for name in ("server_metrics", "server_metrics-dp1")]
    return router, replicas


def test_the_routing_summary_reads_the_routers_and_the_replicas_counters(scraped: tuple) -> None:
    router, replicas = scraped
    whole = (0.0, 2e9)  # every scrape: the counters' totals
    out = routing_summary(router, replicas, URLS, *whole)
    sent = {url: router[(router["name"] == "smg_worker_requests_total")
                        & router["labels"].str.contains(url)]["value"].max() for url in URLS}
    assert out["dp0_request_share"] == pytest.approx(sent[URLS[0]] / sum(sent.values()))
    assert out["dp0_request_share"] + out["dp1_request_share"] == pytest.approx(1.0)
    for rank, frame in enumerate(replicas):
        def grown(mode: str, f: object = frame) -> float:  # last scrape less first (the health probes')
            rows = f[f["labels"].str.contains(mode)]
            return float(rows[rows["ts"] == rows["ts"].max()]["value"].sum()
                         - rows[rows["ts"] == rows["ts"].min()]["value"].sum())

        cached, computed = grown("prefill_cache"), grown("prefill_compute")
        assert out[f"dp{rank}_cache_hit_rate"] == pytest.approx(cached / (cached + computed))
    assert 0.0 < out[ROUTER_MATCH_RATIO] <= 1.0 and 0.0 < out[ROUTER_MATCH_FRAC] <= 1.0
    # the point's own window: a part of the totals, shares still summing to one
    point = routing_summary(router, replicas, URLS, *WINDOW)
    assert point["dp0_request_share"] + point["dp1_request_share"] == pytest.approx(1.0)
    # no router scrape overlapping the window: nothing said about it
    assert routing_summary(router, [None, None], URLS, 1.0, 2.0) == {}


def test_a_branch_counter_not_yet_listed_by_a_scrape_reads_zero_there(scraped: tuple) -> None:
    # The router lists a branch counter from its first cache-aware decision on: its first scrape has
    # none. A window between that scrape and the next (a short point, or a time-scaled engine's) is
    # still summarised, in proportion to time, as the request counters beside it are.
    router, replicas = scraped
    branch = router[router["name"] == "smg_cache_aware_policy_branch_total"]
    first, listed = router["ts"].min(), branch["ts"].min()
    assert first < listed  # the real scrapes: the first one is before any decision
    out = routing_summary(router, replicas, URLS, first + 0.01, listed - 0.01)
    at_listed = branch[branch["ts"] == listed]
    matched = at_listed[at_listed["labels"].str.contains("tree_match")]["value"].sum()
    assert out[ROUTER_MATCH_FRAC] == pytest.approx(matched / at_listed["value"].sum())


def test_the_summary_shows_each_replicas_part_beside_the_points_hit_rate(scraped: tuple) -> None:
    router, replicas = scraped
    point = {f"c16/{k}": v for k, v in routing_summary(router, replicas, URLS, 0.0, 2e9).items()}
    point |= {"c16/cache_hit_rate": 0.89, "c16/offered_hit_rate": 0.91}
    text = " ".join(reuse_lines([("#1", point)], 200))
    share, hit = point["c16/dp1_request_share"], point["c16/dp1_cache_hit_rate"]
    assert f"replica 1: {100 * share:.0f} % of the requests, hit {100 * hit:.0f} %" in text
    assert "behind the router" not in " ".join(reuse_lines([("#1", {"c16/cache_hit_rate": 0.5})], 200))


# (mean load, margin) and (replicas, requests in flight, the fewest one replica must hold for the gate to
# open; None: more than there are): the cases smg 1.13.0's own tests check its gate with
# (model_gateway/src/policies/cache_aware.rs of its sdist, at the launcher's 64 and 1.5)
MARGINS = [(0.0, 4.0), (1.0, 4.0), (4.0, 4.0), (5.0, 5.0), (16.0, 8.0), (64.0, 16.0), (128.0, 23.0),
           (400.0, 40.0), (1024.0, 64.0), (2000.0, 64.0)]
OPENS_AT = [(2, 4, None), (2, 8, None), (2, 32, 25), (2, 128, 97), (8, 4, None), (8, 8, 6), (8, 32, 9),
            (8, 128, 25), (29, 4, None), (29, 8, 5), (29, 32, 6), (29, 128, 10)]


def test_the_simulated_routers_spill_gate_is_the_pinned_routers() -> None:
    assert [spill_margin(mean) for mean, _ in MARGINS] == [margin for _, margin in MARGINS]
    for replicas, in_flight, opens_at in OPENS_AT:
        mean = in_flight / replicas
        first = next((load for load in range(in_flight + 1) if over_spill_gate(load, mean)), None)
        assert first == opens_at, (replicas, in_flight)


def test_a_busy_prefix_home_spills_to_the_idlest_replica_which_then_holds_it_too() -> None:
    prompt = np.arange(1000, dtype=np.int64)
    router = Router("cache_aware", 2)
    assert router.pick(prompt, [0, 0]) == 0  # no match: the idlest, the first on a tie
    assert router.pick(prompt, [19, 13]) == 0  # its home, under the gate (19 < 1.5 x 16)
    assert router.pick(prompt, [25, 7]) == 1  # over it: 25 > 24 and 25 > 16 + 8
    assert router.pick(prompt, [9, 3]) == 1  # two homes now: the less loaded of them
    other = np.arange(5000, 6000, dtype=np.int64)
    assert router.pick(other, [3, 9]) == 0  # nothing shared: the idlest
