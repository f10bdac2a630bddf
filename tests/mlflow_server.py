"""A real ``mlflow server`` for tests: a sqlite store and artifacts in a scratch folder, bound to
127.0.0.1, in its own process group (started and stopped through the project's server-process
helper), and restartable on the same store and port, as a server that went away and came back."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.process.server import ServerProcess, free_port
from tests.conftest import sqlite_store

HOST = "127.0.0.1"


class MlflowServer:
    """``start()``/``stop()`` as often as needed; the store and the port stay the same."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._server: ServerProcess | None = None
        self.pgids: list[int] = []  # every process group it ran as, to check none is left

    def start(self, timeout_s: float = 180.0) -> None:
        sqlite_store(self.root / "mlflow.db")  # an empty store on the first start: no migrations to wait for
        argv = [sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(self.port),
                "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination", str(self.root / "artifacts")]
        # one worker and no job runner: ready in seconds, a few hundred MB, no stray consumers
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._server = ServerProcess(argv, self.root / "server.log", HOST, self.port, env=env,
                                     stop_grace_s=2.0)
        self._server.start()
        assert self._server.pid is not None
        self.pgids.append(self._server.pid)
        self._server.wait_ready(timeout_s)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
