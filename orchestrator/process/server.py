"""An engine server process: started in its own process group, probed for readiness, always stopped.

Stopping sends SIGTERM to the whole group, waits a grace period, then SIGKILLs the group: SGLang
spawns a process per rank plus tokenizer and detokenizer, and all of them must go.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.errors import EngineStartError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_block(width: int, taken: set[int], host: str = "127.0.0.1", tries: int = 64) -> int:
    """The first of ``width`` consecutive ports free on ``host`` and not in ``taken`` (those handed out
    already), which it joins (a server whose ranks each listen on a port of their own from one it is
    given up). Like ``free_port``'s, they are free when asked: nothing holds them after."""
    for _ in range(tries):
        base = free_port(host)
        block = range(base, base + width)
        if block[-1] <= 65535 and not taken.intersection(block) \
                and all(_bindable(host, p) for p in block[1:]):
            taken.update(block)
            return base
    raise RuntimeError(f"found no {width} consecutive free ports on {host} in {tries} tries")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except OSError:
        return "(no log)"


def http_get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def flush_prefix_cache(base_url: str, attempts: int = 10, pause_s: float = 0.2,
                       path: str = "/flush_cache") -> bool:
    """``POST /flush_cache`` (or vLLM's ``path``): empty the engine's prefix cache. SGLang refuses (400)
    while a request is running or waiting; the last requests of a point can take a moment to leave, so it
    is asked again a few times. False when it never flushed (or the engine has no such endpoint)."""
    for i in range(attempts):
        try:
            req = urllib.request.Request(base_url.rstrip("/") + path, data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=5.0) as resp:
                if resp.status == 200:
                    return True
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
        except OSError:
            return False
        if i + 1 < attempts:
            time.sleep(pause_s)
    return False


# SGLang's /health runs a one-token generation and polls for its output every second, for up to
# SGLANG_HEALTH_CHECK_TIMEOUT (20 s) before it answers 503. A client that gives up sooner (2 s, say)
# abandons every probe of an engine whose first generation takes longer, and so never sees it ready.
READY_PROBE_TIMEOUT_S = 25.0


class ServerProcess:
    """One engine server. Use as a context manager so it is stopped on success, error and Ctrl-C."""

    def __init__(self, argv: list[str], log_path: Path, host: str, port: int,
                 env: dict[str, str] | None = None, stop_grace_s: float = 10.0) -> None:
        self.argv, self.log_path, self.env = argv, log_path, env
        self.url = f"http://{host}:{port}"
        self.stop_grace_s = stop_grace_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        if self.proc is not None:
            raise RuntimeError(f"server already started (pid {self.proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        wrapper = [sys.executable, "-m", "orchestrator.process.deathsig", "--"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(  # argv list, no shell
                wrapper + self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True)
        # a janitor can reap this group if the whole trial process is killed (server.log: server.pgid;
        # a trial's DP replicas and router each have their own log, so their own file)
        self.log_path.with_suffix(".pgid").write_text(str(self.proc.pid))

    def wait_ready(self, timeout_s: float, elsewhere: Callable[[], str | None] | None = None) -> None:
        """Poll /health until 200; fail early if the process exits (or ``elsewhere`` names a reason:
        the engine of another node of the trial has gone), late if the deadline passes."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise EngineStartError(
                    f"engine exited with code {code} before it was ready; log tail "
                    f"({self.log_path}):\n{log_tail(self.log_path)}")
            gone = elsewhere() if elsewhere is not None else None
            if gone is not None:
                raise EngineStartError(f"{gone} before the trial's engine was ready; rank 0's log tail "
                                       f"({self.log_path}):\n{log_tail(self.log_path)}")
            try:  # a probe may take as long as SGLang's own health check (see READY_PROBE_TIMEOUT_S)
                wait = min(READY_PROBE_TIMEOUT_S, max(0.5, deadline - time.monotonic()))
                with urllib.request.urlopen(self.url + "/health", timeout=wait) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise EngineStartError(
                    f"engine not ready after {timeout_s:g} s (engine.startup_timeout_s); log tail "
                    f"({self.log_path}):\n{log_tail(self.log_path)}")
            time.sleep(0.2)

    def stop(self) -> int | None:
        """SIGTERM the group, SIGKILL it after the grace period. Safe to call more than once."""
        if self.proc is None:
            return None
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=self.stop_grace_s)
        # members other than the leader may linger (SGLang workers): kill whatever is left
        _signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        if self.proc is None:  # entering a server that is already running must not start a second one
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exit_reason(code: int, who: str = "engine") -> str:
    """``engine exited with code -9 (SIGKILL)``: the signal named when the code is one; ``who`` names
    the process (``engine on node 1`` across nodes)."""
    if code < 0:
        try:
            return f"{who} exited with code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"{who} exited with code {code}"


# SGLang's scheduler process logs this, under its rank's prefix ("[2026-... DP3 TP3]"), when it raises
_SCHEDULER_FAILED = re.compile(
    r"\[[^\]]*?((?: (?:DP|PP|TP|EP|ATTN_CP|MOE_DP)\d+)+)\] Scheduler hit an exception")
LOG_TAIL_BYTES = 256 * 1024


def failed_scheduler(log_path: Path) -> str:
    """``" (scheduler DP3 TP3 hit an exception)"``: which scheduler's failure took the engine down, from
    the end of its log; "" where the log names none (one scheduler, or another cause)."""
    try:
        with log_path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    found = _SCHEDULER_FAILED.findall(tail)
    return f" (scheduler{found[-1]} hit an exception)" if found else ""


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
