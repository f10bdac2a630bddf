"""``engine.sim_faults.*`` and the workload timeouts: range checks and the refusal on a real engine (one
line naming key, value and what is valid), the ``--sim-fault-*`` flags the simulated engine gets (only
the set ones, each parsed back to the same value by the simulator's own parser), predictions that
ignore them, and an SGLang command line that never carries a ``--sim-`` flag."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf, SimFaultConf
from orchestrator.config.validate import validate
from orchestrator.engines.base import sglang_flags
from orchestrator.engines.sglang import SGLangEngine
from orchestrator.engines.sglang_compat import SGLangTarget, recorded_flag_set
from orchestrator.engines.sim import SimEngine, fault_flags
from orchestrator.errors import ConfigError
from simulator.cli import build_parser
from simulator.faults import FaultConf
from simulator.predict import load_config, predict_point
from tests.conftest import refusal, run_cli
from tests.fake_nvml import FakeGpu, FakeNvml
from vocab.hardware import load_hardware
from workloads import LoadPoint, RequestSpec

# every fault set to something other than its default
ALL_FAULTS = {"crash_after_requests": 3, "hang_before_ready": True, "startup_delay_s": 2.5,
              "hang_after_requests": 7, "stall_stream_fraction": 0.125, "http_error_fraction": 0.25,
              "malformed_sse_fraction": 0.0625, "cut_stream_fraction": 0.5, "oom_at_start": True}


def conf(engine: str = "sim", **faults: object) -> ParasweepConf:
    c = ParasweepConf()
    c.engine.name = engine
    c.model.name, c.model.path = "tiny-test", "models/tiny-test"
    c.hardware = load_hardware("h100-sxm-x8")
    c.tp.size = c.pp.size = c.ep.size = c.dp.size = 1
    c.workload.concurrency = [1]
    if engine == "sglang":  # GPUs declared: SGLang itself, not the simulated engine standing in
        c.ray.num_gpus = 8
    for name, value in faults.items():
        setattr(c.engine.sim_faults, name, value)
    return c


def test_every_config_field_has_its_simulator_flag() -> None:
    names = [f.name for f in dataclasses.fields(SimFaultConf)]
    assert names == [f.name for f in dataclasses.fields(FaultConf)]
    assert set(ALL_FAULTS) == {f.name for f in dataclasses.fields(SimFaultConf)}
    for f in dataclasses.fields(SimFaultConf):  # same defaults: "unset" means the same on both sides
        assert getattr(FaultConf(), f.name) == f.default


def test_valid_faults_pass_on_the_simulated_engine() -> None:
    assert validate(conf()) == "sim"
    assert validate(conf(**ALL_FAULTS)) == "sim"
    assert validate(conf(stall_stream_fraction=1.0, http_error_fraction=0.0, startup_delay_s=0.0)) == "sim"


@pytest.mark.parametrize("name", list(ALL_FAULTS))
def test_a_fault_on_sglang_is_refused_in_one_line(name: str) -> None:
    value = ALL_FAULTS[name]
    message = refusal(conf("sglang", **{name: value}))
    assert message.startswith(f"engine.sim_faults.{name}={value}: invalid")
    assert "only for engine=sim" in message and "engine=sglang in the config" in message


def test_a_fault_is_refused_where_auto_picks_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    # a node with 8 GPUs (NVML answered by the stand-in) and an SGLang interpreter: auto means sglang
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(f"GPU-{i}") for i in range(8)]).module())
    cfg = conf("auto", cut_stream_fraction=0.5)
    cfg.engine.python = sys.executable
    message = refusal(cfg)
    assert message.startswith("engine.sim_faults.cut_stream_fraction=0.5: invalid")
    assert "only for engine=sim" in message and "engine=auto: 8 GPU(s)" in message
    # the same machine without faults is not refused for them (it fails later, on the world size or
    # not at all: what matters is that the fault check does not fire)
    cfg.engine.sim_faults = SimFaultConf()
    with pytest.raises(ConfigError) as other:
        cfg.tp.size = 99
        validate(cfg)
    assert "sim_faults" not in str(other.value)


@pytest.mark.parametrize(("name", "value", "valid"), [
    ("stall_stream_fraction", -0.1, "a fraction in [0, 1]"),
    ("http_error_fraction", 1.5, "a fraction in [0, 1]"),
    ("malformed_sse_fraction", math.nan, "a fraction in [0, 1]"),
    ("cut_stream_fraction", 2.0, "a fraction in [0, 1]"),
    ("crash_after_requests", 0, "an integer >= 1 or null"),
    ("hang_after_requests", -3, "an integer >= 1 or null"),
    ("startup_delay_s", -1.0, "seconds >= 0"),
    ("startup_delay_s", math.inf, "seconds >= 0"),
])
def test_fault_ranges(name: str, value: float, valid: str) -> None:
    message = refusal(conf(**{name: value}))
    assert message.startswith(f"engine.sim_faults.{name}={value}: invalid")
    assert message.endswith(f"valid: {valid}")


@pytest.mark.parametrize(("name", "value", "valid"), [
    ("stall_timeout_s", 0.0, "seconds > 0"),
    ("stall_timeout_s", -5.0, "seconds > 0"),
    ("stall_timeout_s", math.inf, "seconds > 0"),
    ("point_timeout_s", 0.0, "seconds > 0, or null for no limit"),
    ("point_timeout_s", -1.0, "seconds > 0, or null for no limit"),
])
def test_workload_timeout_ranges(name: str, value: float, valid: str) -> None:
    cfg = conf()
    setattr(cfg.workload, name, value)
    message = refusal(cfg)
    assert message == f"workload.{name}={value}: invalid; valid: {valid}"


def test_workload_timeouts_accept_positive_values_and_no_point_limit() -> None:
    cfg = conf()
    cfg.workload.stall_timeout_s, cfg.workload.point_timeout_s = 0.5, None
    assert validate(cfg) == "sim"


def test_simulator_gets_only_the_faults_that_are_set(tmp_path: Path) -> None:
    assert fault_flags(SimFaultConf()) == []
    plain = SimEngine().simulator_flags(conf(), 30000, tmp_path)
    assert not [a for a in plain if a.startswith("--sim-fault-")]
    cfg = conf(cut_stream_fraction=0.5, hang_before_ready=True)
    flags = SimEngine().simulator_flags(cfg, 30000, tmp_path)
    assert [a for a in flags if a.startswith("--sim-fault-")] == [
        "--sim-fault-hang-before-ready", "--sim-fault-cut-stream-fraction"]
    assert flags[flags.index("--sim-fault-cut-stream-fraction") + 1] == "0.5"


def test_every_fault_reaches_the_simulator_parser_unchanged(tmp_path: Path) -> None:
    cfg = conf(**ALL_FAULTS)
    argv = SimEngine().simulator_flags(cfg, 30000, tmp_path)
    parsed = FaultConf.from_args(build_parser().parse_args(argv))
    assert dataclasses.asdict(parsed) == ALL_FAULTS
    assert SimEngine().preflight(cfg) is not None  # the preflight parses the same argv


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--sim-fault-stall-stream-fraction", "1.01", "must be a fraction in [0, 1]"),
    ("--sim-fault-http-error-fraction", "nan", "must be a fraction in [0, 1]"),
    ("--sim-fault-cut-stream-fraction", "half", "must be a fraction in [0, 1]"),
    ("--sim-fault-crash-after-requests", "0", "must be an integer >= 1"),
    ("--sim-fault-hang-after-requests", "2.5", "must be an integer >= 1"),
    ("--sim-fault-startup-delay-s", "-1", "must be a number of seconds >= 0"),
])
def test_simulator_parser_refuses_bad_fault_values(flag: str, value: str, says: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--model-path", "m", "--sim-hardware", "h", flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {says}, got '{value}'" in err


def test_predictions_ignore_faults(tmp_path: Path) -> None:
    """Virtual time models the engine, not the drills: the same argv with faults predicts the same."""
    plain = SimEngine().simulator_flags(conf(), 30000, tmp_path)
    faulty = SimEngine().simulator_flags(conf(**ALL_FAULTS), 30000, tmp_path)
    SimEngine().prepare(conf(), tmp_path)
    assert load_config(faulty).max_total_num_tokens == load_config(plain).max_total_num_tokens
    point = LoadPoint(concurrency=2, num_requests=4, warmup_requests=0)
    spec = RequestSpec(input_len=32, output_len=8)
    assert predict_point(faulty, point, spec).metrics == predict_point(plain, point, spec).metrics


def test_sglang_command_never_carries_a_sim_flag(tmp_path: Path) -> None:
    cfg = conf("sglang", **ALL_FAULTS)  # refused by validate; the command builder must not leak them anyway
    target = SGLangTarget("0.5.23", recorded_flag_set("0.5.23"), True, "python")
    for argv in (sglang_flags(cfg, 30000), sglang_flags(cfg, 30000, target),
                 SGLangEngine().argv(cfg, 30000, tmp_path)):
        assert not [a for a in argv if a.startswith("--sim")], argv
    # nor through server.extra_args: SGLang's flag set has no such flag, so the preflight refuses it
    cfg.server.extra_args = {"sim_fault_crash_after_requests": 3}
    with pytest.raises(ConfigError) as info:
        sglang_flags(cfg, 30000, target)
    assert "server.extra_args.sim_fault_crash_after_requests" in str(info.value)


@pytest.mark.slow  # the real entry point in a subprocess
def test_the_cli_refuses_a_fault_on_sglang_in_one_line(workdir: Path) -> None:
    result = run_cli(["engine=sglang", "ray.num_gpus=1", "model=tiny-test", "parallelism=tp1",
                      "workload=tiny", "engine.sim_faults.http_error_fraction=0.5", "dry_run=true"], workdir)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("parasweep: engine.sim_faults.http_error_fraction=0.5")
    assert "only for engine=sim" in lines[0]
    assert not (workdir / "runs" / "mlflow.db").exists()


@pytest.mark.slow  # the real entry point in a subprocess
def test_a_dry_run_shows_the_fault_flags(workdir: Path) -> None:
    result = run_cli(["engine=sim", "model=tiny-test", "parallelism=tp1", "workload=tiny",
                      "engine.sim_faults.crash_after_requests=5", "dry_run=true"], workdir)
    assert result.returncode == 0, result.stderr
    argv = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("argv: "))[6:])
    assert argv[argv.index("--sim-fault-crash-after-requests") + 1] == "5"
