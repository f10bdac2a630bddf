"""`dry_run=true` prints each trial's plan and exact server argv, and launches nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.engines.sglang_compat.versions import recorded_flag_set
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # each test runs the real entry point in a subprocess


def test_dry_run_sweep_prints_argv_per_trial(workdir: Path) -> None:
    result = run_cli(["dry_run=true", "-m", "pp.async_depth=0,8"], workdir)
    assert result.returncode == 0, result.stderr
    argvs = [json.loads(line[len("argv: "):]) for line in result.stdout.splitlines()
             if line.startswith("argv: ")]
    assert len(argvs) == 2
    for argv, depth in zip(argvs, ("0", "8"), strict=True):
        assert argv[1:3] == ["-m", "simulator"]
        assert argv[argv.index("--pp-size") + 1] == "8"
        assert argv[argv.index("--pp-async-batch-depth") + 1] == depth
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert "--enable-metrics" in argv
        # decode log interval coprime with pp + depth, so log lines rotate through the slots
        interval = int(argv[argv.index("--decode-log-interval") + 1])
        assert interval >= 40 and all((8 + int(depth)) % k or interval % k for k in range(2, 17))
        # full flag names only (SGLang accepts unambiguous prefixes; we never rely on it): every SGLang
        # flag is spelt exactly as in the recorded 0.5.23 flag set, the rest are the simulator's own
        known = recorded_flag_set().options
        flags = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
        assert flags and all(f in known or f.startswith("--sim-") for f in flags), set(flags) - set(known)
    assert "world_size=8" in result.stdout
    assert not (workdir / "runs" / "mlflow.db").exists()


def test_dry_run_sglang_engine_argv(workdir: Path) -> None:
    result = run_cli(["dry_run=true", "engine=sglang", "ray.num_gpus=8", "parallelism=tp8",
                      "pp.micro_batch_size=4", "server.max_running_requests=64",
                      "server.schedule_policy=lpm", "server.radix_cache=false"], workdir)
    assert result.returncode == 0, result.stderr
    argv = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("argv: "))[6:])
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert "--pp-async-batch-depth" not in argv  # only meaningful with pp > 1
    assert argv[argv.index("--pp-max-micro-batch-size") + 1] == "4"
    assert argv[argv.index("--max-running-requests") + 1] == "64"
    assert argv[argv.index("--schedule-policy") + 1] == "lpm" and "--disable-radix-cache" in argv
    assert "--sim-hardware" not in argv


def test_dry_run_of_a_cache_aware_sglang_trial_shows_each_replica_and_the_router(workdir: Path) -> None:
    result = run_cli(["dry_run=true", "engine=sglang", "ray.num_gpus=8", "parallelism=tp4", "dp.size=2",
                      "dp.router=cache_aware"], workdir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    replicas = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("argv[replica ")]
    assert len(replicas) == 2 and not any(line.startswith("argv: ") for line in lines)
    ports = []
    for argv in replicas:
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        assert argv[argv.index("--dp-size") + 1] == "1" and argv[argv.index("--tp-size") + 1] == "4"
        ports.append(argv[argv.index("--port") + 1])
    (router,) = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("router argv: ")]
    assert router[1:3] == ["-m", "smg.launch_router"]
    assert router[router.index("--worker-urls") + 1:router.index("--worker-urls") + 3] == [
        f"http://127.0.0.1:{port}" for port in ports]
    assert "replica 0 → 0,1,2,3, replica 1 → 4,5,6,7" in result.stdout


def test_dry_run_of_the_long_context_experiment(workdir: Path) -> None:
    result = run_cli(["dry_run=true", "-m", "experiment=long-context"], workdir)
    assert result.returncode == 0, result.stderr
    argvs = [json.loads(line[len("argv: "):]) for line in result.stdout.splitlines()
             if line.startswith("argv: ")]
    assert [a[a.index("--mem-fraction-static") + 1] for a in argvs] == ["0.42", "0.6"]
    for argv in argvs:
        assert argv[argv.index("--tp-size") + 1] == "4"
        assert "llama-3.1-70b" in argv[argv.index("--model-path") + 1]


def test_the_long_context_suggestions_are_sglang_flags(workdir: Path) -> None:
    # what prefill_interference and kv_capacity suggest, as SGLang 0.5.23 would be launched with them
    result = run_cli(["dry_run=true", "engine=sglang", "ray.num_gpus=8", "model=llama-3.1-70b",
                      "hardware=h100-sxm-x8", "parallelism=tp4", "server.chunked_prefill_size=512",
                      "+server.extra_args.enable-mixed-chunk=true",
                      "+server.extra_args.kv-cache-dtype=fp8_e4m3"], workdir)
    assert result.returncode == 0, result.stderr
    argv = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("argv: "))[6:])
    assert argv[argv.index("--chunked-prefill-size") + 1] == "512"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    i = argv.index("--enable-mixed-chunk")
    assert i == len(argv) - 1 or argv[i + 1].startswith("--")  # a flag without a value


@pytest.mark.parametrize(("experiment", "algorithms"), [
    ("spec-decode", [None, ("EAGLE3", "1"), ("EAGLE3", "3"), ("EAGLE3", None)]),
    ("spec-decode-kimi-pcie", [None, ("EAGLE3", "1"), ("EAGLE3", None)]),
])
def test_dry_run_of_the_speculative_experiments_on_sglang(workdir: Path, experiment: str,
                                                          algorithms: list) -> None:
    # each trial's SGLang command: the draft head the model names, SGLang's own steps where unset
    result = run_cli(["dry_run=true", "engine=sglang", "ray.num_gpus=8", "-m", f"experiment={experiment}"],
                     workdir)
    assert result.returncode == 0, result.stderr
    argvs = [json.loads(line[len("argv: "):]) for line in result.stdout.splitlines()
             if line.startswith("argv: ")]
    seen = []
    for argv in argvs:
        if "--speculative-algorithm" not in argv:
            seen.append(None)
            continue
        assert "eagle3-" in argv[argv.index("--speculative-draft-model-path") + 1]
        steps = argv[argv.index("--speculative-num-steps") + 1] if "--speculative-num-steps" in argv else None
        seen.append((argv[argv.index("--speculative-algorithm") + 1], steps))
    assert seen == algorithms


def test_dry_run_of_the_disaggregation_experiment_on_sglang(workdir: Path) -> None:
    # aggregated serving and two deployments of the same eight GPUs: every server on its own slice
    result = run_cli(["dry_run=true", "engine=sglang", "ray.num_gpus=8", "-m", "experiment=pd-vs-agg-pcie"],
                     workdir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    heads = [line for line in lines if line.startswith("trial ")]
    assert len(heads) == 3 and all("world_size=8 GPUs=8" in h for h in heads)
    assert "tp=2 pp=1 ep=1 dp=4" in heads[0] and "disaggregated" not in heads[0]
    assert "prefill=1x(tp=4 pp=1 ep=1 dp=1) decode=1x(tp=4 pp=1 ep=1 dp=1)" in heads[1]
    assert "prefill=1x(tp=2 pp=1 ep=1 dp=1) decode=3x(tp=2 pp=1 ep=1 dp=1)" in heads[2]
    slices = [line for line in lines if line.startswith("server GPUs")]
    assert slices[-1].endswith("prefill server 0 → 0,1, decode server 0 → 2,3, decode server 1 → 4,5, "
                               "decode server 2 → 6,7")
    modes = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("argv[")]
    assert [a[a.index("--disaggregation-mode") + 1] for a in modes] == ["prefill", "decode", "prefill",
                                                                         "decode", "decode", "decode"]


def test_dry_run_vllm_engine_argv_and_a_vllm_trial_without_vllm_refused(workdir: Path) -> None:
    result = run_cli(["dry_run=true", "engine=vllm", "ray.num_gpus=8", "parallelism=tp8",
                      "server.max_running_requests=64", "server.radix_cache=false"], workdir)
    assert result.returncode == 0, result.stderr
    argv = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("argv: "))[6:])
    assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--max-num-seqs") + 1] == "64" and "--no-enable-prefix-caching" in argv
    assert "checked against the newest recorded" in result.stdout  # vLLM is not installed here
    # SGLang's own knob, and a real vLLM trial: one line each, nothing launched
    sglang_only = run_cli(["dry_run=true", "engine=vllm", "ray.num_gpus=8", "pp.async_depth=4"], workdir)
    assert sglang_only.returncode != 0
    assert sglang_only.stderr.strip().splitlines()[-1].endswith(
        "pp.async_depth=4: invalid (SGLang's PP async batch depth has no vLLM flag); "
        "valid: 0 with engine=vllm")
    # a real vLLM trial where engine.python has no vLLM: one line naming the key, nothing launched
    real = run_cli(["engine=vllm", "ray.num_gpus=8", "parallelism=tp8"], workdir)
    assert real.returncode != 0 and "vLLM is not installed there" in real.stderr
    assert len(real.stderr.strip().splitlines()) == 1
    assert not (workdir / "runs" / "mlflow.db").exists()


def test_the_sglang_vs_vllm_experiment_builds_each_engines_own_command(workdir: Path) -> None:
    # GPUs declared: the real engines' command lines; none: the simulated engine playing each
    real = run_cli(["dry_run=true", "ray.num_gpus=8", "-m", "experiment=sglang-vs-vllm"], workdir)
    assert real.returncode == 0, real.stderr
    argvs = [json.loads(line[len("argv: "):]) for line in real.stdout.splitlines()
             if line.startswith("argv: ")]
    modules = sorted(argv[2] for argv in argvs)
    assert modules == ["sglang.launch_server"] * 2 + ["vllm.entrypoints.cli.main"] * 2
    flag = {"sglang.launch_server": "--tp-size", "vllm.entrypoints.cli.main": "--tensor-parallel-size"}
    sizes = {(argv[2], argv[argv.index(flag[argv[2]]) + 1]) for argv in argvs}
    assert {size for _, size in sizes} == {"4", "8"} and len(sizes) == 4
    played = run_cli(["dry_run=true", "-m", "experiment=sglang-vs-vllm"], workdir)
    assert played.returncode == 0, played.stderr
    engines = sorted(line.split("engine=")[2].split()[0] for line in played.stdout.splitlines()
                     if line.startswith("trial "))
    assert engines == ["sim", "sim", "sim-vllm", "sim-vllm"]
