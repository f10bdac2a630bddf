"""Shared helpers: run parasweep's real entry point as a subprocess from a scratch directory, and give
tests real MLflow sqlite stores without paying MLflow's schema migrations for each one."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# An empty MLflow store, created once per test process (MLflow's ~40 schema migrations take about 2 s
# of CPU for each new sqlite file) and copied wherever a test needs a store: the copy is the same real
# store MLflow would have created, opened without migrating (docs/testing.md). It lives in a folder of
# this process's own, removed when the process ends: nothing depends on an earlier run.
_TEMPLATE_DIR: list[Path] = []


def _template() -> Path:
    if not _TEMPLATE_DIR:
        folder = Path(tempfile.mkdtemp(prefix="parasweep-mlflow-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}").search_experiments()  # the tables
        _TEMPLATE_DIR.append(folder)
    return _TEMPLATE_DIR[0] / "mlflow.db"


def sqlite_store(path: Path) -> str:
    """The tracking URI of the MLflow sqlite store at ``path`` (a file): the store already there, or a
    new, empty one (a copy of the template)."""
    if not path.exists():
        template = _template()
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path)
    return f"sqlite:///{path}"


def run_cli(args: list[str], cwd: Path, timeout: float = 120, env: dict[str, str] | None = None,
            store: bool = False) -> subprocess.CompletedProcess[str]:
    """``python run.py ARGS`` with cwd (hence runs/) in a scratch directory. ``store``: start from an
    empty store at runs/mlflow.db (as after an earlier run) instead of letting the run create it."""
    if store:
        sqlite_store(cwd / "runs" / "mlflow.db")
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env, check=False)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
