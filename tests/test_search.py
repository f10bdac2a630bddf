"""The search in prediction: its space read with Hydra's sweep syntax, its bad inputs as one line each,
and a search whose answer is known by construction (nothing launched: every candidate is predicted on
the simulated engine in virtual time)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError, UserError
from orchestrator.prediction.at_load import steady_point
from orchestrator.prediction.modelled import apply_change, point_predictor
from orchestrator.search.evaluate import (
    OK,
    OVER_SLO,
    PRUNED,
    REJECTED,
    Outcome,
    Screened,
    check_settings,
    evaluate,
    highest_load,
    screen,
)
from orchestrator.search.judge import evaluate_all
from orchestrator.search.runner import answer_lines, command_lines, run_search, search_base
from orchestrator.search.space import Dimension, candidates, parse_space
from vocab.hardware import load_hardware


def test_the_space_in_hydras_sweep_syntax() -> None:
    dims = parse_space(["tp.size=choice(1,2,4,8)", "pp.async_depth=range(0,17,4)", "pp.size=1,2",
                        "pp.micro_batch_size=null,4", "+server.extra_args.enable-mixed-chunk=true,false",
                        "server.cuda_graph=true"])
    assert dims == [Dimension("tp.size", (1, 2, 4, 8)), Dimension("pp.async_depth", (0, 4, 8, 12, 16)),
                    Dimension("pp.size", (1, 2)), Dimension("pp.micro_batch_size", (None, 4)),
                    Dimension("server.extra_args.enable-mixed-chunk", (True, False)),
                    Dimension("server.cuda_graph", (True,))]
    every = list(candidates(dims))
    assert len(every) == 4 * 5 * 2 * 2 * 2 and every[0] == {
        "tp.size": 1, "pp.async_depth": 0, "pp.size": 1, "pp.micro_batch_size": None,
        "server.extra_args.enable-mixed-chunk": True, "server.cuda_graph": True}


@pytest.mark.parametrize(("space", "fragment"), [
    ([], "the space is empty"),
    (["tp.size"], "search.space=tp.size: invalid"),
    (["tp.size=interval(1,8)"], "Can only enumerate CHOICE and RANGE sweeps"),
    (["tp.size=1,2", "tp.size=4"], "tp.size is given twice"),
])
def test_a_bad_space_is_one_line(space: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_space(space)
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("objective", "speed", "search.objective=speed: invalid; valid: output_tok_s_per_gpu, goodput_"),
    ("slo", {"ttft_p42_ms": 100.0}, "search.slo.ttft_p42_ms=100.0: invalid (unknown metric)"),
    ("slo", {"itl_p99_ms": -1.0}, "search.slo.itl_p99_ms=-1.0: invalid; valid: a positive number"),
])
def test_bad_settings_are_one_line(field: str, value: object, fragment: str) -> None:
    cfg = ParasweepConf()
    setattr(cfg.search, field, value)
    with pytest.raises(ConfigError) as e:
        check_settings(cfg)
    assert fragment in str(e.value)


def test_the_highest_load_is_found_by_doubling_then_bisection() -> None:
    asked: list[int] = []

    def holds(c: int) -> bool:
        asked.append(c)
        return c <= 37

    assert 37 - 37 // 8 <= highest_load(holds, 256) <= 37  # to within an eighth
    assert asked[:4] == [8, 16, 32, 64]  # without a guess: doubling from 8, then bisected in 32..64
    assert highest_load(lambda c: c <= 5, 256) == 5  # small loads: to the request
    assert highest_load(lambda c: True, 100) == 100
    assert highest_load(lambda c: False, 100) is None


@pytest.mark.parametrize("start", [None, 1, 3, 8, 30, 37, 44, 100, 256])
@pytest.mark.parametrize("threshold", [1, 2, 7, 37, 150, 256])
def test_the_highest_load_from_any_guess(start: int | None, threshold: int) -> None:
    asked: list[int] = []

    def holds(c: int) -> bool:
        asked.append(c)
        return c <= threshold

    found = highest_load(holds, 256, start)
    assert found is not None and threshold - threshold // 8 <= found <= threshold
    assert all(1 <= c <= 256 for c in asked) and len(asked) == len(set(asked))  # each load once
    assert highest_load(lambda c: False, 256, start) is None


def test_a_good_guess_costs_few_points() -> None:
    asked: list[int] = []

    def holds(c: int) -> bool:
        asked.append(c)
        return c <= 40

    assert 35 <= (highest_load(holds, 256, 38) or 0) <= 40
    assert len(asked) <= 4


def tiny(tmp_path: Path, slo: dict[str, float]) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    cfg.workload.input_len, cfg.workload.output_len = 64, 32
    cfg.search.name = "tiny"
    cfg.search.space = ["server.cuda_graph=true,false", "tp.size=choice(1,2,16)"]
    cfg.search.slo, cfg.search.max_concurrency, cfg.search.workers = slo, 64, 1
    return search_base(cfg)


def test_a_search_whose_answer_is_known(tmp_path: Path) -> None:
    # By construction: a tiny model's decode steps are launch-bound, so eager steps (no CUDA graph) are
    # about twice as long as a graph replay; a second GPU of TP adds nothing to its throughput and so
    # halves the tokens per GPU; and 16 GPUs do not fit an 8-GPU node. The best per GPU is CUDA graphs
    # on one GPU, and the SLO on ITL lets it run at the most concurrency of all. (The bound, 5 ms, leaves
    # room for the prefills of streams that arrive one by one, as a steady closed loop's do.)
    result = run_search(tiny(tmp_path, {"itl_p99_ms": 5.0}), tmp_path, show_progress=False)
    best, *rest = result.ranked
    assert best.change == {"server.cuda_graph": True, "tp.size": 1}
    assert best.concurrency == max(o.concurrency or 0 for o in result.outcomes)
    assert rest[0].change == {"server.cuda_graph": True, "tp.size": 2}
    assert rest[0].score == pytest.approx(best.score / 2, rel=0.1)
    rejected = [o for o in result.outcomes if o.status == REJECTED]
    assert [o.change["tp.size"] for o in rejected] == [16, 16]
    assert all("needs 16 GPUs" in o.reason and "has 8 GPUs" in o.reason for o in rejected)
    # eager decode steps: the ITL SLO holds only at a lower load
    eager = next(o for o in result.outcomes if o.change == {"server.cuda_graph": False, "tp.size": 1})
    assert eager.status == OK and eager.concurrency is not None and eager.concurrency < best.concurrency
    # one table of every candidate, in Parquet and CSV
    table = pd.read_parquet(tmp_path / "search" / "candidates.parquet")
    assert len(table) == 6 and list(table["status"]).count(REJECTED) == 2
    assert len(pd.read_csv(tmp_path / "search" / "candidates.csv")) == 6
    # how sure each predicted candidate's throughput is: its interval, and whether its budget ran out
    judged = table[table["status"] == OK]
    assert judged["output_tok_s_ci95_rel"].notna().all() and judged["budget_hit"].isin([0.0, 1.0]).all()
    cfg = tiny(tmp_path, {"itl_p99_ms": 5.0})
    lines = answer_lines(cfg, result, check_settings(cfg))
    best_line = next(line for line in lines if line.startswith("Best:"))
    rel = best.metrics["output_tok_s_ci95_rel"]
    assert f"{best.metrics['output_tok_s']:,.0f} tok/s ±{100 * rel:.0f} %" in best_line
    assert ("short of its target" in best_line) is (best.metrics["budget_hit"] == 1.0)


def test_the_answer_says_how_to_serve_the_real_model(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, {"itl_p99_ms": 5.0})
    cfg.model.weights = "meta-llama/Llama-3.1-8B-Instruct"
    measured, real = command_lines(cfg, {"tp.size": 2}, 16)[1:]
    assert "--load-format dummy" in measured and "--skip-tokenizer-init" in measured
    assert real.startswith("  SGLang serving the real model (meta-llama/Llama-3.1-8B-Instruct): python -m ")
    assert "--model-path meta-llama/Llama-3.1-8B-Instruct" in real and "--tp-size 2" in real
    assert "dummy" not in real and "--skip-tokenizer-init" not in real and "models/tiny-test" not in real


def test_a_candidate_on_vllm_is_given_as_vllm_serve(tmp_path: Path) -> None:
    # a search over engines (engine=choice(sglang,vllm)): the vLLM candidate's launch is vLLM's command
    cfg = tiny(tmp_path, {"itl_p99_ms": 5.0})
    run_py, launch, real = command_lines(cfg, {"engine": "vllm", "tp.size": 2}, 16)
    assert "engine=vllm tp.size=2" in run_py and "sglang" not in launch + real
    assert launch.startswith("  vLLM as parasweep would launch it (0.34.0's flags;")
    assert "vllm serve " in launch and "--tensor-parallel-size 2" in launch
    assert "--load-format dummy" in launch


def test_a_cap_on_load_is_per_replica_and_said_when_it_held(tmp_path: Path) -> None:
    # no SLO the tiny model can miss at these loads: the cap holds every candidate
    cfg = tiny(tmp_path, {"ttft_p99_ms": 60_000.0})
    cfg.search.space, cfg.search.max_concurrency = ["dp.size=1,2"], 8
    outcomes = {o.change["dp.size"]: o for o in run_search(cfg, tmp_path, show_progress=False).outcomes}
    assert outcomes[1].concurrency == 8 and outcomes[2].concurrency == 16  # 8 per replica
    assert outcomes[1].limit == "the cap search.max_concurrency=8, not an SLO"
    assert outcomes[2].limit == "the cap search.max_concurrency=8 per replica (16 in all), not an SLO"


def test_no_candidate_meets_the_slos_names_the_closest(tmp_path: Path) -> None:
    with pytest.raises(UserError) as e:
        run_search(tiny(tmp_path, {"itl_p99_ms": 0.5}), tmp_path, show_progress=False)
    message = str(e.value)
    assert message.startswith("search.slo: no candidate meets itl_p99_ms <= 0.5; closest: "
                              "server.cuda_graph=true tp.size=")  # graphs: the eager ones are slower
    assert " misses by " in message
    assert "at concurrency 1" in message and "\n" not in message
    table = pd.read_csv(tmp_path / "search" / "candidates.csv")  # the table is written all the same
    assert set(table["status"]) == {OVER_SLO, REJECTED}


@pytest.mark.slow  # the real entry point in a subprocess, and the measured trials each in its own
def test_the_search_from_the_command_line(tmp_path: Path) -> None:
    from analysis.store import client as store_client
    from tests.conftest import run_cli
    from vocab.status import Tag

    result = run_cli(["model=tiny-test", "hardware=h200-nvlink-x8", "parallelism=tp1", "search=tiny",
                      "search.measure_top=2", "hydra.run.dir=out"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[parasweep] search tiny: 6 candidates of 2 keys (server.cuda_graph, tp.size)" in out
    assert "not measured" in out
    assert "Search tiny: 6 candidates: 4 within the SLOs, 0 over them at any load, 0 could not win" in out
    assert "Best: server.cuda_graph=true tp.size=1 at concurrency " in out
    # the winner's command line keeps the search's own overrides (its model, node, layout) and turns the
    # search off
    assert ("  python run.py model=tiny-test hardware=h200-nvlink-x8 parallelism=tp1 search.name=null "
            "server.cuda_graph=true tp.size=1 workload.concurrency=[") in out
    # the winner as SGLang would be launched with it
    command = next(line for line in out.splitlines() if line.startswith("  SGLang as parasweep measures it"))
    assert "python -m sglang.launch_server --model-path " in command and "--tp-size 1" in command
    assert "--disable-cuda-graph" not in command and "--host 127.0.0.1" in command
    assert "random weights of the config folder" in command and "--load-format dummy" in command
    assert "  To serve the real model: --model-path the weights' folder or Hugging Face id" in out
    assert "Rejected 2: tp.size*pp.size*dp.size: valid at most 8 (hardware h200-nvlink-x8 has 8 GPUs)" in out
    assert len(pd.read_csv(tmp_path / "out" / "search" / "candidates.csv")) == 6
    # then the best two measured, each as a trial of the search's one MLflow run, on the simulated engine
    # (said so); the predicted best, known by construction, is among them
    assert "Measured on the simulated engine in real time (a stand-in, not a GPU)" in out
    assert "  #1 server.cuda_graph=true tp.size=1 [ok]" in out
    assert "  #2 server.cuda_graph=true tp.size=2 [ok]" in out
    assert "Rank agreement (Kendall's tau, predicted against measured order): " in out
    client = store_client(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    searches = client.search_runs(["1"], filter_string="tags.`parasweep.mode` = 'search'")
    assert len(searches) == 1
    search = searches[0]
    assert search.data.tags[Tag.STATUS] == "ok" and search.data.tags[Tag.SEARCH] == "tiny"
    assert "not measured" in search.data.tags[Tag.SEARCH_SOURCE]
    assert search.data.metrics["search/candidates"] == 6.0 and search.data.metrics["search/rejected"] == 2.0
    artifacts = {a.path for a in client.list_artifacts(search.info.run_id, "search")}
    assert {"search/candidates.parquet", "search/candidates.csv", "search/pareto_per_user.png",
            "search/pareto_ttft.png", "search/answer.md", "search/measured.csv"} <= artifacts
    children = client.search_runs(["1"], filter_string=f"tags.mlflow.parentRunId = '{search.info.run_id}'")
    labels = sorted(c.data.tags[Tag.OVERRIDES] for c in children)
    assert labels == ["search #1 server.cuda_graph=true tp.size=1",
                      "search #2 server.cuda_graph=true tp.size=2"]
    assert all(c.data.tags[Tag.STATUS] == "ok" and c.data.tags[Tag.ENGINE] == "sim" for c in children)
    measured = pd.read_csv(tmp_path / "out" / "search" / "measured.csv")
    assert set(measured["predicted_rank"]) == {1, 2} and measured["measured_output_tok_s"].notna().all()
    assert measured["predicted_output_tok_s"].notna().all()
    # the calibration the search offers reads the measured trials from the search's run
    from orchestrator.calibrate import read_run

    assert len(read_run(search.info.run_id, f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")) == 2
    report = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Search</h2>" in report and "Pareto front" in report and "Measured candidates" in report


PRUNABLE = ["server.cuda_graph=true,false", "tp.size=1,2", "pp.size=1,2", "pp.micro_batch_size=null,1,2"]


@pytest.mark.slow  # dozens of candidates predicted, on a pool of processes
def test_the_cost_models_ceiling_bounds_every_prediction(tmp_path: Path) -> None:
    # The ceiling is what lets a search skip a candidate: it must never be below what the candidate is
    # then predicted to score, or the search would skip one that could have won. (The SLO leaves room
    # for the tiny model's PP2 candidates, whose tokens are paced by the PP loop's host work.)
    cfg = tiny(tmp_path, {"itl_p99_ms": 8.0})
    cfg.search.max_concurrency = 24
    settings = check_settings(cfg)
    judged = 0
    for change in candidates(parse_space(["server.cuda_graph=true", *PRUNABLE[1:]])):
        screened = screen(cfg, change, settings)
        if not isinstance(screened, Screened):
            continue
        outcome = evaluate(cfg, screened, settings)
        if outcome.score is not None:
            judged += 1
            assert outcome.score <= screened.ceiling, change
    assert judged == 12


@pytest.mark.slow  # dozens of candidates predicted, on a pool of processes
def test_pruning_keeps_the_exhaustive_top(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, {"itl_p99_ms": 3.0})
    cfg.search.max_concurrency = 24
    settings = check_settings(cfg)
    changes = list(candidates(parse_space(PRUNABLE)))
    every = evaluate_all(cfg, changes, settings, workers=1, keep=len(changes), show_progress=False)
    pruned = evaluate_all(cfg, changes, settings, workers=2, keep=3, show_progress=False)
    assert [o.change for o in pruned] == changes  # the candidates' order, whatever the order of work

    def top(outcomes: list[Outcome]) -> list[tuple[str, float | None]]:
        ok = sorted((o for o in outcomes if o.status == OK and not o.same_as), key=lambda o: -(o.score or 0))
        return [(str(o.change), o.score) for o in ok[:3]]

    assert top(pruned) == top(every)
    skipped = [o for o in pruned if o.status == PRUNED]
    # bounded by the cost model: nothing predicted; by a load that missed the SLOs, once the bar was
    # known: what was predicted up to that load
    by_model = [o for o in skipped if "the cost model's ceiling" in o.reason or "ITL bound" in o.reason]
    by_load = [o for o in skipped if "which misses the SLOs, and every load below it" in o.reason]
    assert skipped and len(by_model) + len(by_load) == len(skipped)
    assert all(o.predictions == 0 for o in by_model) and all(o.predictions >= 1 for o in by_load)
    assert sum(o.predictions for o in pruned) < sum(o.predictions for o in every)
    # a micro-batch cap left to its default and the same cap given are one engine, judged once
    twins = [o for o in pruned if o.same_as]
    assert all(o.predictions == 0 for o in twins)


@pytest.mark.slow  # dozens of candidates predicted, on a pool of processes
def test_a_space_larger_than_max_candidates_is_sampled(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, {"itl_p99_ms": 3.0})
    cfg.search.space, cfg.search.max_candidates, cfg.search.workers = PRUNABLE, 10, 2
    cfg.search.max_concurrency = 24
    first = run_search(cfg, tmp_path / "a", show_progress=False)
    picked = [o.change for o in first.outcomes]
    assert len(picked) == 10 and len({str(c) for c in picked}) == 10  # ten distinct candidates
    assert first.answer[0].startswith("Search tiny: 10 of 24 candidates (picked by Optuna's TPE sampler, "
                                      "seed 0; the best of those, not of the whole space): ")
    assert len(pd.read_csv(tmp_path / "a" / "search" / "candidates.csv")) == 10
    again = run_search(cfg, tmp_path / "b", show_progress=False)  # the same seed picks the same ones
    assert [o.change for o in again.outcomes] == picked
    cfg.search.max_candidates = 0
    with pytest.raises(ConfigError) as e:
        run_search(cfg, tmp_path / "c", show_progress=False)
    assert "search.max_candidates=0: invalid; valid: an integer >= 1" in str(e.value)


@pytest.mark.slow  # a handful of candidates predicted in full, with and without the shortcut
@pytest.mark.parametrize(("itl_p99_ms", "confirmed"), [(20.0, True), (5.0, False)])
def test_more_replicas_are_judged_from_one_as_the_full_simulation_judges_them(
        tmp_path: Path, itl_p99_ms: float, confirmed: bool) -> None:
    # Round-robin DP replicas are near interchangeable: dp.size=k at concurrency k·c is about one replica
    # at c. The search predicts the fewest replicas, derives the others, and holds each derived load to
    # one full simulation of all k replicas at k·c; where that misses the SLOs the candidate is judged
    # in full. An ITL bound of 20 ms: the cap holds every count, and the derived loads are confirmed.
    # Of 5 ms: one replica holds it up to the cap (its arrivals are its own ends, one prefill a step),
    # k replicas dealt requests round-robin see two arrivals in one step now and then (6.6 ms), and
    # are judged in full. Either way, each outcome is held against the full judgement of the same
    # candidate.
    cfg = tiny(tmp_path, {"itl_p99_ms": itl_p99_ms})
    cfg.search.max_concurrency = 24
    settings = check_settings(cfg)
    changes = [{"dp.size": 1}, {"dp.size": 2}, {"dp.size": 4}]
    outcomes = evaluate_all(cfg, changes, settings, workers=1, show_progress=False)
    head, *derived = outcomes
    assert head.predictions > 0 and not head.replicas_of and head.concurrency == 24
    for o, k in zip(derived, (2, 4), strict=True):
        screened = screen(cfg, o.change, settings)
        assert isinstance(screened, Screened)
        full = evaluate(cfg, screened, settings)
        assert o.gpus == full.gpus == k and o.max_load == full.max_load == 24 * k
        assert bool(o.replicas_of) is confirmed
        if not confirmed:  # one prediction at the derived load, then the full judgement
            assert (o.concurrency, o.limit) == (full.concurrency, full.limit)
            assert o.predictions == full.predictions + 1
            assert full.concurrency is not None and full.concurrency < 24 * k
            continue
        assert o.replicas_of == f"{k} x (dp.size=1)" and o.predictions == 1
        assert o.concurrency == full.concurrency == 24 * k and o.limit == full.limit
        # at the derived load: the numbers of all k replicas predicted in full, not k times one's (here
        # far fewer: one replica's fixed-length requests run in step, a wave's prefills in one step,
        # where k replicas dealt round-robin prefill a request or two in most steps)
        changed, env = apply_change(cfg, o.change)
        predict = point_predictor(changed, env)
        at = predict(steady_point(24 * k, predict, changed.workload.predicted)).metrics
        assert o.metrics == at and o.score == pytest.approx(full.score, rel=1e-9)


@pytest.mark.slow
def test_a_cache_aware_router_keeps_its_replicas_judged_in_full(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, {"itl_p99_ms": 5.0})
    cfg.search.max_concurrency = 8
    cfg.dp.router = "cache_aware"
    outcomes = evaluate_all(cfg, [{"dp.size": 1}, {"dp.size": 2}], check_settings(cfg), workers=1,
                            show_progress=False)
    assert all(o.predictions > 0 and not o.replicas_of for o in outcomes)
