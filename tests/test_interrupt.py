"""Ctrl-C during a trial leaves no engine process alive, on the Ray path and the single-run path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.process.server import group_alive
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # engines, Ray and signals to real processes

LONG = ["workload=tiny", "workload.output_len=2000",
        "workload.concurrency=[2]", "ray.num_cpus=2"]


def _wait_for_running_trial(workdir: Path, proc: subprocess.Popen[str], timeout: float = 120) -> int:
    """The engine's process group id, once a trial is driving load."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for progress in (workdir / "runs").rglob("progress.json"):
            try:
                state = json.loads(progress.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            pgid_file = progress.parent / "server" / "server.pgid"
            if state.get("status") == "running" and pgid_file.exists():
                return int(pgid_file.read_text())
        time.sleep(0.2)
    raise AssertionError("no trial started driving load in time")


@pytest.mark.parametrize("mode", ["sweep", "single", "sweep-sigterm"])
def test_interrupt_stops_engine(mode: str, tmp_path: Path) -> None:
    # the sweep has a second 8-GPU trial that must wait for the first: it is cancelled while queued
    args = ["-m", *LONG, "workload.seed=0,1"] if mode.startswith("sweep") else LONG
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        pgid = _wait_for_running_trial(tmp_path, proc)
        assert group_alive(pgid)
        time.sleep(0.5)
        if mode == "sweep-sigterm":
            os.kill(proc.pid, signal.SIGTERM)  # what a batch system or `kill` sends the driver alone
        else:
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the foreground group
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(pgid), "engine process group survived Ctrl-C"
    assert "killed" in out  # the sweep table shows the trial's status
    if mode.startswith("sweep"):
        assert "cancelled 1 queued trial(s) before they started" in out
