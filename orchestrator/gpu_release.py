"""After a trial's engine is stopped: wait until NVML shows its GPUs free before the next trial may use
them. SGLang runs a process per rank; a killed process group can hold GPU memory for a few seconds
while the driver tears its contexts down, and a trial placed on the GPU then may run out of memory.

NVML indices are PCI-bus order and ignore CUDA_VISIBLE_DEVICES (docs/platform-notes.md, NVML), so the
trial's CVD entries are mapped to NVML handles by ``nvml_source.visible_devices``, the one mapping the
GPU telemetry uses too: a UUID (``GPU-...``/``MIG-...``, or a unique prefix of one, as CUDA accepts) by
UUID, an integer by NVML index (right where the node was started without a CVD mask, which is how Ray
hands out GPUs). An entry that matches nothing is warned about and not waited for.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from orchestrator.telemetry.nvml_source import visible_devices


def process_group_pids(pgid: int) -> set[int]:
    """The live processes of a process group (SGLang's ranks, tokenizer, detokenizer) and the leader's
    descendants; collect them while the server runs: after the stop they are gone from /proc but may
    still be listed by NVML for a moment."""
    import os

    import psutil

    pids: set[int] = set()
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                pids.add(pid)
        except OSError:  # exited meanwhile
            continue
    with contextlib.suppress(psutil.Error):  # a worker that started its own session is still a descendant
        pids.update(p.pid for p in psutil.Process(pgid).children(recursive=True))
    return pids


def _handles(nvml: Any, cuda_visible_devices: str | None, warnings: list[str]) -> list[tuple[str, Any]]:
    """(label, NVML handle) for every device the trial could see; the others become warnings."""
    out = []
    for m in visible_devices(nvml, cuda_visible_devices):
        if m.handle is None:
            warnings.append(f"{m.reason}; not checked")
        else:
            out.append((m.label, m.handle))
    return out


def _busy(nvml: Any, handles: list[tuple[str, Any]], pids: set[int] | None) -> dict[str, list[int]]:
    busy: dict[str, list[int]] = {}
    for label, handle in handles:
        procs = [int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        left = [p for p in procs if pids is None or p in pids]
        if left:
            busy[label] = sorted(left)
    return busy


def wait_gpus_free(cuda_visible_devices: str | None, timeout_s: float, pids: set[int] | None = None, *,
                   poll_s: float = 0.5, nvml: Any = None,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Poll NVML until none of ``pids`` (or, without pids, no process at all) holds a compute context on
    the trial's GPUs, or ``timeout_s`` passes. Returns warnings (GPUs still busy, unknown CVD entries);
    returns ``[]`` at once where NVML is unavailable (no driver: the simulated engine's machines).

    With pids, only the engine's own processes are waited for; note that inside a container with its
    own PID namespace NVML may report host PIDs, which then never match (prefer ``pids=None`` there:
    Ray gives a trial its GPUs exclusively, so any process left on them is a leftover)."""
    if cuda_visible_devices is not None and not cuda_visible_devices.strip():
        return []  # the engine saw no GPU
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:  # LibraryNotFound / DriverNotLoaded: nothing to wait for
        return []
    warnings: list[str] = []
    try:
        handles = _handles(nvml, cuda_visible_devices, warnings)
        deadline = clock() + timeout_s
        while True:
            busy = _busy(nvml, handles, pids)
            if not busy:
                return warnings
            if clock() >= deadline:
                detail = "; ".join(f"{label}: pids {', '.join(map(str, p))}" for label, p in busy.items())
                warnings.append(f"GPUs still in use {timeout_s:g} s after the engine stopped ({detail})")
                return warnings
            sleep(poll_s)
    except nvml.NVMLError as exc:
        warnings.append(f"NVML failed while waiting for the GPUs to be released: {exc}")
        return warnings
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
