"""Bad input: one line on stderr naming the key, the value and what is valid; exit code 2;
nothing launched and nothing written to the MLflow store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # each test runs the real entry point in a subprocess

TINY = ["model=tiny-test", "hardware=h200-nvlink-x8", "parallelism=tp1"]
CASES = [
    # (overrides, fragments the one-line message must contain)
    (["model=gpt-9"], ["model=gpt-9", "unknown model", "kimi-k2", "tiny-test"]),
    (["hardware=dgx-a100"], ["hardware=dgx-a100", "unknown hardware", "h200-nvlink-x8"]),
    (["pp.asyn_depth=4"], ["pp.asyn_depth", "unknown config key", "async_depth", "micro_batch_size"]),
    (["pp.async_depth=abc"], ["pp.async_depth=abc", "an integer"]),
    (["tp.size=2"], ["tp.size*pp.size*dp.size=16", "at most 8", "rtx-pro-6000-pcie-x8"]),
    (["parallelism=tp1", "pp.size=5", "model=tiny-test"], ["pp.size=5", "1..4", "4 layers"]),
    (["parallelism=tp8", "ep.size=3"], ["ep.size=3", "divisor of tp.size=8", "[1, 2, 4, 8]"]),
    (["model=llama-3.1-8b", "parallelism=ep8"], ["ep.size=8", "no experts"]),
    (["parallelism=tp8", "dp.attention=3"], ["dp.attention=3", "divisor of tp.size=8", "[1, 2, 4, 8]"]),
    (["parallelism=tp4", "dp.size=2", "dp.attention=2"],
     ["dp.attention=2", "1 with dp.size=2", "replicas combined with attention data parallelism"]),
    (["parallelism=tp8", "ep.a2a_backend=nccl"],
     ["ep.a2a_backend=nccl", "none, deepep, mooncake", "SGLang 0.5.23's --moe-a2a-backend"]),
    (["parallelism=tp8", "ep.deepep_mode=fast"], ["ep.deepep_mode=fast", "auto, normal, low_latency"]),
    (["parallelism=tp8", "ep.redundant_experts=-1"], ["ep.redundant_experts=-1", "an integer >= 0"]),
    (["parallelism=tp8-dpa8-deepep", "ep.two_batch_overlap=true"],
     ["ep.two_batch_overlap=True", "does not model two-batch overlap", "false on the simulated engine"]),
    (["parallelism=tp8", "dp.attention=8", "dp.router=cache_aware"],
     ["dp.router=cache_aware", "round_robin or total_requests with dp.attention > 1"]),
    (["pp.async_depth=99"], ["pp.async_depth=99", "0..64"]),
    (["pp.micro_batch_size=0"], ["pp.micro_batch_size=0", ">= 1 or null"]),
    (["parallelism=tp8", "pp.async_depth=4"], ["pp.async_depth=4", "0 when pp.size=1"]),
    (["workload.api=grpc"], ["workload.api=grpc", "generate, completions, chat"]),
    (["engine=trtllm"], ["engine=trtllm", "unknown engine", "sglang", "sim", "vllm"]),
    (["engine=vllm", "ray.num_gpus=8"],
     ["engine.python=", "vLLM is not installed there", 'pip install -e ".[vllm]"']),
    # what the simulated engine playing vLLM does not model: refused before a trial, on the key that set it
    (["engine=vllm", "vllm.scheduling_policy=priority"],
     ["vllm.scheduling_policy=priority", "not modelled", "simulated engine playing vLLM"]),
    (["engine=vllm", "model=qwen3-30b-a3b", "parallelism=tp1", "pp.size=2", "dp.size=2"],
     ["dp.size=2", "--pipeline-parallel-size > 1 on a MoE model is not modelled"]),
    (["engine=vllm", "model=qwen3-8b", "parallelism=tp1", "pd.enabled=true", "pd.transfer_backend=nixl",
      "pd.prefill.dp=2"], ["pd.prefill.dp=2", "not modelled yet", "1 on the simulated engine"]),
    (["parallelism=tp1", "tp.size=3"], ["tp.size=3", "64 attention heads", "[1, 2, 4, 8, 16, 32, 64]"]),
    (["workload.input_len=300000"], ["workload.input_len+workload.output_len=300032", "at most 262144"]),
    (["workload.concurrency=8"], ["workload.concurrency", "a list, e.g. [8]"]),
    (["+server.extra_args.no_such_flag=1"], ["server.extra_args", "--no-such-flag", "simulated engine"]),
    (["model.path=/"], ["model.path=/", "no config.json", "HF config.json"]),
    (["tp.size=-1"], ["tp.size=-1", "an integer >= 1"]),
    (["workload.output_len=0"], ["workload.output_len=0", "an integer >= 1"]),
    (["workload.input_dist=zipf"], ["workload.input_dist=zipf", "lognormal:SIGMA", "must be one of"]),
    (["workload.output_dist=uniform:2"], ["workload.output_dist=uniform:2", "0 <= R <= 1"]),
    (["+server.extra_args.kv-cache-dtype=nvfp4"],
     ["server.extra_args", "invalid choice: 'nvfp4'", "fp8_e4m3"]),
    (["pp.async_depth=[1,"], ["pp.async_depth=[1,", "cannot be parsed", "key=value"]),
    ([*TINY, "workload=sharegpt", "workload.dataset_path=/nonexistent/sharegpt.json"],
     ["workload.dataset_path=/nonexistent/sharegpt.json", "No such file", "a readable sharegpt file"]),
    ([*TINY, "workload=mooncake", "workload.arrival=gamma"],
     ["workload.arrival=gamma", "gamma needs its coefficient of variation"]),
    ([*TINY, "-m", "search=tiny"], ["search=tiny", "drop -m"]),
    ([*TINY, "search=tiny", "search.objective=speed"],
     ["search.objective=speed", "output_tok_s_per_gpu, goodput_req_s_per_gpu"]),
    ([*TINY, "search=tiny", "+search.slo.ttft_p42_ms=9"],
     ["search.slo.ttft_p42_ms=9", "unknown metric", "ttft_p99_ms"]),
    ([*TINY, "search=tiny", "search.space=[]"],
     ["search.space=[]", "the space is empty"]),
    ([*TINY, "workload.warmup_per_concurrency=-1"],
     ["workload.warmup_per_concurrency=-1", "a number >= 0 of warm-up requests per stream, or null"]),
    ([*TINY, "predict=true", "workload.predicted.ci_target=2"],
     ["workload.predicted.ci_target=2", "a fraction between 0 and 1"]),
    ([*TINY, "predict=true", "workload.predicted.budget_s=0"],
     ["workload.predicted.budget_s=0", "seconds > 0 of the engine's virtual time"]),
    ([*TINY, "search=tiny", "search.measure_top=-1"],
     ["search.measure_top=-1", "an integer >= 0 (0: predict only)"]),
    ([*TINY, "search=tiny", "search.slo.itl_p99_ms=0.5"],
     ["search.slo: no candidate meets itl_p99_ms <= 0.5; closest: server.cuda_graph=true tp.size=1"]),
    # measured across two nodes: on a Ray cluster, as a sweep
    (["model=kimi-k2", "hardware=h100-sxm-x8-2nodes-ib", "parallelism=tp8pp2"],
     ["tp.size*pp.size*dp.size=16", "across nodes: ray.address=auto or host:port of a Ray cluster"]),
    (["model=kimi-k2", "hardware=h100-sxm-x8-2nodes-ib", "parallelism=tp8pp2", "ray.address=auto"],
     ["a trial across 2 nodes runs as a sweep on the Ray cluster", "add -m"]),
    # an output directory that cannot be created (under /proc nothing can, even for root)
    (["hydra.run.dir=/proc/parasweep-nope"],
     ["/proc/parasweep-nope", "cannot be written", "writable directory"]),
    (["-m", "hydra.sweep.dir=/proc/parasweep-nope", "pp.async_depth=0,1"],
     ["/proc/parasweep-nope", "cannot be written"]),
]


@pytest.mark.parametrize(("overrides", "fragments"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_config_is_one_clear_line(overrides: list[str], fragments: list[str], workdir: Path) -> None:
    result = run_cli(overrides, workdir)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("parasweep: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr
    assert not (workdir / "runs" / "mlflow.db").exists()  # nothing tracked, nothing launched


def test_bad_value_in_a_sweep_fails_before_any_trial(workdir: Path) -> None:
    result = run_cli(["-m", "pp.async_depth=0,99"], workdir)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "parasweep: pp.async_depth=99: invalid; valid: 0..64"
    assert not (workdir / "runs" / "mlflow.db").exists()


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released, so the kernel refuses a connection)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "sweep"])
def test_unreachable_tracking_server_is_one_line_before_any_start(multirun: bool, workdir: Path) -> None:
    import time

    uri = f"http://alice:s3cret@127.0.0.1:{_closed_port()}"
    args = (["-m", "pp.async_depth=0,4"] if multirun else []) + [f"tracking.uri={uri}"]
    start = time.monotonic()
    result = run_cli(args, workdir, timeout=60)
    took = time.monotonic() - start
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    shown = uri.replace("s3cret", "***")
    assert lines[0].startswith(f"parasweep: tracking.uri={shown}: invalid (cannot reach an MLflow server "
                               "there: Connection refused); valid: ")
    assert "null for runs/mlflow.db" in lines[0]
    assert "s3cret" not in result.stderr + result.stdout
    assert took < 15, f"took {took:.0f} s"  # the interpreter and Hydra start; the probe is immediate
    assert not list(workdir.rglob("progress.json"))  # no trial started


def test_unwritable_sqlite_location_is_one_line(workdir: Path) -> None:
    (workdir / "afile").write_text("not a directory")
    uri = f"sqlite:///{workdir / 'afile' / 'mlflow.db'}"
    result = run_cli([f"tracking.uri={uri}"], workdir, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"parasweep: tracking.uri={uri}: invalid (cannot create ")
    assert "is a file, not a directory" in lines[0]
    assert not list(workdir.rglob("progress.json"))


def test_a_search_slo_on_any_statistic_from_the_command_line(workdir: Path) -> None:
    # a bound on a statistic the preset does not name is given as a mapping, and a preset's removed
    result = run_cli(["search=tiny", *TINY, "search.slo={ttft_mean_ms: 1000, tpot_mean_ms: 30}",
                      "~search.slo.itl_p99_ms", "--cfg", "job"], workdir)
    assert result.returncode == 0, result.stderr
    slo = result.stdout[result.stdout.index("  slo:"):].splitlines()[1:4]
    assert slo[:2] == ["    ttft_mean_ms: 1000.0", "    tpot_mean_ms: 30.0"] and "itl_p99" not in slo[2]
    # a statistic no point reports is still refused, in one line naming the key
    bad = run_cli(["search=tiny", *TINY, "search.slo={ttft_foo_ms: 1000}"], workdir)
    assert bad.returncode == 2 and bad.stderr.startswith("parasweep: search.slo.ttft_foo_ms=1000.0: invalid")
