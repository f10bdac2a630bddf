"""What the load generator benchmarks share: the loopback server and CPU pinning.

The loopback server (``python -m workloads.loopback``) runs in its own process group through the
project's ``ServerProcess``, pinned to the first allowed CPU; every client runs pinned to the
second (one core each on a 2-core box), so each client measured sees the same machine.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from orchestrator.process.server import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


@contextlib.contextmanager
def loopback(ttft_ms: float, itl_ms: float, cpu: int | None) -> Iterator[str]:
    """The loopback server in its own process group, pinned to ``cpu``; yields its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "workloads.loopback", "--port", str(port)]
    argv += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
    argv += ["--cpu", str(cpu)] if cpu is not None else []
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(argv, Path(tmp) / "loopback.log", HOST, port, stop_grace_s=2.0) as srv,
    ):
        srv.wait_ready(30)
        yield srv.url


def cpus() -> tuple[int | None, int | None]:
    """(server CPU, client CPU): the first two allowed CPUs, or no pinning with fewer than two."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(allowed) < 2:
        return None, None
    return allowed[0], allowed[1]


def pinned(cmd: list[str], cpu: int | None) -> list[str]:
    """``cmd`` run on ``cpu`` only (through ``taskset``), or as is."""
    return (["taskset", "-c", str(cpu)] if cpu is not None else []) + cmd


def print_verdicts(verdicts: list[tuple[str, bool]]) -> bool:
    for what, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    return all(ok for _, ok in verdicts)
