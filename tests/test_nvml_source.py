"""NvmlReader against the pynvml stand-in (tests/fake_nvml.py), and the real no-GPU path."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from orchestrator.gpus import local_gpu_count
from orchestrator.telemetry import gpu_check
from orchestrator.telemetry.gpu_sampler import GpuSampler, read_gpu_samples
from orchestrator.telemetry.nvml_source import DeviceMatch, NvmlReader, NvmlUnavailable, visible_devices
from tests.conftest import ROOT
from tests.fake_nvml import (
    ENERGY,
    NAMES,
    PCIE_RX,
    PCIE_TX,
    POWER,
    VERSION_CHECKED,
    FakeGpu,
    FakeNvml,
    nvml_error,
)
from vocab.telemetry import GPU_COLUMNS, GpuSource
from workloads.clock import now

UUIDS = [f"GPU-0000000{i}-1111-2222-3333-44444444444{i}" for i in range(4)]


def four() -> FakeNvml:
    return FakeNvml([FakeGpu(u, power_w=100.0 + 10 * i) for i, u in enumerate(UUIDS)])


def opened(fake: FakeNvml, visible: str | None = None, count: int = 1, **kw: tuple[str, ...]) -> NvmlReader:
    return NvmlReader.open(visible, count, nvml=fake.module(**kw))


def test_every_name_the_stand_in_offers_exists_in_pynvml() -> None:
    missing = [n for n in NAMES if not hasattr(pynvml, n)]
    assert not missing, f"the stand-in offers names the real pynvml lacks: {missing}"


def test_maps_cvd_uuids_in_order() -> None:
    reader = opened(four(), f"{UUIDS[2]},{UUIDS[0]},{UUIDS[3]}", count=2)
    rows = reader.read()
    assert [(r["gpu"], r["uuid"]) for r in rows] == [(0, UUIDS[2]), (1, UUIDS[0])]
    assert reader.uuids == [UUIDS[2], UUIDS[0]]
    assert rows[0]["power_w"] == pytest.approx(120.0)  # it really reads the GPU the UUID names


def test_maps_cvd_indices_as_nvml_indices() -> None:
    rows = opened(four(), "3, 1", count=2).read()
    assert [r["uuid"] for r in rows] == [UUIDS[3], UUIDS[1]]
    assert [r["power_w"] for r in rows] == pytest.approx([130.0, 110.0])


@pytest.mark.parametrize("visible", [None, "", " , "])
def test_unset_cvd_takes_the_first_gpus(visible: str | None) -> None:
    rows = opened(four(), visible, count=3).read()
    assert [r["uuid"] for r in rows] == UUIDS[:3]
    assert [r["gpu"] for r in rows] == [0, 1, 2]


def test_unknown_uuid_is_named_and_nvml_shut_down() -> None:
    fake = four()
    bad = "GPU-deadbeef-0000-0000-0000-000000000000"
    with pytest.raises(NvmlUnavailable, match=f"entry '{bad}' matches no GPU"):
        opened(fake, f"{UUIDS[0]},{bad}", count=2)
    assert fake.calls["nvmlShutdown"] == 1


def test_a_unique_uuid_prefix_names_its_gpu_as_cuda_accepts() -> None:
    reader = opened(four(), "GPU-00000002,GPU-00000000-1111", count=2)
    assert reader.uuids == [UUIDS[2], UUIDS[0]]
    assert reader.read()[0]["power_w"] == pytest.approx(120.0)


def test_only_the_first_count_entries_must_match() -> None:
    # the engine uses GPUs 0..count-1; an entry past them is not the reader's concern
    assert opened(four(), f"{UUIDS[1]},nvidia9", count=1).uuids == [UUIDS[1]]


def test_visible_devices_maps_each_entry_in_order() -> None:
    fake = four()
    nvml = fake.module()
    got = visible_devices(nvml, f" 3, GPU-00000001,{UUIDS[0]}, ,9,GPU-0000000,x,MIG-abc ")
    assert [(m.label, m.handle.uuid if m.handle else None) for m in got] == [
        ("GPU 3", UUIDS[3]), ("GPU 1 (GPU-00000001)", UUIDS[1]), (f"GPU 0 ({UUIDS[0]})", UUIDS[0]),
        ("9", None), ("GPU-0000000", None), ("x", None), ("MIG-abc", None)]
    assert [m.reason for m in got[:3]] == ["", "", ""]
    reasons = [m.reason for m in got[3:]]
    assert reasons[0] == ("CUDA_VISIBLE_DEVICES entry '9' is past NVML's 4 GPU(s) "
                          "(valid: 0..3, or a GPU-/MIG- UUID)")
    assert reasons[1].startswith("CUDA_VISIBLE_DEVICES entry 'GPU-0000000' is a prefix of 4 GPUs' UUIDs")
    assert reasons[2] == "CUDA_VISIBLE_DEVICES entry 'x' is neither a GPU index nor a GPU-/MIG- UUID"
    assert reasons[3].startswith("CUDA_VISIBLE_DEVICES entry 'MIG-abc' matches no GPU NVML knows (")
    assert all("\n" not in r for r in reasons)


def test_visible_devices_without_a_mask_lists_every_gpu_and_blanks_list_none() -> None:
    fake = four()
    nvml = fake.module()
    assert visible_devices(nvml, None) == [DeviceMatch(f"GPU {i}", g) for i, g in enumerate(fake.gpus)]
    assert visible_devices(nvml, " , ") == []


def test_visible_devices_finds_a_mig_instance_by_its_exact_uuid() -> None:
    # MIG instances are not among the indexed devices; NVML finds them by UUID only
    fake = four()
    mig = FakeGpu("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    nvml = fake.module()
    indexed = fake.gpus
    fake.gpus = [*indexed, mig]  # nvmlDeviceGetHandleByUUID searches every device ...
    nvml.nvmlDeviceGetCount = lambda: len(indexed)  # ... the index covers only the physical GPUs
    (match,) = visible_devices(nvml, mig.uuid)
    assert match.handle is mig and match.label == mig.uuid
    (prefix,) = visible_devices(nvml, "MIG-aaaa")
    assert prefix.handle is None and "matches no GPU" in prefix.reason


@pytest.mark.parametrize(("visible", "count", "message"), [
    ("7", 1, r"entry '7' is past NVML's 4 GPU\(s\) \(valid: 0..3"),
    ("0,1", 3, r"lists 2 GPU\(s\) but the engine uses 3"),
    (None, 5, r"NVML sees 4 GPU\(s\) but the engine uses 5"),
    ("GPU-0000000", 1, r"entry 'GPU-0000000' is a prefix of 4 GPUs' UUIDs \(GPU 0, GPU 1, GPU 2, GPU 3\)"),
    ("1,GPU-0000000", 2, r"entry 'GPU-0000000' is a prefix of 4"),  # a bad entry among good ones
    ("nvidia0", 1, r"entry 'nvidia0' is neither a GPU index nor a GPU-/MIG- UUID"),
])
def test_bad_cvd_entries(visible: str | None, count: int, message: str) -> None:
    with pytest.raises(NvmlUnavailable, match=message):
        opened(four(), visible, count=count)


@pytest.mark.parametrize(("code", "reason"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found (no NVIDIA driver on this node)"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded on this node"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to use NVML on this node"),
    (pynvml.NVML_ERROR_UNKNOWN, "NVML could not start: Unknown Error"),
])
def test_init_failures_give_the_reason(code: int, reason: str) -> None:
    with pytest.raises(NvmlUnavailable) as info:
        opened(FakeNvml([FakeGpu(UUIDS[0])], init_error=nvml_error(code)))
    assert str(info.value) == reason


def test_no_gpu_at_all() -> None:
    fake = FakeNvml([])
    with pytest.raises(NvmlUnavailable, match="NVML sees no GPU on this node"):
        opened(fake)
    assert fake.calls["nvmlShutdown"] == 1


def test_real_pynvml_without_a_gpu_is_unavailable_in_one_line() -> None:
    if local_gpu_count() > 0:
        pytest.skip("this machine has a GPU: the no-GPU path cannot be exercised here")
    with pytest.raises(NvmlUnavailable) as info:
        NvmlReader.open(None, 1)
    message = str(info.value)
    assert message and "\n" not in message
    assert "NVML" in message or "nvidia" in message.lower()


def test_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="count must be"):
        opened(four(), None, count=0)


def test_row_has_every_gpu_column_in_units() -> None:
    gpu = FakeGpu(UUIDS[0], power_w=312.5, power_limit_w=700, energy_mj=123_456, util_gpu=87, util_mem=41,
                  sm_clock_mhz=1755, mem_used=3 << 30, mem_total=80 << 30, temp_c=61)
    reader = opened(FakeNvml([gpu]))
    assert reader.name is GpuSource.NVML
    (row,) = reader.read()
    assert set(row) == set(GPU_COLUMNS) - {"ts"}
    assert row == {**row, "gpu": 0, "uuid": UUIDS[0], "power_w": 312.5, "power_limit_w": 700.0,
                   "util_gpu_pct": 87.0, "util_mem_pct": 41.0, "sm_clock_mhz": 1755.0,
                   "mem_used_bytes": float(3 << 30), "mem_total_bytes": float(80 << 30), "temp_c": 61.0,
                   "throttle_reasons": 0, "energy_j": pytest.approx(123.456)}
    assert math.isnan(row["pcie_tx_bytes_s"]) and math.isnan(row["pcie_rx_bytes_s"])  # no previous read


def test_energy_comes_from_the_counter_not_integrated_power() -> None:
    # 400 W for 1 s would integrate to 400 J; the counter says 7 J went by: the counter wins
    fake = FakeNvml([FakeGpu(UUIDS[0], power_w=400.0, energy_step_mj=7_000)])
    reader = opened(fake)
    fake.now_us = 1_000_000
    first = reader.read()[0]
    fake.now_us = 2_000_000
    second = reader.read()[0]
    assert second["energy_j"] - first["energy_j"] == pytest.approx(7.0)
    assert second["power_w"] == 400.0


def test_pcie_rates_from_counter_differences() -> None:
    gpu = FakeGpu(UUIDS[0], pcie_tx_step=3_000_000, pcie_rx_step=500_000)
    fake = FakeNvml([gpu])
    reader = opened(fake)
    fake.now_us = 10_000_000
    assert math.isnan(reader.read()[0]["pcie_tx_bytes_s"])
    fake.now_us += 250_000  # 0.25 s later by the driver's timestamps
    row = reader.read()[0]
    assert row["pcie_tx_bytes_s"] == pytest.approx(12_000_000)
    assert row["pcie_rx_bytes_s"] == pytest.approx(2_000_000)
    gpu.pcie_tx_bytes = 0  # a counter reset: no negative rate
    fake.now_us += 250_000
    assert math.isnan(reader.read()[0]["pcie_tx_bytes_s"])


def test_pcie_rate_uses_the_host_clock_without_driver_timestamps() -> None:
    fake = FakeNvml([FakeGpu(UUIDS[0], pcie_tx_step=1_000_000)])  # now_us stays 0: no timestamp
    reader = opened(fake)
    reader.read()
    rate = reader.read()[0]["pcie_tx_bytes_s"]
    assert rate > 1_000_000  # 1 MB over far less than a second of host time


def test_a_32_bit_pcie_counter_that_wraps_still_counts_its_bytes() -> None:
    gpu = FakeGpu(UUIDS[0], pcie_tx_bytes=2**32 - 4_000_000, pcie_tx_step=3_000_000,
                  pcie_value_type=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
    fake = FakeNvml([gpu])
    reader = opened(fake)
    fake.now_us = 10_000_000
    reader.read()  # 2**32 - 1,000,000
    fake.now_us += 250_000  # then 3,000,000 more: past the top, so the counter reads 2,000,000
    assert reader.read()[0]["pcie_tx_bytes_s"] == pytest.approx(12_000_000)  # not NaN, not negative


def test_a_pcie_rate_never_mixes_the_drivers_clock_with_the_hosts() -> None:
    fake = FakeNvml([FakeGpu(UUIDS[0], pcie_tx_step=1_000_000)])
    reader = opened(fake)
    reader.read()  # no driver timestamp: the host's monotonic clock ...
    fake.now_us = 1_700_000_000_000_000  # ... then the driver's (epoch µs), another origin altogether
    assert math.isnan(reader.read()[0]["pcie_tx_bytes_s"])
    fake.now_us += 500_000
    assert reader.read()[0]["pcie_tx_bytes_s"] == pytest.approx(2_000_000)  # two driver readings


def test_throttle_bits_that_are_not_throttling_are_cleared() -> None:
    gpu = FakeGpu(UUIDS[0], reasons=0x1 | 0x2 | 0x100)  # idle, app clocks, display clocks
    reader = opened(FakeNvml([gpu]))
    assert reader.read()[0]["throttle_reasons"] == 0
    gpu.reasons = 0x1 | 0x4 | 0x8  # idle + SW power cap + HW slowdown
    assert reader.read()[0]["throttle_reasons"] == 0x4 | 0x8


def test_deprecated_throttle_name_when_the_new_one_is_absent() -> None:
    fake = FakeNvml([FakeGpu(UUIDS[0], reasons=0x4)])
    reader = opened(fake, omit=("nvmlDeviceGetCurrentClocksEventReasons",))
    assert reader.read()[0]["throttle_reasons"] == 0x4
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1


def test_unsupported_metrics_are_nan_and_not_retried() -> None:
    unsupported: set[str | int] = {
        POWER, ENERGY, PCIE_TX, "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetEnforcedPowerLimit"}
    gpu = FakeGpu(UUIDS[0], unsupported=unsupported, pcie_rx_step=1000)
    fake = FakeNvml([gpu])
    reader = opened(fake)
    for i in range(10):
        fake.now_us = (i + 1) * 100_000
        row = reader.read()[0]
    for col in ("power_w", "power_limit_w", "energy_j", "util_gpu_pct", "util_mem_pct", "temp_c",
                "pcie_tx_bytes_s"):
        assert math.isnan(row[col]), col
    assert row["pcie_rx_bytes_s"] == pytest.approx(10_000)  # the supported counter still works
    assert row["sm_clock_mhz"] == 1980.0
    # each unsupported call was tried once; the unsupported fields were asked for once
    for name in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
                 "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"):
        assert fake.calls[name] == 1, name
    assert fake.field_requests[0] == [POWER, ENERGY, PCIE_TX, PCIE_RX]
    assert fake.field_requests[1:] == [[PCIE_RX]] * 9
    assert fake.calls["nvmlDeviceGetClockInfo"] == 10


def test_power_falls_back_to_power_usage_when_the_field_is_unsupported() -> None:
    gpu = FakeGpu(UUIDS[0], power_w=250.0, unsupported={POWER})
    fake = FakeNvml([gpu])
    reader = opened(fake)
    assert reader.read()[0]["power_w"] == 250.0
    gpu.power_w = 260.0
    assert reader.read()[0]["power_w"] == 260.0
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 2
    assert fake.field_requests[-1] == [ENERGY, PCIE_TX, PCIE_RX]


def test_other_nvml_errors_fail_the_read_and_are_retried() -> None:
    # a GPU that fell off the bus is not "unsupported": the sampler counts the failed read, tries again
    gpu = FakeGpu(UUIDS[0], mem_used=5 << 30)
    fake = FakeNvml([gpu])
    reader = opened(fake)
    gpu.failing["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_GPU_IS_LOST  # the call the reader makes
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        reader.read()
    del gpu.failing["nvmlDeviceGetMemoryInfo_v2"]
    assert reader.read()[0]["mem_used_bytes"] == float(5 << 30)


def test_close_shuts_nvml_down_once() -> None:
    fake = four()
    reader = opened(fake)
    reader.close()
    reader.close()
    assert fake.calls["nvmlShutdown"] == 1


def test_sampler_with_nvml_reader_writes_readable_samples(tmp_path: Path) -> None:
    gpus = [FakeGpu(UUIDS[0], energy_step_mj=1000), FakeGpu(UUIDS[1], energy_step_mj=2000,
                                                            unsupported={POWER, "nvmlDeviceGetPowerUsage"})]
    reader = opened(FakeNvml(gpus), ",".join(UUIDS[:2]), count=2)
    sampler = GpuSampler(reader, tmp_path / "gpu.jsonl", hz=50).start()
    time.sleep(0.3)
    sampler.stop()
    df = read_gpu_samples(tmp_path / "gpu.jsonl")
    assert df is not None and list(df.columns) == list(GPU_COLUMNS)
    assert sampler.errors == 0 and sampler.samples >= 3
    assert len(df) == 2 * sampler.samples
    for gpu, part in df.groupby("gpu"):
        assert part["ts"].is_monotonic_increasing and part["ts"].is_unique
        assert part["energy_j"].diff().dropna().gt(0).all()
        assert part["uuid"].eq(UUIDS[int(gpu)]).all()
    assert df.loc[df.gpu == 1, "power_w"].isna().all()  # unsupported: null in the file, NaN back
    assert df.loc[df.gpu == 0, "power_w"].eq(100.0).all()


# -- the GPU check (python -m orchestrator.telemetry.gpu_check) --------------------------------------

@pytest.mark.slow  # starts a process
def test_gpu_check_without_a_gpu_says_why_in_one_line_and_exits_2(tmp_path: Path) -> None:
    if local_gpu_count() > 0:
        pytest.skip("this machine has a GPU: the check would run for real")
    out = subprocess.run([sys.executable, "-m", "orchestrator.telemetry.gpu_check", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2, out
    assert len(lines) == 1 and lines[0].startswith("gpu_check: "), lines
    assert not (tmp_path / "gpu.parquet").exists()


@pytest.mark.slow  # starts a process
def test_gpu_check_script_passes_the_exit_code_through(tmp_path: Path) -> None:
    if local_gpu_count() > 0:
        pytest.skip("this machine has a GPU: the check would run for real")
    # the interpreter running the tests (the script would otherwise take the checkout's .venv, or python3)
    out = subprocess.run([str(ROOT / "scripts" / "gpu_telemetry_check.sh"), "--out", str(tmp_path / "out")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "PARASWEEP_PYTHON": sys.executable})
    assert out.returncode == 2, out
    assert out.stdout.strip().splitlines() == [out.stdout.strip()] and "gpu_check: " in out.stdout


def test_gpu_check_phases_follow_a_load_seen_through_the_sampler(tmp_path: Path) -> None:
    # the check's arithmetic on rows that went through NvmlReader and GpuSampler: idle, load, idle
    gpu = FakeGpu(UUIDS[0], power_w=80.0, energy_step_mj=8_000)
    sampler = GpuSampler(opened(FakeNvml([gpu])), tmp_path / "gpu.jsonl", hz=50).start()
    marks = []
    for power, util, step in ((80.0, 0, 8_000), (600.0, 100, 60_000), (90.0, 0, 9_000)):
        gpu.power_w, gpu.util_gpu, gpu.energy_step_mj = power, util, step
        marks.append(now())
        sampler.mark()  # the energy counter at each phase's start, as the check and a trial read it
        time.sleep(0.6)
    marks.append(now())
    sampler.stop()
    # between the marks (1 s apart at most) the samples carry power alone
    df = read_gpu_samples(tmp_path / "gpu.jsonl")
    assert df is not None and df["energy_j"].isna().sum() > len(df) // 2
    df = read_gpu_samples(tmp_path / "gpu.jsonl")
    assert df is not None
    idle, load, after = (gpu_check.phase_stats(df, n, marks[i], marks[i + 1])
                         for i, n in enumerate(("idle", "load", "idle")))
    assert (idle.power_w, load.power_w, after.power_w) == pytest.approx((80.0, 600.0, 90.0), rel=0.01)
    assert (idle.util_pct, load.util_pct) == pytest.approx((0.0, 100.0), abs=1)
    # the counter's steps, not power x time (600 W x 0.6 s would be 360 J); a sample on the phase's
    # edge may have read the next phase's step, hence the tolerance
    assert load.energy_j == pytest.approx(60.0 * (load.samples - 1), rel=0.05)
    assert gpu_check.failures(idle, load) == []
    flat = gpu_check.failures(idle, idle)
    assert len(flat) == 2 and "power did not rise" in flat[0] and "utilisation did not rise" in flat[1]
    stuck = gpu_check.Phase("load", 2.0, 20, 600.0, 100.0, 0.0)
    assert gpu_check.failures(idle, stuck) == ["the energy counter did not grow under load (0.0 J)"]


# -- the GPU check before a launch (orchestrator/gpu_release.py) against the strict stand-in -----------

def test_a_driver_without_the_versioned_process_call_only_warns() -> None:
    # real pynvml wraps nvmlDeviceGetComputeRunningProcesses in throwOnVersionMismatch: on a driver
    # without its _v3 symbol it raises NVMLLibraryMismatchError, which is not an NVMLError
    from orchestrator.errors import EngineStartError
    from orchestrator.gpu_release import ensure_gpus_free

    assert "nvmlDeviceGetComputeRunningProcesses" in VERSION_CHECKED
    gpus = [FakeGpu(UUIDS[0], pids=[4242]), FakeGpu(UUIDS[1])]
    fake = FakeNvml(gpus)
    with pytest.raises(EngineStartError, match="pids 4242"):  # the call works: a busy GPU is refused
        ensure_gpus_free("0,1", 0.0, nvml=fake.module())
    gpus[0].failing["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    with pytest.raises(pynvml.NVMLLibraryMismatchError):  # what the stand-in raises, as the module does
        fake.module().nvmlDeviceGetComputeRunningProcesses(gpus[0])
    warnings = ensure_gpus_free("0,1", 0.0, nvml=fake.module())
    assert len(warnings) == 1 and "pyNVML version does not match" in warnings[0], warnings
    assert fake.calls["nvmlShutdown"] == 2  # shut down on both paths


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_NO_PERMISSION])
@pytest.mark.parametrize("visible", [None, "0,1", f"{UUIDS[0]},{UUIDS[1]}", "GPU-00000000,GPU-00000001"])
def test_a_gpu_the_trial_does_not_use_cannot_turn_its_telemetry_off(code: int, visible: str | None) -> None:
    # four GPUs, the last one lost (or forbidden to this process): a trial on GPUs 0 and 1 still reads
    gpus = [FakeGpu(u) for u in UUIDS]
    for call in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetUUID"):
        gpus[3].failing[call] = code
    fake = FakeNvml(gpus)
    reader = NvmlReader.open(visible, 2, nvml=fake.module())
    assert reader.uuids == UUIDS[:2]
    assert len(reader.read()) == 2
    reader.close()
    # the trial's own GPU lost: said in one line
    with pytest.raises(NvmlUnavailable, match="GPU 3"):
        NvmlReader.open("3", 1, nvml=fake.module())


def test_memory_in_use_leaves_out_what_the_driver_reserves() -> None:
    gpu = FakeGpu(UUIDS[0], mem_used=10 << 30, mem_reserved=1 << 30)
    assert opened(FakeNvml([gpu])).read()[0]["mem_used_bytes"] == 10 << 30  # v2: reserved apart
    # a driver without nvmlDeviceGetMemoryInfo_v2: v1, which counts the reserved memory as used
    gpu.failing["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert opened(FakeNvml([gpu])).read()[0]["mem_used_bytes"] == 11 << 30


def test_the_gpu_count_survives_an_nvml_shutdown_error() -> None:
    from orchestrator.gpus import local_gpu_count

    fake = four()
    fake.shutdown_error = nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
    assert local_gpu_count(fake.module()) == 4  # validation asks this: nothing escapes it


def test_a_mig_instance_is_read_by_its_uuid() -> None:
    mig = FakeGpu("MIG-5a2b1c3d-0000-1111-2222-333333333333", power_w=55.0)
    fake = FakeNvml([FakeGpu(u) for u in UUIDS[:2]], mig=[mig])
    reader = NvmlReader.open(mig.uuid, 1, nvml=fake.module())  # CUDA_VISIBLE_DEVICES=MIG-...
    assert reader.uuids == [mig.uuid] and reader.read()[0]["power_w"] == pytest.approx(55.0)
    reader.close()
