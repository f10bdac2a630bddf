"""How tests start the servers the load generator is tested against: each in its own process group,
through the project's one server-process helper (``orchestrator.process.server.ServerProcess``: ready
when ``GET /health`` answers 200, the whole group stopped on exit)."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil

from orchestrator.process.server import ServerProcess, free_port
from vocab.assets import model_dir
from vocab.hardware import resolve_hardware_path

HOST = "127.0.0.1"
FAKE_SERVER = Path(__file__).with_name("fakeserver.py")


def _flags(settings: dict[str, Any]) -> list[str]:
    return [arg for key, value in settings.items() for arg in (f"--{key.replace('_', '-')}", str(value))]


@contextlib.contextmanager
def started(argv: list[str], port: int, startup_timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``argv`` (a server that listens on ``HOST:port``) until the block ends; yields its URL."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(argv, Path(tmp) / "server.log", HOST, port, stop_grace_s=2.0) as server,
    ):
        server.wait_ready(startup_timeout_s)
        yield server.url


class FakeServer:
    """A running ``tests/fakeserver.py``: its URL, and its behaviour changed at run time."""

    def __init__(self, url: str) -> None:
        self.url = url

    def control(self, **settings: Any) -> dict[str, Any]:
        """Change the behaviour of the running server (and reset its request counter)."""
        req = urllib.request.Request(
            self.url + "/_control", data=orjson.dumps(settings), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return orjson.loads(resp.read())


@contextlib.contextmanager
def fake_server(**settings: Any) -> Iterator[FakeServer]:
    """``tests/fakeserver.py`` with these settings (``mode``, ``every``, ``ttft_ms``, ``itl_ms``, ...)."""
    port = free_port()
    with started([sys.executable, str(FAKE_SERVER), "--port", str(port), *_flags(settings)], port) as url:
        yield FakeServer(url)


@contextlib.contextmanager
def loopback_server(**settings: Any) -> Iterator[str]:
    """``python -m workloads.loopback`` with these settings (``ttft_ms``, ``itl_ms``); yields its URL."""
    port = free_port()
    with started(
        [sys.executable, "-m", "workloads.loopback", "--port", str(port), *_flags(settings)], port
    ) as url:
        yield url


@contextlib.contextmanager
def simulator_process(flags: list[str], tmp: Path, env: dict[str, str] | None = None
                      ) -> Iterator[ServerProcess]:
    """``python -m simulator`` with the tiny test model and ``flags``, started (not waited for: some
    tests want it never ready) and stopped with its whole group at the end. Its hardware profile is a
    copy under ``tmp``, so every process of it names ``tmp`` on its command line (see
    ``processes_mentioning``); its log is ``tmp/server.log``."""
    port = free_port()
    hardware = tmp / "hardware.yaml"
    shutil.copy(resolve_hardware_path("h100-sxm-x8"), hardware)
    argv = [sys.executable, "-m", "simulator", "--model-path", str(model_dir("models/tiny-test")),
            "--sim-hardware", str(hardware), "--host", HOST, "--port", str(port), *flags]
    server = ServerProcess(argv, tmp / "server.log", HOST, port, env=env, stop_grace_s=10.0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line contains ``text`` (pid and command line), zombies excluded."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        with contextlib.suppress(psutil.Error):  # gone while we looked
            cmdline = " ".join(p.info["cmdline"] or [])
            if text in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{p.pid}: {cmdline[:160]}")
    return found
