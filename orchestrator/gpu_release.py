"""A trial's GPUs free of other processes, checked with NVML on both sides of an SGLang engine's life.

After the engine is stopped, :func:`wait_gpus_free` waits until its processes have left the GPUs
before the next trial may use them: SGLang runs a process per rank, and a killed process group can
hold GPU memory for a few seconds while the driver tears its contexts down. Before an engine is
launched, :func:`ensure_gpus_free` waits (bounded) until no process at all holds a compute context on
the trial's GPUs and otherwise fails the trial, naming the GPUs and the pids: an engine started next to
a leftover (an earlier trial's engine that was killed and has not let go yet, or a stray process)
sizes its KV cache on the memory it finds free, or runs out of memory, and either way measures
something else than what was asked.

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

from orchestrator.errors import EngineStartError
from orchestrator.telemetry.nvml_source import visible_devices

# How long a launch waits for the GPUs to be free; a killed engine lets go within seconds
BEFORE_LAUNCH_WAIT_S = 60.0
RELEASE_WAIT_S = 60.0  # after an engine's stop: how long its GPUs may take to be let go


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


def _nvml_errors(nvml: Any) -> tuple[type[BaseException], ...]:
    """What pynvml raises for a failed call: its ``NVMLError`` family, and ``NVMLLibraryMismatchError``
    (not an ``NVMLError``), which the process listings raise where the driver lacks their versioned
    symbol. A check that cannot look must warn, never end the trial or hide its real error."""
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
    return (nvml.NVMLError, mismatch) if isinstance(mismatch, type) else (nvml.NVMLError,)


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


def _describe(busy: dict[str, list[int]]) -> str:
    return "; ".join(f"{label}: pids {', '.join(map(str, p))}" for label, p in busy.items())


def _wait_free(cuda_visible_devices: str | None, timeout_s: float, pids: set[int] | None, poll_s: float,
               nvml: Any, clock: Callable[[], float], sleep: Callable[[float], None],
               warnings: list[str],
               on_busy: Callable[[dict[str, list[int]]], None] | None = None) -> dict[str, list[int]]:
    """Poll until no counted process is on the trial's GPUs or ``timeout_s`` passes; what is left then
    (empty: free, or nothing to check). NVML's own failures become warnings. ``on_busy`` hears the
    first busy look, when there is time left to wait."""
    if cuda_visible_devices is not None and not cuda_visible_devices.strip():
        return {}  # the engine sees no GPU
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return {}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:  # LibraryNotFound / DriverNotLoaded: nothing to wait for
        return {}
    try:
        handles = _handles(nvml, cuda_visible_devices, warnings)
        deadline = clock() + timeout_s
        while True:
            busy = _busy(nvml, handles, pids)
            if not busy or clock() >= deadline:
                return busy
            if on_busy is not None:
                on_busy(busy)
                on_busy = None
            sleep(poll_s)
    except _nvml_errors(nvml) as exc:
        warnings.append(f"NVML failed while checking the GPUs' processes: {exc}")
        return {}
    finally:
        with contextlib.suppress(*_nvml_errors(nvml)):
            nvml.nvmlShutdown()


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
    warnings: list[str] = []
    busy = _wait_free(cuda_visible_devices, timeout_s, pids, poll_s, nvml, clock, sleep, warnings)
    if busy:
        warnings.append(f"GPUs still in use {timeout_s:g} s after the engine stopped ({_describe(busy)})")
    return warnings


def ensure_gpus_free(cuda_visible_devices: str | None, timeout_s: float = BEFORE_LAUNCH_WAIT_S, *,
                     poll_s: float = 0.5, nvml: Any = None,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep,
                     on_wait: Callable[[str], None] | None = None) -> list[str]:
    """Before an engine is launched: wait up to ``timeout_s`` until no process holds a compute context
    on the trial's GPUs, else raise :class:`EngineStartError` naming the GPUs and the pids. Returns
    warnings (CVD entries that match no GPU, NVML errors); ``[]`` at once without NVML. ``on_wait``
    hears once, with the same detail, when the first look finds the GPUs busy."""
    def waiting(busy: dict[str, list[int]]) -> None:
        if on_wait is not None:
            on_wait(f"waiting up to {timeout_s:g} s for GPUs held by other processes ({_describe(busy)})")

    warnings: list[str] = []
    busy = _wait_free(cuda_visible_devices, timeout_s, None, poll_s, nvml, clock, sleep, warnings, waiting)
    if busy:
        raise EngineStartError(
            f"GPUs not free before the engine start ({_describe(busy)}; still held after {timeout_s:g} s): "
            "a leftover of an earlier trial or another program; see nvidia-smi")
    return warnings
