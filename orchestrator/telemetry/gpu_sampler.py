"""Sample a GPU source at a fixed rate on a background thread; rows are appended to disk as they come.

The sampler runs in the trial's process on its own thread, never on the load generator's event loop
(the load generator runs its points in worker processes of its own), so a slow NVML call cannot delay
a request. It is started before the first load point and stopped after the last; each row carries
``ts`` on the load generator's clock (:func:`workloads.clock.now`), the clock of the request records.

A source is anything with ``name`` (a :class:`vocab.telemetry.GpuSource`), ``read(energy) -> rows``
(one dict per GPU, the columns of ``GPU_COLUMNS`` except ``ts``, which the sampler stamps) and
``close()``. A failing read is counted and skipped; it never ends the trial.

The energy counter costs a real GPU's driver milliseconds of CPU a read (``nvml_source``), so it is
asked for only every ``energy_every_s`` (1 s) and whenever the trial marks an instant that bounds what
it will measure (:meth:`GpuSampler.mark`: a load point's start and end); every other sample carries
power and the cheap readings, its energy NaN. A point's energy is then the counter's own increase
between readings that enclose it, spread over time by the power samples in between
(``analysis.telemetry.counter_increase``).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from vocab.telemetry import GPU_COLUMNS, GpuSource
from workloads.clock import now

log = logging.getLogger("parasweep")

ENERGY_EVERY_S = 1.0  # the energy counter's reading rate between marks (it costs ms of CPU on a GPU)


class GpuReader(Protocol):
    name: GpuSource

    def read(self, energy: bool = True) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class GpuSampler:
    """``start()`` then ``stop()``; rows land in ``jsonl_path`` (one JSON object per GPU per sample)."""

    def __init__(self, source: GpuReader, jsonl_path: Path, hz: float = 10.0,
                 energy_every_s: float = ENERGY_EVERY_S) -> None:
        if not hz > 0:
            raise ValueError(f"sampling rate must be > 0 Hz, got {hz}")
        self.source, self.jsonl_path, self.period_s = source, jsonl_path, 1.0 / hz
        self.energy_every_s = energy_every_s
        self._energy_at = -math.inf  # when the energy counter was last read
        self._lock = threading.Lock()  # a mark (the trial's thread) and a tick (the sampler's) take turns
        self.samples = 0
        self.errors = 0
        self.first_error = ""
        self.hung = False  # stop() found the thread stuck in a read and left it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._file: Any = None

    def start(self) -> GpuSampler:
        self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.jsonl_path.open("a", buffering=1)  # line-buffered: a crash loses no row
        self.sample_once(energy=True)  # one sample before the first load point
        self._thread.start()
        return self

    def mark(self) -> int:
        """A sample now, with the energy counter: the trial calls it at a load point's start and end, so
        that every point's energy is bounded by readings of the counter itself."""
        return self.sample_once(energy=True)

    def sample_once(self, energy: bool | None = None) -> int:
        """One sample of every GPU; ``energy``: read the energy counter (None: when it is due)."""
        with self._lock:
            return self._sample(energy)

    def _sample(self, energy: bool | None) -> int:
        ts = now()
        if energy is None:
            energy = ts - self._energy_at >= self.energy_every_s
        try:
            rows = self.source.read(energy=energy)
        except Exception as exc:  # NVML errors, a simulated engine that went away: count, go on
            self.errors += 1
            if not self.first_error:
                self.first_error = f"{type(exc).__name__}: {exc}"
                log.warning("GPU telemetry (%s): a read failed: %s", self.source.name, self.first_error)
            return 0
        lines = []
        for row in rows:
            row = {"ts": ts, **row}
            lines.append(json.dumps({k: _plain(row.get(k)) for k in GPU_COLUMNS}) + "\n")
        self._file.writelines(lines)
        self.samples += 1
        if energy:
            self._energy_at = ts
        return len(rows)

    def _loop(self) -> None:
        # fixed-rate schedule: a slow read shortens the next wait instead of shifting every later tick.
        # On the wall clock: samples are stamped on the records' clock, which runs F times as fast for a
        # simulated engine played at F times real time, and the sampler's cost is per wall second.
        next_tick = time.monotonic() + self.period_s
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            self.sample_once()
            next_tick += self.period_s
            if next_tick < time.monotonic():  # fell behind by more than a period: skip ticks, do not burst
                next_tick = time.monotonic() + self.period_s

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, take a last sample (it closes the last point's window), close the source.

        The last sample, and closing the file and the source, happen only once the thread has ended:
        a thread still inside a read (a hung NVML call, a simulated engine that stopped answering)
        would otherwise write to the file, or read the source, at the same time. Such a thread is left
        to the process's end (it is a daemon), with its file and source open; the rows it wrote stay."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            self.hung = True
            log.warning("GPU telemetry (%s): the sampler did not stop within %g s (a read hangs); "
                        "it is left running, and the trial has no sample after its last point",
                        self.source.name, timeout_s)
            return
        try:
            if self._file is not None:
                self.sample_once(energy=True)
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None
            self.source.close()


def _plain(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null (read back as NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_gpu_samples(jsonl_path: Path) -> pd.DataFrame | None:
    """The sampled rows as one frame with the ``GPU_COLUMNS`` (None when nothing was sampled)."""
    if not jsonl_path.exists() or jsonl_path.stat().st_size == 0:
        return None
    import orjson

    rows, bad = [], 0
    with jsonl_path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError:  # a row cut short (the process was killed mid-write)
                bad += 1
    if bad:
        log.warning("GPU telemetry: %d line(s) of %s could not be read (cut short?); skipped",
                    bad, jsonl_path)
    if not rows:
        return None
    df = pd.DataFrame(rows, columns=list(GPU_COLUMNS))
    numeric = [c for c in GPU_COLUMNS if c not in ("uuid",)]
    df[numeric] = df[numeric].apply(pd.to_numeric, errors="coerce")
    return df
