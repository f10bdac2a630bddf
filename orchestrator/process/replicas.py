"""A trial's servers behind the router package, started, watched and stopped as one: its DP replicas
(``dp.router_impl``), or a disaggregated deployment's prefill and decode servers (``pd.*``).

Each server is its own process group with its own log (the first one's is ``server.log``, so everything
read from the engine's log reads it), each probed on ``/health``; the router comes last, once every
server answers, and is ready when its ``/workers`` lists all of them as healthy (its own ``/health``
answers 200 before it knows any). Stopped router first, then every server's whole group, on success,
error and Ctrl-C alike. A server that exits or stops answering is named in the trial's one-line failure.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.errors import EngineStartError
from orchestrator.process.health import HealthProber
from orchestrator.process.server import ServerProcess, exit_reason, log_tail

HOST = "127.0.0.1"


class LogLayout(Protocol):
    """Where the replicas' and the router's logs go (the trial directory's layout)."""

    def replica_log(self, rank: int) -> Path: ...

    @property
    def router_log(self) -> Path: ...


def healthy_workers(router_url: str) -> int:
    """How many workers the router's ``GET /workers`` lists as healthy (0 when it cannot say yet)."""
    try:
        with urllib.request.urlopen(router_url + "/workers", timeout=5) as resp:
            workers = json.loads(resp.read()).get("workers", [])
    except (OSError, ValueError, AttributeError):
        return 0
    return sum(1 for w in workers if isinstance(w, dict) and w.get("is_healthy"))


@dataclass(frozen=True)
class Worker:
    """One server behind the router: what to call it, its command, port, environment and log."""

    name: str  # "DP replica 1", "prefill server 0"
    argv: list[str]
    port: int
    env: dict[str, str]
    log: Path


class ReplicaGroup:
    """The servers and the router in front of them."""

    def __init__(self, logs: LogLayout, stop_grace_s: float) -> None:
        self.logs, self.stop_grace_s = logs, stop_grace_s
        self.replicas: list[ServerProcess] = []
        self.names: list[str] = []
        self.router: ServerProcess | None = None
        self._probers: list[HealthProber] = []

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def start_replicas(self, commands: list[tuple[list[str], int, dict[str, str]]], timeout_s: float) -> None:
        """Start every DP replica (argv, port, environment) and wait until each answers."""
        self.start_workers([Worker(f"DP replica {rank}", argv, port, env, self.logs.replica_log(rank))
                            for rank, (argv, port, env) in enumerate(commands)], timeout_s)

    def start_workers(self, workers: list[Worker], timeout_s: float) -> None:
        """Start every server, then wait until each answers ``/health``: they load side by side, so the
        wait is the slowest one's, not their sum."""
        for w in workers:
            server = ServerProcess(w.argv, w.log, HOST, w.port, env=w.env, stop_grace_s=self.stop_grace_s)
            self.replicas.append(server)
            self.names.append(w.name)
            server.start()
        deadline = time.monotonic() + timeout_s
        for name, server in zip(self.names, self.replicas, strict=True):
            try:
                server.wait_ready(max(1.0, deadline - time.monotonic()), self.problem)
            except EngineStartError as exc:
                raise EngineStartError(f"{name}: {exc}") from None
        self._probers = [HealthProber(url).start() for url in self.urls]

    def start_router(self, argv: list[str], port: int, timeout_s: float) -> ServerProcess:
        """The router, ready once its ``/workers`` lists every replica healthy."""
        # it holds no GPU and nothing to save: a short grace (it would otherwise keep its listener open
        # for a load balancer's sake for 5 s after SIGTERM)
        self.router = ServerProcess(argv, self.logs.router_log, HOST, port, stop_grace_s=1.0,
                                    env={**os.environ, "NO_COLOR": "1"})
        self.router.start()
        self.router.wait_ready(timeout_s, self.problem)
        deadline = time.monotonic() + timeout_s
        while healthy_workers(self.router.url) < len(self.replicas):
            code = self.router.proc.poll() if self.router.proc is not None else None
            if code is not None or time.monotonic() > deadline:
                why = exit_reason(code, "router") if code is not None else f"not all {len(self.replicas)} " \
                      f"servers healthy behind the router after {timeout_s:g} s (engine.startup_timeout_s)"
                raise EngineStartError(f"{why}; router log tail ({self.router.log_path}):\n"
                                       f"{log_tail(self.router.log_path)}")
            if (problem := self.problem()) is not None:
                raise EngineStartError(f"{problem} before the router was ready")
            time.sleep(0.2)
        return self.router

    def problem(self) -> str | None:
        """A server that exited or stopped answering ``/health``, or None."""
        for name, server in zip(self.names, self.replicas, strict=True):
            code = server.proc.poll() if server.proc is not None else None
            if code is not None:
                return exit_reason(code, f"{name}'s engine")
        for name, prober in zip(self.names, self._probers, strict=False):
            if prober.verdict:
                return f"{name}'s engine not answering /health: {prober.verdict}"
        return None

    def gone_first(self, router_code: int | None) -> str | None:
        """For the engine watch, whose own process is the router's: a replica's problem, else the
        router's exit."""
        problem = self.problem()
        if problem is None and router_code is not None:
            return exit_reason(router_code, "router")
        return problem

    def log_tails(self, lines: int = 10) -> str:
        paths = [*(r.log_path for r in self.replicas[1:]), self.logs.router_log]
        return "\n".join(f"{p.name} tail ({p}):\n{log_tail(p, lines)}" for p in paths if p.exists())

    def stop(self) -> None:
        """The probers, the router, then each replica's whole process group."""
        for prober in self._probers:
            prober.stop()
        self._probers = []
        try:
            if self.router is not None:
                self.router.stop()
        finally:
            for server in self.replicas:
                server.stop()
