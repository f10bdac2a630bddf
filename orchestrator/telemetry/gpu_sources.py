"""Pick the GPU source for a live trial and start sampling it.

- SGLang: the trial's physical GPUs through NVML (the GPUs Ray assigned, by ``CUDA_VISIBLE_DEVICES``);
- the simulated engine: its model of the GPUs it pretends to run on, over HTTP (never NVML: real GPUs
  on the node are not doing the simulated work);
- neither possible (no NVML on the node, or ``telemetry.gpu_hz=0``): no samples, and the reason is
  recorded. The trial goes on either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from orchestrator.telemetry.gpu_sampler import GpuReader, GpuSampler
from vocab.status import simulated
from vocab.telemetry import GpuSource

log = logging.getLogger("parasweep")


@dataclass
class GpuTelemetry:
    source: GpuSource
    note: str  # why there is no telemetry, or what is sampled
    sampler: GpuSampler | None = None

    def mark(self) -> None:
        """A sample with the energy counter now (a load point starts or ends)."""
        if self.sampler is not None:
            self.sampler.mark()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            if self.sampler.errors:
                self.note += f"; {self.sampler.errors} failed read(s), first: {self.sampler.first_error}"
            if self.sampler.hung:
                self.note += "; the sampler was stuck in a read at the end (no closing sample)"
            self.sampler = None


def open_reader(engine: str, visible: str | None, world_size: int, server_url: str,
                server_urls: list[str] | None = None) -> GpuReader:
    """The reader for ``engine``'s GPUs (the simulated engine's: of ``server_url``, or of every server
    of ``server_urls`` in order); raises ``NvmlUnavailable`` when NVML cannot be used."""
    if simulated(engine):
        from orchestrator.telemetry.sim_gpu_source import ServersGpuReader, SimulatedGpuReader

        return ServersGpuReader(server_urls) if server_urls else SimulatedGpuReader(server_url)
    from orchestrator.telemetry.nvml_source import NvmlReader

    return NvmlReader.open(visible, world_size)


def start_gpu_telemetry(engine: str, visible: str | None, world_size: int, server_url: str,
                        jsonl_path: Path, hz: float, server_urls: list[str] | None = None) -> GpuTelemetry:
    if hz <= 0:
        return GpuTelemetry(GpuSource.NONE, "GPU sampling off (telemetry.gpu_hz=0)")
    from orchestrator.telemetry.nvml_source import NvmlUnavailable

    try:
        reader = open_reader(engine, visible, world_size, server_url, server_urls)
    except NvmlUnavailable as exc:
        log.warning("no GPU telemetry for this trial: %s", exc)
        return GpuTelemetry(GpuSource.NONE, f"no NVML: {exc}")
    try:
        sampler = GpuSampler(reader, jsonl_path, hz).start()
    except BaseException:  # the file could not be opened, or the first write failed: release NVML
        reader.close()
        raise
    what = (f"{world_size} simulated GPU(s)" if simulated(engine)
            else f"{world_size} GPU(s), CUDA_VISIBLE_DEVICES={visible or '(unset)'}")
    return GpuTelemetry(reader.name, f"{what} at {hz:g} Hz", sampler)
