"""The generic GPU sampler (orchestrator/telemetry/gpu_sampler.py) with a simple source defined here."""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.telemetry.gpu_sampler import GpuSampler, read_gpu_samples
from vocab.telemetry import GPU_COLUMNS, GpuSource
from workloads.clock import now


class CountingSource:
    """Two GPUs; ``power_w`` is the read's number, so rows can be matched to reads. Reads listed in
    ``fail_on`` raise; ``nan_power`` makes every power NaN."""

    name = GpuSource.SIMULATED

    def __init__(self, fail_on: tuple[int, ...] = (), nan_power: bool = False) -> None:
        self.reads = 0
        self.energy_reads: list[int] = []  # the reads asked for the energy counter
        self.closed = False
        self.fail_on, self.nan_power = fail_on, nan_power

    def read(self, energy: bool = True) -> list[dict[str, Any]]:
        self.reads += 1
        if self.reads in self.fail_on:
            raise RuntimeError(f"read {self.reads} failed")
        if energy:
            self.energy_reads.append(self.reads)
        power = math.nan if self.nan_power else float(self.reads)
        return [{"gpu": g, "uuid": f"sim-{g}", "power_w": power,
                 "energy_j": 10.0 * self.reads if energy else math.nan} for g in range(2)]

    def close(self) -> None:
        self.closed = True


def test_start_and_stop_each_take_a_sample_on_the_workloads_clock(tmp_path: Path) -> None:
    source = CountingSource()
    path = tmp_path / "telemetry" / "gpu.jsonl"
    before = now()
    sampler = GpuSampler(source, path, hz=0.2).start()  # a 5 s period: no tick between start and stop
    assert source.reads == 1 and path.exists()  # the start sample is there before the first point
    sampler.stop()
    after = now()
    assert source.reads == 2 and sampler.samples == 2 and source.closed
    df = read_gpu_samples(path)
    assert df is not None and list(df.columns) == list(GPU_COLUMNS)
    assert df["power_w"].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert df["ts"].between(before, after).all()
    assert df.groupby("power_w")["ts"].nunique().eq(1).all()  # one stamp per sample, shared by its rows
    assert df["sm_clock_mhz"].isna().all()  # a column the source did not give is NaN


def test_rate_is_roughly_honoured(tmp_path: Path) -> None:
    source = CountingSource()
    sampler = GpuSampler(source, tmp_path / "gpu.jsonl", hz=50).start()
    time.sleep(0.5)
    sampler.stop()
    # 25 ticks at 50 Hz plus start and stop; loose bounds, this is not a timing test
    assert 3 <= sampler.samples <= 40
    df = read_gpu_samples(tmp_path / "gpu.jsonl")
    assert df is not None and len(df) == 2 * sampler.samples
    assert df["ts"].is_monotonic_increasing


def test_a_failing_read_is_counted_and_sampling_goes_on(tmp_path: Path) -> None:
    source = CountingSource(fail_on=(2, 3))
    sampler = GpuSampler(source, tmp_path / "gpu.jsonl", hz=50).start()
    deadline = time.monotonic() + 5
    while source.reads < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    assert sampler.errors == 2
    assert sampler.first_error == "RuntimeError: read 2 failed"
    assert sampler.samples == source.reads - 2
    df = read_gpu_samples(tmp_path / "gpu.jsonl")
    assert df is not None
    assert 2.0 not in set(df["power_w"]) and 4.0 in set(df["power_w"])


def test_nan_is_written_as_null_and_read_back_as_nan(tmp_path: Path) -> None:
    path = tmp_path / "gpu.jsonl"
    GpuSampler(CountingSource(nan_power=True), path, hz=0.2).start().stop()
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # strict JSON: no NaN token
    assert lines and all(row["power_w"] is None for row in lines)
    df = read_gpu_samples(path)
    assert df is not None
    assert df["power_w"].isna().all() and df["energy_j"].notna().all()


def test_nothing_sampled_reads_as_none(tmp_path: Path) -> None:
    assert read_gpu_samples(tmp_path / "missing.jsonl") is None


@pytest.mark.parametrize("hz", [0, -1.0, math.nan])
def test_a_rate_that_is_not_positive_is_rejected(tmp_path: Path, hz: float) -> None:
    with pytest.raises(ValueError, match="sampling rate must be > 0 Hz"):
        GpuSampler(CountingSource(), tmp_path / "gpu.jsonl", hz=hz)


def test_a_line_cut_short_is_skipped_and_the_rest_read(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gpu.jsonl"
    GpuSampler(CountingSource(), path, hz=0.2).start().stop()
    with path.open("a") as f:  # the process was killed while writing a row
        f.write('{"ts": 1.0, "gpu": 0, "uuid": "sim-0", "power_w": 3')
    with caplog.at_level("WARNING", logger="parasweep"):
        df = read_gpu_samples(path)
    assert df is not None and df["power_w"].tolist() == [1.0, 1.0, 2.0, 2.0]
    warnings = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("GPU telemetry: 1 line(s)")


def test_only_unreadable_lines_read_as_none(tmp_path: Path) -> None:
    path = tmp_path / "gpu.jsonl"
    path.write_text('{"ts": 1.0, "gpu"\n')
    assert read_gpu_samples(path) is None


class StuckSource(CountingSource):
    """The first read answers; every later one waits until ``release`` is set (a hung NVML call)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.reading = threading.Event()

    def read(self, energy: bool = True) -> list[dict[str, Any]]:
        if self.reads >= 1:
            self.reading.set()
            self.release.wait(timeout=30)
        return super().read(energy)


def test_stop_leaves_a_stuck_thread_alone_and_writes_nothing_beside_it(tmp_path: Path) -> None:
    source = StuckSource()
    path = tmp_path / "gpu.jsonl"
    sampler = GpuSampler(source, path, hz=50).start()
    assert source.reading.wait(timeout=5)  # the thread is inside its read now
    sampler.stop(timeout_s=0.2)
    assert sampler.hung and not source.closed
    assert source.reads == 1  # stop() took no sample of its own beside the stuck thread
    assert len(path.read_text().splitlines()) == 2  # the start sample only
    source.release.set()  # the read returns: the thread writes its row into the still-open file, and ends
    sampler.stop()  # once the thread has ended, a second stop finishes the job
    assert source.closed and source.reads == 3
    df = read_gpu_samples(path)
    assert df is not None and df["power_w"].tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


def test_the_energy_counter_is_read_at_start_marks_and_stop_and_seldom_between(tmp_path: Path) -> None:
    source = CountingSource()
    path = tmp_path / "gpu.jsonl"
    sampler = GpuSampler(source, path, hz=50, energy_every_s=0.5).start()
    time.sleep(0.8)
    sampler.mark()
    marked = source.reads
    time.sleep(0.3)
    sampler.stop()
    # the start, the mark and the stop read it; every other read asked for it only once it was due
    assert {1, marked, source.reads} <= set(source.energy_reads)
    df = read_gpu_samples(path)
    assert df is not None
    samples = df.drop_duplicates("ts")  # two GPUs a sample
    ts = samples["ts"].to_numpy()
    assert [i + 1 for i in range(len(samples)) if samples["energy_j"].notna().iloc[i]] == source.energy_reads
    for before, read in itertools.pairwise(source.energy_reads):
        if read not in (marked, source.reads):  # due: half a second after the previous reading
            assert ts[read - 1] - ts[before - 1] >= 0.5
    assert len(source.energy_reads) < source.reads / 4  # most samples are power and the cheap readings
