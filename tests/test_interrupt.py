"""Every way a driver is interrupted, in a single run (the trial runs in the driver) and in a sweep
(trials in Ray workers): SIGINT and SIGTERM, sent to the driver alone (`kill`, a batch system) or to its
whole process group (a terminal's Ctrl-C, `kill -- -PGID`). Each time the driver exits promptly with
130, nothing of the run is left (no engine, no Ray worker, raylet or GCS), the interrupted trial's run
is closed killed with the records it had so far, and a queued trial never starts."""

from __future__ import annotations

import contextlib
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
from tests.conftest import NO_DRAWING, ROOT, sqlite_store
from vocab.status import RunKind, Tag, TrialStatus

pytestmark = pytest.mark.slow  # engines, Ray and signals to real processes

# short requests in a point far too long to finish: records pile up from the first seconds of load,
# and the trial is still running whenever the signal comes
RUN = ["model=tiny-test", "parallelism=tp1", "workload=tiny", "workload.output_len=32", *NO_DRAWING,
       "workload.requests_per_concurrency=3000", "workload.concurrency=[2]", "ray.num_cpus=2"]
# one simulated GPU: the sweep's second trial waits for the first and is cancelled while queued
SWEEP = ["-m", *RUN, "ray.num_gpus=1", "workload.seed=0,1"]
STOP_WITHIN_S = 60  # the driver's exit after the signal (it takes a few seconds)
GONE_WITHIN_S = 20  # the run's processes after the driver's exit (Ray's agents take a few seconds)


def start_driver(args: list[str], workdir: Path, prefix: str = "") -> subprocess.Popen[str]:
    """``python run.py ARGS`` in its own session (its pid is the session id every Ray process of the
    run inherits), through ``bash -c 'PREFIX exec ...'`` so the shell can set what it inherits.
    The run finds an empty store at runs/mlflow.db, as after an earlier run."""
    sqlite_store(workdir / "runs" / "mlflow.db")
    argv = ["bash", "-c", prefix + 'exec "$0" "$@"', sys.executable, str(ROOT / "run.py"), *args]
    return subprocess.Popen(argv, cwd=workdir, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def wait_for_records(workdir: Path, proc: subprocess.Popen[str], timeout: float = 150,
                     skip: tuple[Path, ...] = ()) -> tuple[Path, int]:
    """``(trial directory, engine process group)`` of the first trial (not in ``skip``) that is driving
    load and has finished a request."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for progress in (workdir / "runs").rglob("progress.json"):
            trial = progress.parent
            try:
                state = json.loads(progress.read_text())
                records = (trial / "records" / "requests.jsonl").read_bytes()
                pgid = int((trial / "server" / "server.pgid").read_text())
            except (OSError, ValueError):
                continue
            if trial not in skip and state.get("status") == "running" and records.count(b"\n") >= 1:
                return trial, pgid
        time.sleep(0.2)
    raise AssertionError("no trial finished a request in time")


def leftovers(session: int, workdir: Path) -> list[str]:
    """Processes of the driver's session (every Ray process of the run, and Ray's agents after their
    raylet is gone), or whose command line names the work directory (the engine has its own session;
    the guardian's names the sweep directory): what must be gone once the driver has exited."""
    left = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
            if p.pid != me and (os.getsid(p.pid) == session or str(workdir) in cmdline):
                left.append(f"{p.pid}: {cmdline[:160]}")
        except (ProcessLookupError, psutil.Error):  # gone while we looked
            continue
    return left


def assert_nothing_left(session: int, workdir: Path, pgid: int, within: float = GONE_WITHIN_S) -> None:
    deadline = time.monotonic() + within
    while (leftovers(session, workdir) or group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not group_alive(pgid), "the engine's process group survived"
    assert leftovers(session, workdir) == []


def kill_all(proc: subprocess.Popen[str], workdir: Path) -> None:
    """After a failed test: nothing of it may stay behind for the next one."""
    for line in leftovers(proc.pid, workdir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)


def artifacts(store: object, run_id: str, path: str = "") -> list[str]:
    out: list[str] = []
    for item in store.list_artifacts(run_id, path or None):  # type: ignore[attr-defined]
        out += artifacts(store, run_id, item.path) if item.is_dir else [item.path]
    return out


def sweep_and_trials(workdir: Path) -> tuple[object, list[object], list[object]]:
    """(the MLflow client, the sweep runs, the trial runs) of the store in ``workdir``."""
    store = client(f"sqlite:///{workdir / 'runs' / 'mlflow.db'}")
    runs = store.search_runs([e.experiment_id for e in store.search_experiments()])
    sweeps = [r for r in runs if r.data.tags.get(Tag.KIND) == RunKind.SWEEP.value]
    trials = [r for r in runs if r.data.tags.get(Tag.KIND) == RunKind.TRIAL.value]
    return store, sweeps, trials


def check_interrupted(proc: subprocess.Popen[str], workdir: Path, trial_dir: Path, pgid: int,
                      sent: float, mode: str) -> None:
    out, err = proc.communicate(timeout=STOP_WITHIN_S + 30)
    took = time.monotonic() - sent
    assert proc.returncode == 130, out + err
    assert took < STOP_WITHIN_S, f"the driver took {took:.0f} s to stop"
    assert_nothing_left(proc.pid, workdir, pgid)
    said = [line for line in err.splitlines() if line.startswith("parasweep:")]
    assert len(said) == 1 and "interrupted" in said[0], err
    assert "Traceback" not in err
    assert "killed" in out  # the sweep's table shows the trial's status
    if mode == "sweep":
        assert "cancelled 1 queued trial(s) before they started" in out

    store, sweeps, trials = sweep_and_trials(workdir)
    assert len(sweeps) == 1 and sweeps[0].data.tags[Tag.STATUS] == TrialStatus.KILLED.value
    assert sweeps[0].info.status == "KILLED"
    assert len(trials) == 1, "only the trial that was running has a run (the queued one never started)"
    trial = trials[0]
    assert trial.data.tags[Tag.PARENT] == sweeps[0].info.run_id
    assert trial.data.tags[Tag.STATUS] == TrialStatus.KILLED.value and trial.info.status == "KILLED"
    assert Path(trial.data.tags[Tag.TRIAL_DIR]) == trial_dir
    # the records finished before the signal are kept, in the trial directory and in MLflow
    assert (trial_dir / "records" / "requests.parquet").exists()
    assert "records/requests.parquet" in artifacts(store, trial.info.run_id)


@pytest.mark.parametrize("target", ["driver", "group"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
@pytest.mark.parametrize("mode", ["single", "sweep"])
def test_a_signal_stops_the_run_and_leaves_nothing(mode: str, sig: signal.Signals, target: str,
                                                   tmp_path: Path) -> None:
    # A signal to the driver alone comes from `kill` or a batch system, which typically started the
    # driver from a script: a non-interactive shell starts `cmd &` with SIGINT ignored (POSIX) and
    # Python keeps that, so those drivers start so here (`trap "" INT; exec`). A group signal comes
    # from a terminal, whose foreground job starts with the default handlers.
    prefix = 'trap "" INT; ' if target == "driver" else ""
    proc = start_driver(SWEEP if mode == "sweep" else RUN, tmp_path, prefix)
    try:
        trial_dir, pgid = wait_for_records(tmp_path, proc)
        if target == "driver":
            os.kill(proc.pid, sig)  # the driver's pid only (exec kept bash's pid)
        else:
            os.killpg(proc.pid, sig)  # Ctrl-C in a terminal, `kill -- -PGID`: the whole group
        check_interrupted(proc, tmp_path, trial_dir, pgid, time.monotonic(), mode)
    finally:
        kill_all(proc, tmp_path)
