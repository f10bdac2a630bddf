"""The simulated engine playing vLLM as a real process over real HTTP: only vLLM's API, its metrics and
log lines; its live results against its own prediction; ``python run.py -m engine=sglang,vllm`` as a
sweep of both engines on this machine; a fault in the middle of a vLLM trial."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from orchestrator.store.tracking import Tracker
from orchestrator.telemetry.server_metrics import parse_samples
from orchestrator.telemetry.vllm_log import vllm_log_frame
from simulator.predict import predict_point
from tests.conftest import NO_DRAWING, run_cli
from tests.test_fault_detection import _no_leftovers
from tests.test_simulator_live_vs_predicted import _histogram_mean
from tests.test_simulator_server import Server
from vocab.status import RunKind, Tag
from workloads import LoadPoint, RequestSpec, clock, run_point

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
ARGV = ["serve", str(REPO / "models" / "llama-3.1-8b"), "--sim-hardware", "h100-sxm-x8", "--seed", "1",
        "--max-num-batched-tokens", "1024"]
POINT = LoadPoint(num_requests=24, concurrency=8)
SPEC = RequestSpec(api="completions", input_len=900, output_len=128)


def test_it_serves_vllms_api_metrics_and_log_lines_only(tmp_path: Path) -> None:
    server = Server([*ARGV, "--sim-time-scale", "20", "--sim-vllm-release", "0.19.0"], tmp_path)
    try:
        assert server.get("/generate")[0] in (404, 405) and server.get("/server_info")[0] == 404
        models = json.loads(server.get("/v1/models")[1])["data"][0]
        assert models["owned_by"] == "vllm" and models["max_model_len"] == 131072
        assert json.loads(server.get("/version")[1]) == {"version": "0.19.0"}
        info = json.loads(server.get("/parasweep_sim/info")[1])
        with clock.engine_clock(info["sim_time_scale"], info["sim_wall_origin"]):
            result = run_point(server.url, POINT, SPEC, lag_threshold_ms=250.0)
        time.sleep(1.0)  # one stats interval (10 of the engine's seconds) after the load
        text = server.get("/metrics")[1].decode()
        log = server.log()
    finally:
        server.stop()
    assert result.metrics["completed"] == 24
    names = {s["name"] for s in parse_samples(text, 0.0)}
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_count", "vllm:generation_tokens_total"} <= names
    assert not any(n.startswith("sglang:") for n in names)
    assert "GPU KV cache size: " in log and "Application startup complete." in log
    path = tmp_path / "server.log"
    path.write_text(log)
    stats = vllm_log_frame(path)
    assert len(stats) >= 1 and stats["gen_throughput"].max() > 0  # the periodic line, read back


def test_a_moe_model_s_dp_ranks_serve_their_own_series_and_stats_lines(tmp_path: Path) -> None:
    """--data-parallel-size 2 with the experts spread: two engine cores in lockstep behind one API
    server, each with its own ``engine`` label and stats line, the requests spread over both."""
    argv = ["serve", str(REPO / "models" / "qwen3-30b-a3b"), "--sim-hardware", "h100-sxm-x8", "--seed", "1",
            "--data-parallel-size", "2", "--enable-expert-parallel", "--sim-time-scale", "20"]
    server = Server(argv, tmp_path)
    try:
        info = json.loads(server.get("/parasweep_sim/info")[1])
        with clock.engine_clock(info["sim_time_scale"], info["sim_wall_origin"]):
            result = run_point(server.url, POINT, SPEC, lag_threshold_ms=250.0)
        time.sleep(1.0)  # one stats interval after the load
        text = server.get("/metrics")[1].decode()
        log = server.log()
    finally:
        server.stop()
    assert result.metrics["completed"] == 24
    tokens = {json.loads(s["labels"])["engine"]: s["value"] for s in parse_samples(text, 0.0)
              if s["name"] == "vllm:generation_tokens_total"}
    assert set(tokens) == {"0", "1"} and min(tokens.values()) > 0  # both cores served requests
    assert sum(tokens.values()) == result.metrics["output_tokens_total"]
    path = tmp_path / "server.log"
    path.write_text(log)
    assert set(vllm_log_frame(path)["dp"]) == {0, 1}  # a stats line per core, read back


def test_live_and_predicted_agree_within_5_percent(tmp_path: Path) -> None:
    # one stream of 3,000-token prompts, each prefilled in three steps of the 1,024-token budget: how the
    # client's requests interleave in time cannot change what a step holds (several streams can: which
    # prompts share a step depends on when each reaches the engine, so that is not a test)
    point, spec = LoadPoint(num_requests=8, concurrency=1), RequestSpec(api="completions", input_len=3000,
                                                                       output_len=128)
    pred = predict_point(ARGV, point, spec)
    server = Server([*ARGV, "--sim-time-scale", "4"], tmp_path)
    try:
        info = json.loads(server.get("/parasweep_sim/info")[1])
        with clock.engine_clock(4.0, info["sim_wall_origin"]):
            live = run_point(server.url, point, spec, lag_threshold_ms=250.0)
        text = server.get("/metrics")[1].decode()
    finally:
        server.stop()
    assert live.metrics["completed"] == pred.metrics["completed"] == 8
    ttft = 1e3 * _histogram_mean(text, "vllm:time_to_first_token_seconds")
    assert ttft == pytest.approx(pred.metrics["ttft_mean_ms"], rel=0.05), (ttft, pred.metrics["ttft_mean_ms"])
    itl = 1e3 * _histogram_mean(text, "vllm:inter_token_latency_seconds")
    e2e = 1e3 * _histogram_mean(text, "vllm:e2e_request_latency_seconds")
    assert itl == pytest.approx(pred.metrics["itl_mean_ms"], rel=0.05), (itl, pred.metrics["itl_mean_ms"])
    assert e2e == pytest.approx(pred.metrics["e2e_mean_ms"], rel=0.05), (e2e, pred.metrics["e2e_mean_ms"])


SMALL = ["model=tiny-test", "parallelism=tp1", "workload=tiny", "workload.requests_per_concurrency=12",
         "workload.output_len=64", "telemetry.metrics_period_s=0.2", "ray.num_cpus=2", *NO_DRAWING]


def _trials(workdir: Path) -> dict[str, object]:
    store = Tracker(f"sqlite:///{workdir / 'runs' / 'mlflow.db'}", "parasweep").client
    exp = store.get_experiment_by_name("parasweep")
    runs = store.search_runs([exp.experiment_id]) if exp is not None else []
    return {r.data.tags[Tag.ENGINE]: r for r in runs if r.data.tags.get(Tag.KIND) == RunKind.TRIAL.value}


def test_one_sweep_runs_both_engines_each_with_its_own_telemetry(tmp_path: Path) -> None:
    # in real time, scraped every 0.1 s: vLLM's scheduler series are its gauges, several to a point
    result = run_cli(["-m", "engine=sglang,vllm", *SMALL, "engine.time_scale=1",
                      "telemetry.metrics_period_s=0.1", "workload.output_len=256"], tmp_path, timeout=600,
                     store=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trials = _trials(tmp_path)
    assert set(trials) == {"sim", "sim-vllm"}, result.stdout[-2000:]
    for run in trials.values():
        assert run.data.tags[Tag.STATUS] == "ok"  # type: ignore[attr-defined]
    vllm, sglang = trials["sim-vllm"], trials["sim"]
    assert vllm.data.tags[Tag.ENGINE_VERSION] == "parasweep-sim playing vllm 0.34.0"  # type: ignore[attr-defined]
    assert vllm.data.params["resolved.vllm_version"] == "0.34.0"  # type: ignore[attr-defined]
    trial_dir = Path(vllm.data.tags[Tag.TRIAL_DIR])  # type: ignore[attr-defined]
    scraped = (trial_dir / "telemetry" / "server_metrics.jsonl").read_text()
    assert "vllm:num_requests_running" in scraped and "sglang:" not in scraped
    assert "sglang:num_running_reqs" in (Path(sglang.data.tags[Tag.TRIAL_DIR])  # type: ignore[attr-defined]
                                         / "telemetry" / "server_metrics.jsonl").read_text()
    # the scheduler series came from vLLM's gauges: the running requests of each point
    assert vllm.data.metrics["c4/running_reqs_mean"] > 0  # type: ignore[attr-defined]
    out = result.stdout
    assert "trial #0: Simulated engine (engine=sglang: " in out
    assert "trial #1: Simulated engine playing vLLM 0.34.0 (engine=vllm: " in out
    rows = [line for line in out.splitlines() if "engine=vllm" in line and "ok" in line]
    assert rows and any("engine=sglang" in line for line in out.splitlines())  # each row names its engine


def test_a_fault_mid_point_fails_the_vllm_trial_in_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    result = run_cli(["engine=vllm", "engine.sim_faults.crash_after_requests=5", "engine.time_scale=1",
                      "engine.stop_grace_s=2", *SMALL], tmp_path, timeout=300, store=True)
    trial = _trials(tmp_path)["sim-vllm"]
    assert trial.data.tags[Tag.STATUS] == "failed", result.stdout[-2000:]  # type: ignore[attr-defined]
    last = trial.data.tags[Tag.ERROR].splitlines()[-1]  # type: ignore[attr-defined]
    assert last.startswith("engine exited with code -9 (SIGKILL)") and " during point c1 after " in last
    trial_dir = Path(trial.data.tags[Tag.TRIAL_DIR])  # type: ignore[attr-defined]
    assert (trial_dir / "records" / "requests.parquet").exists()  # what ran before the crash is kept
    assert not _no_leftovers(trial_dir)


@pytest.mark.parametrize(("args", "says"), [
    (["engine=sglang", "vllm.block_size=32"], "vllm.block_size=32: invalid"),
    (["engine=vllm", "pp.size=2", "pp.async_depth=4"], "pp.async_depth=4: invalid"),
    (["engine=vllm", "vllm.release=0.10.0"], "vllm.release=0.10.0: invalid"),
])
def test_a_key_of_the_other_engine_is_refused_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    result = run_cli([*args, "model=tiny-test", "parallelism=tp1", "workload=tiny"], tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.stderr


def _vllm_stand_in(folder: Path, release: str) -> Path:
    """A Python whose installed ``vllm`` (package metadata: ``release``) is the simulated engine playing
    that release: ``python -m vllm.entrypoints.cli.main serve MODEL FLAGS`` runs ``python -m simulator
    serve MODEL FLAGS`` on an H100 profile. As strict as vLLM where parasweep meets it: its parser takes
    the release's flags and exits 2 on any other, it serves only vLLM's routes, metrics and log lines."""
    site = folder / "site"
    cli = site / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for package in (site / "vllm", site / "vllm" / "entrypoints", cli):
        (package / "__init__.py").write_text("")
    (cli / "main.py").write_text(
        "import runpy, sys\n"
        f"sys.argv = ['simulator', *sys.argv[1:], '--sim-hardware', 'h100-sxm-x8', '--sim-vllm-release', "
        f"'{release}']\n"
        "runpy.run_module('simulator', run_name='__main__')\n")
    meta = site / f"vllm-{release}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}\n")
    python = folder / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site}:{REPO} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_a_vllm_trial_launches_reads_and_stops_the_installed_vllm(tmp_path: Path) -> None:
    """engine=vllm on a node with GPUs declared: the command built for the installed release (0.19.0,
    read from its package metadata) is launched as a real vLLM would be, read through vLLM's routes, log
    and metrics, and stopped with its process group. The installed vLLM is a stand-in (above), and the
    run says what answered: the engine version it reports."""
    python = _vllm_stand_in(tmp_path / "vllm-env", "0.19.0")
    result = run_cli(["engine=vllm", f"engine.python={python}", "ray.num_gpus=1", *SMALL], tmp_path,
                     timeout=300, store=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trial = _trials(tmp_path)["vllm"]
    tags = trial.data.tags  # type: ignore[attr-defined]
    assert tags[Tag.STATUS] == "ok" and tags[Tag.ENGINE_VERSION] == "parasweep-sim playing vllm 0.19.0"
    trial_dir = Path(tags[Tag.TRIAL_DIR])
    log = (trial_dir / "server" / "server.log").read_text()
    argv = json.loads((trial_dir / "server" / "argv.json").read_text())
    assert argv[:4] == [str(python), "-m", "vllm.entrypoints.cli.main", "serve"]
    assert "GPU KV cache size: " in log and "Application startup complete." in log
    scraped = (trial_dir / "telemetry" / "server_metrics.jsonl").read_text()
    assert "vllm:num_requests_running" in scraped
    assert not _no_leftovers(trial_dir)


def test_a_speculative_vllm_trial_reads_its_drafts_acceptance_from_vllm_s_counters(tmp_path: Path) -> None:
    result = run_cli(["engine=vllm", "spec=ngram", "spec.num_steps=3", "spec.acceptance=2.0",
                      "engine.time_scale=1", *SMALL], tmp_path, timeout=300, store=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = _trials(tmp_path)["sim-vllm"]
    assert run.data.tags[Tag.STATUS] == "ok"  # type: ignore[attr-defined]
    assert run.data.params["resolved.speculative_num_steps"] == "3"  # type: ignore[attr-defined]
    trial_dir = Path(run.data.tags[Tag.TRIAL_DIR])  # type: ignore[attr-defined]
    scraped = (trial_dir / "telemetry" / "server_metrics.jsonl").read_text()
    assert "vllm:spec_decode_num_drafts_total" in scraped
    accept = {k: v for k, v in run.data.metrics.items() if k.endswith("/spec_accept_len_mean")}  # type: ignore[attr-defined]
    # between scrapes, 1 + accepted / drafts: the acceptance model's mean of 2.0 tokens per verify
    assert accept and all(1.5 < v < 2.5 for v in accept.values()), accept
