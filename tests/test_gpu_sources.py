"""Which GPU source a live trial gets, and what happens where there is none: the trial goes on with
``none`` and the reason recorded. Also the ``telemetry.*`` keys' one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import validate
from orchestrator.errors import ConfigError
from orchestrator.telemetry.gpu_sources import start_gpu_telemetry
from tests.fake_nvml import FakeGpu, FakeNvml
from vocab.hardware import load_hardware
from vocab.telemetry import GpuSource


def no_gpu_here() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return True
    pynvml.nvmlShutdown()
    return False


@pytest.mark.skipif(not no_gpu_here(), reason="this node has NVML: the no-NVML path cannot be shown")
def test_sglang_without_nvml_records_none_and_why(tmp_path: Path) -> None:
    gpu = start_gpu_telemetry("sglang", "0,1", 2, "http://127.0.0.1:1", tmp_path / "gpu.jsonl", 10.0)
    assert gpu.source is GpuSource.NONE and gpu.sampler is None
    assert gpu.note.startswith("no NVML: ") and "\n" not in gpu.note
    gpu.stop()  # nothing to stop: harmless
    assert not (tmp_path / "gpu.jsonl").exists()


def test_sampling_off(tmp_path: Path) -> None:
    gpu = start_gpu_telemetry("sim", None, 1, "http://127.0.0.1:1", tmp_path / "gpu.jsonl", 0.0)
    assert gpu.source is GpuSource.NONE and "telemetry.gpu_hz=0" in gpu.note


def test_simulated_source_counts_failed_reads_and_goes_on(tmp_path: Path) -> None:
    # nothing listens on port 1: every read fails, the sampler counts it, the note says so
    gpu = start_gpu_telemetry("sim", None, 2, "http://127.0.0.1:1", tmp_path / "gpu.jsonl", 50.0)
    assert gpu.source is GpuSource.SIMULATED
    gpu.stop()
    assert "failed read(s)" in gpu.note and "first:" in gpu.note


def test_a_sampler_that_cannot_start_shuts_nvml_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu("GPU-00000000-1111-2222-3333-444444444440")])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())  # the reader imports NVML by this name
    blocker = tmp_path / "telemetry"
    blocker.write_text("")  # a file where the telemetry folder should be: the sampler cannot start
    with pytest.raises(OSError):
        start_gpu_telemetry("sglang", "0", 1, "http://127.0.0.1:1", blocker / "gpu.jsonl", 10.0)
    assert fake.calls["nvmlInit"] == 1 and fake.calls["nvmlShutdown"] == 1


def cfg() -> ParasweepConf:
    c = ParasweepConf()
    c.engine.name = "sim"
    c.model.name, c.model.path = "tiny-test", "models/tiny-test"
    c.hardware = load_hardware("h200-nvlink-x8")
    c.workload.concurrency = [1]
    return c


@pytest.mark.parametrize(("key", "value", "valid"), [
    ("gpu_hz", -1.0, "0 (off) to 50 samples per second"),
    ("gpu_hz", 500.0, "0 (off) to 50 samples per second"),
    ("metrics_period_s", 0.0, "seconds > 0"),
])
def test_telemetry_keys_one_line_errors(key: str, value: float, valid: str) -> None:
    c = cfg()
    setattr(c.telemetry, key, value)
    with pytest.raises(ConfigError) as err:
        validate(c)
    assert str(err.value) == f"telemetry.{key}={value}: invalid; valid: {valid}"
