"""Disaggregated deployments as candidates: a search space names them by the ``pd`` group's options or
its keys; each is bounded by its decode servers, judged under the same SLOs on the same steady points as
aggregated candidates, written as every server's SGLang command and the router's; the end of a sweep and
the diagnosis try them beside the aggregated splits (nothing launched: every candidate is predicted on
the simulated engine in virtual time)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError
from orchestrator.prediction.at_load import Load, predict_change
from orchestrator.prediction.modelled import apply_change
from orchestrator.search.evaluate import OK, REJECTED, Screened, check_settings, screen
from orchestrator.search.measure import live_refusal, trial_argv
from orchestrator.search.runner import command_lines, run_search, search_base
from orchestrator.search.space import Dimension, parse_space, with_group_keys
from vocab.hardware import load_hardware


def config(model: str, hardware: str, tp: int = 1, slo: dict[str, float] | None = None) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = model, f"models/{model}"
    cfg.hardware = load_hardware(hardware)
    cfg.tp.size = tp
    cfg.workload.input_len, cfg.workload.output_len = 512, 64
    cfg.search.slo = slo if slo is not None else {"itl_p99_ms": 50.0}
    cfg.search.max_concurrency, cfg.search.workers = 64, 1
    return search_base(cfg)


def test_a_groups_option_is_a_value_of_the_space() -> None:
    assert parse_space(["pd=choice(none,1p1d,1p3d)"]) == [Dimension("pd", ("none", "1p1d", "1p3d"))]
    base = config("llama-3.1-8b", "h100-sxm-x8")
    # the option composes the group as Hydra does (conf/pd/1p3d.yaml over the schema); keys inside the
    # group apply after it, in whatever order the change lists them
    cfg, _ = apply_change(base, {"pd.decode.workers": 2, "pd": "1p3d"})
    assert (cfg.pd.enabled, cfg.pd.prefill.workers, cfg.pd.decode.workers) == (True, 1, 2)
    assert apply_change(base, {"pd": "none"})[0].pd.enabled is False
    # an option built on another (its own defaults list) composes both
    spec = apply_change(base, {"spec": "eagle3-chain1"})[0].spec
    assert (spec.algorithm, spec.num_steps, spec.num_draft_tokens) == ("eagle3", 1, 2)
    with pytest.raises(ConfigError) as e:
        apply_change(base, {"pd": "1p9d"})
    # the options there are, as the group's folder lists them
    from vocab.assets import conf_dir

    options = sorted(p.stem for p in (conf_dir() / "pd").glob("*.yaml"))
    assert "1p3d" in options and str(e.value) == f"pd=1p9d: invalid; valid: {', '.join(options)}"


def test_keys_inside_a_searched_group_ride_along_with_every_option() -> None:
    # pd=<option> replaces the group; the search's own pd.* keys apply after it, as Hydra does
    dims = with_group_keys(parse_space(["pd=choice(none,1p1d)", "tp.size=choice(1,2)"]),
                           ("experiment=x", "pd.transfer_backend=nixl", "+pd.decode.extra_args.foo=1",
                            "tp.size=4", "server.cuda_graph=false"))
    assert dims[2:] == [Dimension("pd.transfer_backend", ("nixl",)),
                        Dimension("pd.decode.extra_args.foo", (1,))]
    base = config("llama-3.1-8b", "h100-sxm-x8")
    cfg, _ = apply_change(base, {"pd": "1p1d", "pd.transfer_backend": "nixl"})
    assert (cfg.pd.enabled, cfg.pd.transfer_backend) == (True, "nixl")
    # without a group option in the space, nothing is added
    assert with_group_keys(parse_space(["tp.size=1,2"]), ("pd.transfer_backend=nixl",)) == \
        [Dimension("tp.size", (1, 2))]


def test_a_disaggregated_candidate_is_bounded_by_its_decode_servers() -> None:
    # each decode server is the aggregated engine's config (the roles take the trial's layout), so
    # three of them decode three times what one aggregated engine can, over the deployment's 4 GPUs
    base = config("llama-3.1-8b", "h100-sxm-x8", slo={"itl_p99_ms": 8.0})  # tight: the load search starts low
    settings = check_settings(base)
    alone, deployed = screen(base, {}, settings), screen(base, {"pd": "1p3d"}, settings)
    assert isinstance(alone, Screened) and isinstance(deployed, Screened)
    assert (alone.gpus, deployed.gpus) == (1, 4)
    assert deployed.ceiling * deployed.gpus == pytest.approx(3 * alone.ceiling * alone.gpus)
    assert alone.start is not None and deployed.start == 3 * alone.start
    # its servers are not interchangeable replicas of one engine: judged as itself
    assert deployed.replica_key == deployed.engine_key != alone.engine_key
    # two nodes: servers are placed one after another, each within a node; three of TP8 need three
    wide = config("llama-3.1-70b", "h100-sxm-x8-2nodes-ib", tp=8)
    refused = screen(wide, {"pd": "2p1d"}, check_settings(wide))
    assert not isinstance(refused, Screened) and refused.status == REJECTED
    assert refused.reason.startswith(
        "pd.prefill.workers+pd.decode.workers=2+1: invalid (servers of 8+8+8 GPUs")
    assert isinstance(screen(wide, {"pd": "1p1d"}, check_settings(wide)), Screened)


@pytest.mark.slow  # a dozen candidates predicted in full
def test_aggregated_and_disaggregated_are_judged_on_the_same_footing(tmp_path: Path) -> None:
    cfg = config("llama-3.1-8b", "h100-sxm-x8", slo={"ttft_p99_ms": 1000.0, "itl_p99_ms": 30.0})
    cfg.search.name, cfg.search.space = "pd", ["pd=choice(none,1p1d,1p3d)", "tp.size=choice(1,2)"]
    result = run_search(cfg, tmp_path, show_progress=False)
    by = {(o.change["pd"], o.change["tp.size"]): o for o in result.outcomes}
    assert {o.status for o in by.values()} == {OK}
    assert [by[("1p3d", tp)].gpus for tp in (1, 2)] == [4, 8]
    # a disaggregated candidate's numbers are the deployment's prediction at its steady point, the same
    # as the diagnosis and the end of a sweep predict it (one path for both)
    best = by[("1p1d", 1)]
    again = predict_change(cfg, best.change, [Load.closed(best.concurrency or 1)])
    label = f"c{best.concurrency}"
    assert again.gpus == 2 and again.metrics[label]["output_tok_s"] == pytest.approx(
        best.metrics["output_tok_s"], rel=1e-9)
    assert best.score == pytest.approx(best.metrics["output_tok_s"] / 2)
    # held to the same SLOs: the load just above its best breaks one of them
    assert best.limit.startswith(("ttft_p99_ms", "itl_p99_ms")) or "search.max_concurrency" in best.limit
    assert all(math.isfinite(o.score or math.nan) for o in by.values())


def test_a_deployment_is_written_as_every_server_and_the_router() -> None:
    base = config("llama-3.1-8b", "h100-sxm-x8")
    task = ("experiment=search-x", "model=llama-3.1-8b", "search.max_concurrency=8")
    run_py, measured, _ = command_lines(base, {"pd": "1p3d", "tp.size": 2}, 24, task)
    # the search's own overrides kept, the search turned off, the candidate, its load
    assert run_py == ("  python run.py experiment=search-x model=llama-3.1-8b search.name=null pd=1p3d "
                      "tp.size=2 workload.concurrency=[24]")
    servers = measured.split("no tokenizer): ", 1)[1].split(" & ")
    assert len(servers) == 5 and servers[-1].startswith("python -m smg.launch_router")
    gpus = ("0,1", "2,3", "4,5", "6,7")
    assert [s.split()[0] for s in servers[:4]] == [f"CUDA_VISIBLE_DEVICES={g}" for g in gpus]
    assert "--disaggregation-mode prefill" in servers[0]
    assert "--disaggregation-bootstrap-port 8998" in servers[0]
    assert all("--disaggregation-mode decode" in s for s in servers[1:4])
    assert ("--pd-disaggregation --prefill http://127.0.0.1:30001 8998 --decode http://127.0.0.1:30002"
            in servers[-1])
    # across nodes each server says its node, its GPUs numbered within it; the run.py line predicts it
    # (a live deployment is one host), and the servers' addresses are said to be the nodes'
    wide = config("llama-3.1-70b", "h100-sxm-x8-2nodes-ib", tp=8)
    lines = command_lines(wide, {"pd": "1p1d", "pd.bootstrap_port": 9100}, 8)
    assert lines[0] == ("  python run.py pd=1p1d pd.bootstrap_port=9100 workload.concurrency=[8] predict=true"
                        "  (across nodes: in prediction)")
    assert lines[2].startswith("  Across nodes: each server's --host is its node's address")
    assert "--disaggregation-bootstrap-port 9100" in lines[1]  # the configured bootstrap port
    servers = lines[1].split(" & ")
    assert servers[0].startswith("  SGLang as parasweep measures it")
    assert "[node 0] CUDA_VISIBLE_DEVICES=0," in servers[0]
    assert servers[1].startswith("[node 1] CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ")


def test_a_candidate_that_cannot_run_here_is_not_measured() -> None:
    # measured trials select the group's option (a group cannot be force-added); a deployment wider than
    # the node is judged in virtual time only, and says why it is not measured
    argv = trial_argv(["experiment=x"], {"pd": "1p1d", "tp.size": 4}, [8], "run", "label", Path("out"))
    assert "pd=1p1d" in argv and "++tp.size=4" in argv and not any(a.startswith("++pd") for a in argv)
    wide = config("llama-3.1-70b", "h100-sxm-x8-2nodes-ib", tp=8)
    why = live_refusal(wide, {"pd": "1p1d"})
    assert why.startswith("pd.prefill.workers+pd.decode.workers=1+1: invalid (the deployment takes 16 GPUs")
    assert live_refusal(config("llama-3.1-70b", "h100-sxm-x8", tp=4), {"pd": "1p1d"}) == ""


@pytest.mark.slow  # two candidates predicted up to their cap
def test_the_cap_on_load_is_per_decode_server(tmp_path: Path) -> None:
    cfg = config("llama-3.1-8b", "h100-sxm-x8", slo={"ttft_p99_ms": 60_000.0})  # an SLO nothing misses
    cfg.search.name, cfg.search.space, cfg.search.max_concurrency = "cap", ["pd=choice(1p1d,1p3d)"], 4
    by = {o.change["pd"]: o for o in run_search(cfg, tmp_path, show_progress=False).outcomes}
    assert (by["1p1d"].concurrency, by["1p3d"].concurrency) == (4, 12)
    assert by["1p1d"].limit == "the cap search.max_concurrency=4, not an SLO"
    assert by["1p3d"].limit == "the cap search.max_concurrency=4 per decode server (12 in all), not an SLO"
