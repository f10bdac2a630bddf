"""Shared helpers: run parasweep's real entry point as a subprocess from a scratch directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """``python run.py ARGS`` with cwd (hence runs/) in a scratch directory."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env, check=False)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
