"""Ctrl-C during a trial leaves no engine process alive, on the Ray path and the single-run path; so does
SIGINT sent to the driver alone, even when it was started with SIGINT ignored (a batch script's `&`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from analysis.store import client
from orchestrator.process.server import group_alive
from tests.conftest import ROOT
from vocab.status import RunKind, Tag, TrialStatus

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


def _leftovers(session: int, workdir: Path) -> list[str]:
    """Processes of the driver's session, or started for this sweep (the engine has its own session,
    its command line names the trial directory): what must be gone once the driver has exited."""
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
            if os.getsid(p.pid) == session or str(workdir) in cmdline:
                left.append(f"{p.pid}: {cmdline[:160]}")
        except (ProcessLookupError, psutil.Error):  # gone while we looked
            continue
    return left


@pytest.mark.parametrize("inherited", ["sigint-ignored", "sigint-default"])
def test_sigint_to_the_driver_alone_stops_the_sweep(inherited: str, tmp_path: Path) -> None:
    """`kill -INT <driver>` as a batch system or a script sends it, with no terminal: the driver has its
    own session, and nothing else of the sweep gets the signal. A non-interactive shell starts `cmd &`
    with SIGINT ignored (POSIX), and Python keeps that; `trap "" INT; exec` starts it the same way."""
    prefix = 'trap "" INT; ' if inherited == "sigint-ignored" else ""
    argv = ["bash", "-c", prefix + 'exec "$0" "$@"', sys.executable, str(ROOT / "run.py"),
            "-m", *LONG, "workload.seed=0,1"]
    proc = subprocess.Popen(argv, cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        pgid = _wait_for_running_trial(tmp_path, proc)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGINT)  # the driver's pid only (exec kept bash's pid)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert took < 30, f"the driver took {took:.0f} s to stop after SIGINT"
    deadline = time.monotonic() + 15  # Ray's own processes end shortly after the driver's shutdown
    while (_leftovers(proc.pid, tmp_path) or group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not group_alive(pgid), "the engine's process group survived SIGINT"
    assert _leftovers(proc.pid, tmp_path) == []
    said = [line for line in err.splitlines() if line.startswith("parasweep:")]
    assert len(said) == 1 and "interrupted" in said[0], err
    assert "Traceback" not in err
    assert "cancelled 1 queued trial(s) before they started" in out

    store = client(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = store.search_runs([e.experiment_id for e in store.search_experiments()])
    sweeps = [r for r in runs if r.data.tags.get(Tag.KIND) == RunKind.SWEEP.value]
    trials = [r for r in runs if r.data.tags.get(Tag.PARENT) == sweeps[0].info.run_id]
    assert len(sweeps) == 1 and sweeps[0].data.tags[Tag.STATUS] == "killed"
    assert sweeps[0].info.status == "KILLED"
    assert trials, "the trial that was running has no run"
    assert {r.data.tags[Tag.STATUS] for r in trials} == {TrialStatus.KILLED.value}
