"""A driver killed outright (`kill -9`, the OOM killer) runs no cleanup of its own. Nothing of its run may
outlive it for long (the engine goes through the deathsig wrapper, Ray's processes and anything else
through the driver's guardian), the next run against the same store closes the runs it left
"running" (uploading what their trial directories hold, stopping a leftover engine), and the same
sweep run again reuses what succeeded and re-runs the rest."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.process.server import group_alive
from orchestrator.store.stale import close_stale_runs, driver_tags
from orchestrator.store.tracking import Tracker
from tests.conftest import NO_DRAWING, run_cli, sqlite_store
from tests.test_interrupt import (
    RUN,
    artifacts,
    assert_nothing_left,
    kill_all,
    start_driver,
    sweep_and_trials,
    wait_for_records,
)
from vocab.records import RequestRecord
from vocab.status import RunKind, Tag, TrialStatus

pytestmark = pytest.mark.slow  # real processes, engines and Ray

EXPERIMENT = "stale-test"
SECRET = "sekrit-value-123"
# three short trials on one simulated GPU: they run one after another
# Each trial sends all its 600 requests (no stop rule: a point whose throughput is soon known would end
# within a poll of its first record, and the driver must be killed while the second trial still runs)
THREE = ["-m", "model=tiny-test", "parallelism=tp1", "workload=tiny", "workload.output_len=32", *NO_DRAWING,
         "workload.requests_per_concurrency=300", "workload.concurrency=[2]", "workload.ci_target=null",
         "ray.num_cpus=2", "ray.num_gpus=1", "workload.seed=0,1,2"]


# A driver as the guardian sees one: it starts its guardian, a child that ignores SIGTERM and SIGINT
# (as Ray's agents outlive their raylet) and an engine in its own session with its group id in the
# trial directory. "clean": then it stops both itself and exits, as a sweep that ends well does.
FAKE_DRIVER = """
import signal, subprocess, sys, time
from pathlib import Path
from orchestrator.process.guardian import start_guardian
sweep, how = Path(sys.argv[1]), sys.argv[2]
start_guardian(sweep)
stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
trial = sweep / "0"
(trial / "server").mkdir(parents=True)
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(trial)],
                          start_new_session=True)
(trial / "server" / "server.pgid").write_text(str(engine.pid))
time.sleep(1.5)  # the guardian looks at the driver's children twice a second
if how == "clean":
    for child in (stubborn, engine):
        child.kill()
        child.wait()
    sys.exit(0)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["killed", "clean"])
def test_the_guardian_ends_what_a_killed_driver_left(how: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    driver = subprocess.Popen([sys.executable, "-c", FAKE_DRIVER, str(sweep), how], text=True,
                              stdout=subprocess.PIPE, start_new_session=True)
    try:
        if how == "killed":
            assert driver.stdout is not None and driver.stdout.readline().strip() == "ready"
            os.kill(driver.pid, signal.SIGKILL)
        assert driver.wait(timeout=30) == (-signal.SIGKILL if how == "killed" else 0)
        assert_nothing_left(driver.pid, tmp_path, int((sweep / "0" / "server" / "server.pgid").read_text()))
    finally:
        kill_all(driver, tmp_path)
    log = sweep / "guardian.log"
    if how == "killed":  # the engine (SIGTERM) and the child that ignores it (SIGKILL)
        assert f"the driver (pid {driver.pid}) ended and left 2 process(es) running" in log.read_text()
    else:  # nothing was left: the guardian had nothing to do
        assert not log.exists()


def _dead_driver() -> dict[str, str]:
    """Driver tags naming a process that has ended (its start time read while it was a zombie)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return {**driver_tags(), Tag.DRIVER_PID: str(proc.pid), Tag.DRIVER_STARTED: f"{started:.2f}"}


def _trial_dir(root: Path, name: str) -> Path:
    """A trial directory as a killed trial leaves it: some records (and a torn last line), the server
    log, the progress file, Hydra's saved config (with a secret that must not be uploaded)."""
    trial = root / name
    (trial / "records").mkdir(parents=True)
    (trial / "server").mkdir()
    (trial / ".hydra").mkdir()
    lines = [RequestRecord("c2", i, send_time=100.0 + i, end_time=101.0 + i, output_tokens=32).to_json()
             for i in range(2)]
    (trial / "records" / "requests.jsonl").write_bytes(b"\n".join(lines) + b'\n{"point": "c2", "ind')
    (trial / "server" / "server.log").write_text(f"starting with --api-key {SECRET}\nready\n")
    (trial / "progress.json").write_text(json.dumps({"status": "running", "done": 2}))
    (trial / ".hydra" / "config.yaml").write_text(f"engine:\n  api_key: {SECRET}\n")
    return trial


def _group(argv: list[str], log: Path | None = None) -> subprocess.Popen[bytes]:
    """A process group of its own, as an engine runs, its output to ``log``."""
    out = log.open("ab") if log else subprocess.DEVNULL
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def _members(pgid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
    return found


def test_the_next_run_closes_stale_runs_and_stops_their_engines(tmp_path: Path) -> None:
    tracker = Tracker(sqlite_store(tmp_path / "mlflow.db"), EXPERIMENT)
    dead = _dead_driver()

    def run(name: str, tags: dict[str, str], parent: str | None = None, kind: RunKind = RunKind.TRIAL) -> str:
        return tracker.start_run(name, {Tag.KIND: kind.value, Tag.STATUS: TrialStatus.RUNNING.value, **tags},
                                 parent_run_id=parent)

    sweeps = tmp_path / "sweep"
    # the simulated engine's kind: its command line names the trial directory
    by_cmdline = _trial_dir(sweeps, "0")
    # SGLang's kind: nothing in its command line, but its output (and its children's) goes to the log
    by_output = _trial_dir(sweeps, "1")
    # a group id in server.pgid that now belongs to something else (ids are reused): left alone
    reused_group = _trial_dir(sweeps, "2")
    sleeper = "import time; time.sleep(600)"
    engine_a = _group([sys.executable, "-c", sleeper, str(by_cmdline)])
    engine_b = _group([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, "
                       f"'-c', {sleeper!r}]); exec({sleeper!r})"], by_output / "server" / "server.log")
    other = _group([sys.executable, "-c", sleeper])
    started = [engine_a, engine_b, other]
    try:
        for proc, trial in zip(started, (by_cmdline, by_output, reused_group), strict=True):
            (trial / "server" / "server.pgid").write_text(str(proc.pid))
        deadline = time.monotonic() + 15
        while len(_members(engine_b.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_members(engine_b.pid)) == 2

        killed_sweep = run("sweep a", {**dead, Tag.SWEEP_DIR: str(sweeps)}, kind=RunKind.SWEEP)
        stale_trials = [run(f"#{i}", {Tag.TRIAL_DIR: str(d), Tag.TRIAL_NUM: str(i)}, killed_sweep)
                        for i, d in enumerate((by_cmdline, by_output, reused_group))]
        live_sweep = run("sweep b", driver_tags(), kind=RunKind.SWEEP)  # this process: alive
        live_trial = run("#0 live", {}, live_sweep)
        me = driver_tags()
        reused_pid = run("sweep c", {**me, Tag.DRIVER_STARTED: f"{float(me[Tag.DRIVER_STARTED]) - 1000:.2f}"},
                         kind=RunKind.SWEEP)  # our pid, but not our process: that driver is gone
        elsewhere = run("sweep d", {**dead, Tag.DRIVER_HOST: "elsewhere.example"}, kind=RunKind.SWEEP)
        # the same host name in another container: its pids are not the ones seen here
        container = run("sweep e", {**dead, Tag.DRIVER_PID_NAMESPACE: "pid:[1]"}, kind=RunKind.SWEEP)
        anonymous = run("#0 older", {})

        said: list[str] = []
        closed = close_stale_runs(tracker, said.append)

        assert set(closed) == {*stale_trials, killed_sweep, reused_pid}
        # trials before their sweep: a sweep is never closed while its trial still says running
        assert closed.index(killed_sweep) > max(closed.index(t) for t in stale_trials)
        closed_lines = [line for line in said if line.startswith("parasweep: closed ")]
        assert len(closed_lines) == 5, said
        assert f"pid {dead[Tag.DRIVER_PID]} on host {socket.gethostname()}" in closed_lines[0]
        hosts = ", ".join(sorted([socket.gethostname(), "elsewhere.example"]))
        assert any(f"2 run(s) marked running by a driver on another host or in another container "
                   f"({hosts}) left as they are" in line for line in said), said
        assert any("1 run(s) marked running name no driver" in line for line in said), said

        # the engines are stopped, whole groups; the reused group id's process is not touched
        engine_a.wait(timeout=15)
        engine_b.wait(timeout=15)  # the leader; its child is reaped by init
        deadline = time.monotonic() + 15
        while (group_alive(engine_a.pid) or group_alive(engine_b.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_alive(engine_a.pid) and not group_alive(engine_b.pid)
        assert other.poll() is None, "a process that is not the trial's engine was stopped"
        assert any("stopped its engine (1 process(es))" in line for line in closed_lines), said
        assert any("stopped its engine (2 process(es))" in line for line in closed_lines), said

        for run_id in closed:
            closed_run = tracker.client.get_run(run_id)
            assert closed_run.info.status == "KILLED"
            assert closed_run.data.tags[Tag.STATUS] == TrialStatus.KILLED.value
            assert closed_run.data.tags[Tag.STALE_CLOSED].startswith("closed by the next run: its driver")
        for run_id in (live_sweep, live_trial, elsewhere, container, anonymous):
            assert tracker.client.get_run(run_id).data.tags[Tag.STATUS] == TrialStatus.RUNNING.value

        # what the trial directory held is in MLflow: the records (the torn line skipped), the server
        # log without the secret, the progress file
        trial_a = stale_trials[0]
        assert {"records/requests.parquet", "server/server.log", "progress.json"} <= set(
            artifacts(tracker.client, trial_a))
        import pandas as pd

        downloaded = Path(tracker.client.download_artifacts(trial_a, "records", str(tmp_path / "dl")))
        assert len(pd.read_parquet(downloaded / "requests.parquet")) == 2
        log = Path(tracker.client.download_artifacts(trial_a, "server/server.log", str(tmp_path / "dl")))
        assert SECRET not in log.read_text() and "***" in log.read_text()

        # run again: nothing more to close (the live sweep is still alive)
        assert close_stale_runs(tracker, said.append) == []
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not any(group_alive(p.pid) for p in started)


def test_sigkill_of_a_single_run_leaves_nothing_and_the_next_run_closes_it(tmp_path: Path) -> None:
    proc = start_driver(RUN, tmp_path)
    try:
        trial_dir, pgid = wait_for_records(tmp_path, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        # the engine's deathsig parent is the driver itself: it is told to stop when the driver dies
        assert_nothing_left(proc.pid, tmp_path, pgid)
    finally:
        kill_all(proc, tmp_path)

    _, _, trials = sweep_and_trials(tmp_path)
    assert [t.data.tags[Tag.STATUS] for t in trials] == [TrialStatus.RUNNING.value]  # as the kill left it

    again = run_cli(["model=tiny-test", "parallelism=tp1", "workload=tiny"], tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    # a single run's one trial has a short label (its overrides are in config/overrides.yaml)
    assert "#0 single run" in again.stdout and "#0 model=tiny-test" not in again.stdout
    assert "Tight layout" not in again.stderr and "Creating initial MLflow" not in again.stderr
    closed = [line for line in again.stdout.splitlines() if line.startswith("parasweep: closed ")]
    assert len(closed) == 2, again.stdout
    assert closed[0].startswith("parasweep: closed trial run #0") and f"pid {proc.pid}" in closed[0]
    assert closed[1].startswith("parasweep: closed sweep run")

    store, sweeps, trials = sweep_and_trials(tmp_path)
    stale = next(t for t in trials if t.data.tags.get(Tag.TRIAL_DIR) == str(trial_dir))
    assert stale.info.status == "KILLED" and stale.data.tags[Tag.STATUS] == TrialStatus.KILLED.value
    assert f"its driver (pid {proc.pid} on host" in stale.data.tags[Tag.STALE_CLOSED]
    assert {"records/requests.parquet", "server/server.log", "progress.json"} <= set(
        artifacts(store, stale.info.run_id))
    assert sorted(s.data.tags[Tag.STATUS] for s in sweeps) == ["killed", "ok"]
    assert_nothing_left(proc.pid, tmp_path, pgid)


def test_sigkill_of_a_sweep_then_the_same_sweep_resumes(tmp_path: Path) -> None:
    """Three trials one after another; the driver is killed during the second. Nothing of the run
    outlives it (Ray's agents would for a minute without the guardian), and the same command again
    closes the stale runs, reuses the first trial and runs the other two."""
    proc = start_driver(THREE, tmp_path)
    try:
        first, _ = wait_for_records(tmp_path, proc)
        deadline = time.monotonic() + 150
        while json.loads((first / "progress.json").read_text()).get("status") != "ok":
            assert time.monotonic() < deadline, "the first trial did not finish in time"
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        second, pgid = wait_for_records(tmp_path, proc, skip=(first,))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert_nothing_left(proc.pid, tmp_path, pgid)
    finally:
        kill_all(proc, tmp_path)
    never_started = {"0", "1", "2"} - {first.name, second.name}

    _, _, before = sweep_and_trials(tmp_path)
    by_dir = {Path(t.data.tags[Tag.TRIAL_DIR]).name: t for t in before}
    assert set(by_dir) == {first.name, second.name}
    assert by_dir[first.name].data.tags[Tag.STATUS] == TrialStatus.OK.value
    # as the kill left it: still running (its worker died with the driver), or closed as killed by its
    # worker on the way out (Ray ends a worker whose raylet is gone with SystemExit: on a busy machine
    # it can live long enough to close its run); never failed, which would blame the trial
    left = by_dir[second.name].data.tags[Tag.STATUS]
    assert left in (TrialStatus.RUNNING.value, TrialStatus.KILLED.value)

    again = start_driver(THREE, tmp_path)
    try:
        out, err = again.communicate(timeout=400)
    finally:
        kill_all(again, tmp_path)
    assert again.returncode == 0, out + err
    assert (f"parasweep: closed trial run #{second.name}" in out) is (left == TrialStatus.RUNNING.value)
    assert "parasweep: closed sweep run" in out
    assert f"skipping #{first.name}" in out

    store, sweeps, trials = sweep_and_trials(tmp_path)
    stale = store.get_run(by_dir[second.name].info.run_id)
    assert stale.info.status == "KILLED" and stale.data.tags[Tag.STATUS] == TrialStatus.KILLED.value
    if left == TrialStatus.RUNNING.value:  # closed by the next run, with what its directory held
        assert f"its driver (pid {proc.pid} on host" in stale.data.tags[Tag.STALE_CLOSED]
    assert {"records/requests.parquet", "server/server.log"} <= set(artifacts(store, stale.info.run_id))
    old_sweep = store.get_run(stale.data.tags[Tag.PARENT])
    assert old_sweep.info.status == "KILLED" and Tag.STALE_CLOSED in old_sweep.data.tags

    new_sweep = next(s for s in sweeps if s.info.run_id != old_sweep.info.run_id)
    assert new_sweep.data.tags[Tag.STATUS] == "ok"
    new = {t.data.tags[Tag.TRIAL_NUM]: t for t in trials if t.data.tags[Tag.PARENT] == new_sweep.info.run_id}
    assert set(new) == {"0", "1", "2"}
    assert new[first.name].data.tags[Tag.STATUS] == TrialStatus.SKIPPED.value
    assert new[first.name].data.tags[Tag.REUSED_RUN_ID] == by_dir[first.name].info.run_id
    for name in (second.name, *never_started):
        assert new[name].data.tags[Tag.STATUS] == TrialStatus.OK.value
    # the killed trial ran again with the same config
    assert new[second.name].data.tags[Tag.CONFIG_HASH] == stale.data.tags[Tag.CONFIG_HASH]
    assert_nothing_left(again.pid, tmp_path, pgid)
