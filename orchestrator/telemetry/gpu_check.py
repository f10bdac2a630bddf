"""Check NVML GPU telemetry on a real GPU: does what the sampler records move with a known load?

    python -m orchestrator.telemetry.gpu_check [--seconds 8] [--hz 10] [--out DIR]
    scripts/gpu_telemetry_check.sh [same options]

Opens :class:`~orchestrator.telemetry.nvml_source.NvmlReader` for GPU 0 of this process (the first
entry of ``CUDA_VISIBLE_DEVICES`` when set) and samples it with the trial's own
:class:`~orchestrator.telemetry.gpu_sampler.GpuSampler` into ``DIR/gpu.jsonl``: a quarter of the
time idle, half under a PyTorch bf16 matmul load on that GPU, a quarter idle again. It then writes
``DIR/gpu.parquet`` and prints, per phase, mean power, mean utilisation and the energy the GPU's
counter says went by (with the mean power that energy implies, a cross-check of the two).

Exit 0 only if, from the idle phase before the load to the load, power rose by more than 10 %,
utilisation by at least 20 points, and the energy counter grew; 1 otherwise; 2 with one line where
NVML or PyTorch with CUDA is missing (every machine without a GPU).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.telemetry import counter_increase
from orchestrator.telemetry.gpu_sampler import GpuSampler, read_gpu_samples
from orchestrator.telemetry.nvml_source import NvmlReader, NvmlUnavailable
from workloads.clock import now

MATMUL_N = 8192  # bf16 8192^3: about 1.1 TFLOP a product, a few ms on a datacenter GPU
POWER_RISE = 1.10
UTIL_RISE_PCT = 20.0


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    samples: int
    power_w: float
    util_pct: float
    energy_j: float  # the counter's increase from the phase's first sample to its last

    @property
    def counter_w(self) -> float:
        """The mean power the energy counter implies over the phase."""
        return self.energy_j / self.seconds if self.seconds > 0 else math.nan


def phase_stats(df: pd.DataFrame, name: str, start: float, end: float) -> Phase:
    """One phase of GPU 0's samples (``ts`` in [start, end]). Means skip the phase's first and last
    half second (power and utilisation lag a change of load by up to a sample period of the driver);
    energy spans every sample in the phase."""
    gpu0 = df[df["gpu"] == 0].sort_values("ts")
    part = gpu0[gpu0["ts"].between(start, end)]
    trim = min(0.5, (end - start) / 4)
    core = part[part["ts"].between(start + trim, end - trim)]
    if len(part) < 2:
        return Phase(name, 0.0, len(part), math.nan, math.nan, math.nan)
    first, last = float(part["ts"].iloc[0]), float(part["ts"].iloc[-1])
    # the counter is read at the phases' bounds (the sampler's marks) and once a second in between: the
    # readings around the phase's first and last sample, wherever they are
    read, powered = gpu0[gpu0["energy_j"].notna()], gpu0[gpu0["power_w"].notna()]
    energy = counter_increase(read["ts"].to_numpy(float), read["energy_j"].to_numpy(float), first, last,
                              powered["ts"].to_numpy(float), powered["power_w"].to_numpy(float))
    return Phase(name, last - first, len(part), float(core["power_w"].mean()),
                 float(core["util_gpu_pct"].mean()), energy if energy is not None else math.nan)


def failures(idle: Phase, load: Phase) -> list[str]:
    """What did not move as a load must move it (empty: telemetry follows the load)."""
    out = []
    if not load.power_w > idle.power_w * POWER_RISE:
        out.append(f"power did not rise by {POWER_RISE - 1:.0%} under load "
                   f"(idle {idle.power_w:.1f} W, load {load.power_w:.1f} W)")
    if not load.util_pct >= idle.util_pct + UTIL_RISE_PCT:
        out.append(f"utilisation did not rise by {UTIL_RISE_PCT:.0f} points under load "
                   f"(idle {idle.util_pct:.0f} %, load {load.util_pct:.0f} %)")
    if not load.energy_j > 0:
        out.append(f"the energy counter did not grow under load ({load.energy_j:.1f} J)")
    return out


def _table(phases: list[Phase]) -> str:
    lines = [f"{'phase':<8}{'seconds':>8}{'samples':>8}{'power W':>9}{'util %':>8}{'energy J':>10}"
             f"{'counter W':>11}"]
    lines += [f"{p.name:<8}{p.seconds:>8.1f}{p.samples:>8}{p.power_w:>9.1f}{p.util_pct:>8.0f}"
              f"{p.energy_j:>10.1f}{p.counter_w:>11.1f}" for p in phases]
    return "\n".join(lines)


def _torch_cuda() -> Any:
    """The torch module, where it is installed and sees a CUDA device (else RuntimeError, one line)."""
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError("PyTorch is not installed (pip install torch)") from exc
    if not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA device")
    return torch


def _matmul_load(torch: Any, a: Any, b: Any, seconds: float) -> float:
    """Back-to-back bf16 matmuls for ``seconds``; returns the achieved TFLOP/s."""
    out = torch.empty_like(a)  # written in place: the load is the product, not allocations
    products = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(10):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize()
        products += 10
    return products * 2 * MATMUL_N**3 / (time.monotonic() - t0) / 1e12


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.telemetry.gpu_check",
                                description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=8.0, help="whole check, >= 4 (default 8)")
    p.add_argument("--hz", type=float, default=10.0, help="sampling rate, > 0 (default 10)")
    p.add_argument("--out", type=Path, default=Path("runs/gpu-check"), help="output directory")
    a = p.parse_args(argv)
    if not a.seconds >= 4:
        print(f"gpu_check: --seconds must be >= 4 (got {a.seconds:g})")
        return 2
    if not a.hz > 0:
        print(f"gpu_check: --hz must be > 0 (got {a.hz:g})")
        return 2
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        reader = NvmlReader.open(visible, 1)
    except NvmlUnavailable as exc:
        print(f"gpu_check: NVML unavailable: {exc}")
        return 2
    try:
        torch = _torch_cuda()
    except RuntimeError as exc:
        reader.close()
        print(f"gpu_check: {exc}")
        return 2
    # CUDA context and operands before the first sample: their set-up is not part of any phase
    a_mat = torch.randn(MATMUL_N, MATMUL_N, device="cuda:0", dtype=torch.bfloat16)
    b_mat = torch.randn(MATMUL_N, MATMUL_N, device="cuda:0", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch_uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
    if torch_uuid and torch_uuid not in reader.uuids[0]:
        print(f"gpu_check: warning: PyTorch's cuda:0 is {torch_uuid}, NVML reads {reader.uuids[0]} "
              "(CUDA_DEVICE_ORDER=PCI_BUS_ID not set?)")
    print(f"gpu_check: NVML GPU 0 = {reader.uuids[0]} (CUDA_VISIBLE_DEVICES={visible!r}); "
          f"{a.seconds:g} s at {a.hz:g} Hz")

    a.out.mkdir(parents=True, exist_ok=True)
    jsonl = a.out / "gpu.jsonl"
    jsonl.unlink(missing_ok=True)  # the sampler appends: start from an empty file
    idle_s = a.seconds / 4
    sampler = GpuSampler(reader, jsonl, hz=a.hz).start()
    try:
        marks = [now()]
        time.sleep(idle_s)
        marks.append(now())
        sampler.mark()  # the energy counter at each phase's bounds, as a trial reads it at a point's
        tflops = _matmul_load(torch, a_mat, b_mat, a.seconds - 2 * idle_s)
        marks.append(now())
        sampler.mark()
        time.sleep(idle_s)
        marks.append(now())
    finally:
        sampler.stop()
    df = read_gpu_samples(jsonl)
    if df is None:
        print(f"gpu_check: FAIL: no sample was written "
              f"({sampler.errors} failed reads; first: {sampler.first_error})")
        return 1
    parquet = a.out / "gpu.parquet"
    df.to_parquet(parquet, index=False)
    phases = [phase_stats(df, name, marks[i], marks[i + 1])
              for i, name in enumerate(("idle", "load", "idle"))]
    print(_table(phases))
    missing = [c for c in df.columns if c != "uuid" and df[c].isna().all()]
    print(f"load: {tflops:.0f} TFLOP/s bf16; samples {sampler.samples}, failed reads {sampler.errors}; "
          f"not reported by this GPU: {', '.join(missing) or 'none'}")
    print(f"wrote {parquet}")
    bad = failures(phases[0], phases[1])
    for line in bad:
        print(f"gpu_check: FAIL: {line}")
    if not bad:
        print("gpu_check: PASS: power, utilisation and the energy counter follow the load")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
