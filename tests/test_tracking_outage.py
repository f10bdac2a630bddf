"""A tracking server that goes away costs no results: writes that cannot reach it are spooled under
runs/spool/, the sweep still ends (with one line saying where the results wait), and
``python -m orchestrator sync`` (or the next run.py) replays the spool into the server once it is
back: every run once, every metric value once, with its params, artifacts and status; a sync that
stops half-way and runs again duplicates nothing. Against a real ``mlflow server`` process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.process.server import group_alive
from orchestrator.store.spool import STATE_FILE, SYNCED_DIR, is_placeholder, spool_files
from orchestrator.store.sync import sync_pending, sync_spool
from orchestrator.store.tracking import Tracker, close_spools, unreachable
from tests.conftest import ROOT, run_cli
from tests.mlflow_server import MlflowServer
from vocab.metric_keys import CONTRACT_METRICS
from vocab.status import RunKind, Tag

SWEEP = ["-m", "model=tiny-test", "parallelism=tp1", "workload=tiny", "workload.seed=0,1,2",
         "ray.num_gpus=1", "ray.num_cpus=2"]
# the trial files every trial run must have, wherever its writes went
TRIAL_ARTIFACTS = {"records/requests.parquet", "diagnosis.json", "config/resolved.yaml", "env.json"}


# -- helpers -----------------------------------------------------------------------------------------
def _client(url: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=url)


def _artifacts(client: Any, run_id: str, path: str = "") -> set[str]:
    out: set[str] = set()
    for item in client.list_artifacts(run_id, path or None):
        out |= _artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return out


def _snapshot(client: Any, experiment: str) -> dict[str, Any]:
    """Everything the store holds for the experiment's runs, keyed by run name: status, tags, params,
    each metric's full history as (step, value) pairs, the artifact paths."""
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment}"
    snap: dict[str, Any] = {}
    for run in client.search_runs([exp.experiment_id], max_results=1000):
        name = run.info.run_name
        assert name not in snap, f"two runs named {name!r}: one was created twice"
        history = {key: sorted((m.step, m.value if m.value == m.value else "nan")
                               for m in client.get_metric_history(run.info.run_id, key))
                   for key in run.data.metrics}
        snap[name] = {"id": run.info.run_id, "status": run.info.status, "tags": dict(run.data.tags),
                      "params": dict(run.data.params), "metrics": history,
                      "artifacts": _artifacts(client, run.info.run_id)}
    return snap


def _one_value_per_step(snap: dict[str, Any]) -> None:
    for name, run in snap.items():
        for key, points in run["metrics"].items():
            steps = [step for step, _ in points]
            assert len(steps) == len(set(steps)), f"{name}: metric {key} has a step twice: {points}"


def _leftovers(tmp_path: Path, sessions: list[int]) -> list[str]:
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
            if str(tmp_path) in cmdline or os.getsid(p.pid) in sessions:
                left.append(f"{p.pid}: {cmdline[:160]}")
        except (ProcessLookupError, psutil.Error):
            continue
    return left


def _assert_nothing_left(tmp_path: Path, server: MlflowServer, sessions: list[int]) -> None:
    """No process of the test's servers or drivers survives it (Ray's own processes end shortly after
    their driver's shutdown: a generous deadline)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            _leftovers(tmp_path, sessions) or any(group_alive(g) for g in server.pgids)):
        time.sleep(0.5)
    assert not any(group_alive(g) for g in server.pgids), "an mlflow server process group survived"
    assert _leftovers(tmp_path, sessions) == []


def _sync_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", "sync", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MlflowServer]:
    srv = MlflowServer(tmp_path / "mlflow")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


# -- a sweep through an outage -------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_survives_outage_and_sync_restores_everything(tmp_path: Path, server: MlflowServer) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out_path, err_path = tmp_path / "sweep.out", tmp_path / "sweep.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        driver = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *SWEEP,
                                   f"tracking.uri={server.url}"], cwd=work, stdout=out, stderr=err, text=True,
                                  start_new_session=True)
    try:
        # the server goes away once the first trial's run is closed in it; the others are still to come
        client = _client(server.url)
        deadline = time.monotonic() + 300
        while True:
            assert driver.poll() is None, err_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no trial ended in time"
            exp = client.get_experiment_by_name("parasweep")
            ended = f"tags.`{Tag.KIND}` = 'trial' and attributes.status = 'FINISHED'"
            done = [] if exp is None else client.search_runs([exp.experiment_id], filter_string=ended)
            if done:
                break
            time.sleep(0.3)
        server.stop()
        driver.wait(timeout=600)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, 9)
    out, err = out_path.read_text(), err_path.read_text()
    assert driver.returncode == 0, out[-3000:] + err[-3000:]
    said = [line for line in err.splitlines() if "unreachable; results spooled to runs/spool/" in line]
    assert len(said) == 1 and "python -m orchestrator sync" in said[0], err[-3000:]
    assert "Traceback" not in out + err
    spooled = spool_files(work / "runs" / "spool")
    assert spooled, "nothing was spooled"
    headers = [json.loads(p.read_text().splitlines()[0]) for p in spooled]
    assert {h["uri"] for h in headers} == {server.url} and {h["experiment"] for h in headers} == {"parasweep"}
    assert all(p.stat().st_mode & 0o077 == 0 for p in spooled)  # the URI may carry a password

    # still away: the sync says so in one line, exit 2, and keeps every file
    down = _sync_cli(work)
    assert down.returncode == 2, down.stdout + down.stderr
    assert len(down.stderr.strip().splitlines()) == 1 and "unreachable" in down.stderr
    assert spool_files(work / "runs" / "spool") == spooled

    server.start()  # the same store and port
    synced = _sync_cli(work)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert len(synced.stdout.strip().splitlines()) == len(spooled), synced.stdout
    assert spool_files(work / "runs" / "spool") == []
    assert sorted(p.name for p in (work / "runs" / "spool" / SYNCED_DIR).glob("*.jsonl")) == \
        sorted(p.name for p in spooled)

    client = _client(server.url)
    snap = _snapshot(client, "parasweep")
    sweeps = [r for r in snap.values() if r["tags"].get(Tag.KIND) == RunKind.SWEEP.value]
    trials = {n: r for n, r in snap.items() if r["tags"].get(Tag.KIND) == RunKind.TRIAL.value}
    assert len(sweeps) == 1 and len(trials) == 3, sorted(snap)
    sweep = sweeps[0]
    assert (sweep["status"], sweep["tags"][Tag.STATUS]) == ("FINISHED", "ok")
    assert sorted(r["params"]["workload.seed"] for r in trials.values()) == ["0", "1", "2"]
    for name, run in trials.items():
        assert run["tags"][Tag.PARENT] == sweep["id"], name
        assert (run["status"], run["tags"][Tag.STATUS]) == ("FINISHED", "ok"), name
        assert run["artifacts"] >= TRIAL_ARTIFACTS, (name, run["artifacts"])
        assert not is_placeholder(run["id"])
        # every trial, written before, across or after the outage, has the contract's per-point metrics
        # and their series over concurrency
        for metric in CONTRACT_METRICS:
            assert {f"c1/{metric}", f"c4/{metric}"} <= set(run["metrics"]), (name, metric)
            assert [step for step, _ in run["metrics"][metric]] == [1, 4], (name, metric)
    _one_value_per_step(snap)
    # nothing lost: every value that went through the spool is in the store, at its step
    state = json.loads((work / "runs" / "spool" / STATE_FILE).read_text())
    by_id = {r["id"]: r for r in snap.values()}
    created = 0
    for path in (work / "runs" / "spool" / SYNCED_DIR).glob("*.jsonl"):
        for op in map(json.loads, path.read_text().splitlines()[1:]):
            created += op["op"] == "start_run"
            run = by_id[state["ids"].get(op["run"], op["run"])]
            for key, value, _ts, step in op.get("metrics", []):
                assert (step, value if value == value else "nan") in run["metrics"][key], (key, step)
    assert created >= 1, "no trial was created while the server was away"

    again = _sync_cli(work)
    assert again.returncode == 0 and "nothing to replay" in again.stdout, again.stdout + again.stderr
    assert _snapshot(client, "parasweep") == snap
    server.stop()
    _assert_nothing_left(tmp_path, server, [driver.pid])


# -- the spool and its replay, unit by unit, with a real server ---------------------------------------
def _spool_a_sweep(tracker: Tracker, files: Path, server: MlflowServer) -> dict[str, str]:
    """A sweep run and a trial written directly, then the server stops: the trial's later writes and
    a second trial (created while it is away) go to the spool. The run ids by name."""
    sweep = tracker.start_run("sweep", {Tag.KIND: RunKind.SWEEP.value, Tag.STATUS: "running"})
    early = tracker.start_run("#0 early", {Tag.KIND: RunKind.TRIAL.value, Tag.STATUS: "running"}, sweep)
    tracker.log_params(early, {"seed": "0"})
    tracker.log_metrics(early, [("c1/output_tok_s", 10.0, 0), ("output_tok_s", 10.0, 1)])
    server.stop()
    began = time.monotonic()
    tracker.log_metrics(early, [("c4/output_tok_s", 40.0, 0), ("output_tok_s", 40.0, 4)])
    tracker.set_tags(early, {"note": "after the outage"})
    (files / "diagnosis.json").write_text("[]")
    tracker.log_artifact(early, files / "diagnosis.json")
    tracker.finish(early, "ok")
    late = tracker.start_run("#1 late", {Tag.KIND: RunKind.TRIAL.value, Tag.STATUS: "running"}, sweep)
    tracker.log_params(late, {"seed": "1"})
    tracker.log_metrics(late, [("c1/output_tok_s", 11.0, 0), ("output_tok_s", 11.0, 1),
                               ("c1/ttft_p99_ms", float("nan"), 0)])
    scratch = files / "scratch" / "plot.png"
    scratch.parent.mkdir()
    scratch.write_bytes(b"\x89PNG not really")
    tracker.log_artifact(late, scratch, "plots", scratch=True)
    shutil.rmtree(scratch.parent)  # a temporary directory, gone before the sync: the spool kept a copy
    tracker.log_dict(late, {"findings": []}, "extra/findings.json")
    tracker.finish(late, "failed")
    tracker.close_sweep_later(sweep, 0)
    # the first write found the server gone after the client's short retries; the rest went straight
    # to the spool (the design target is a few seconds in all)
    assert time.monotonic() - began < 60
    assert is_placeholder(late) and not is_placeholder(early)
    return {"sweep": sweep, "early": early, "late": late}


@pytest.mark.slow
def test_spool_replay_is_complete_and_crash_safe(tmp_path: Path, server: MlflowServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # the spool is runs/spool under the working directory
    monkeypatch.delenv("PARASWEEP_SPOOL_DIR", raising=False)
    spool = work / "runs" / "spool"
    tracker = Tracker(server.url, "outage-unit")
    ids = _spool_a_sweep(tracker, work, server)
    assert tracker.spooling
    written = close_spools()
    assert written and all(p.parent == spool for p in written)
    assert spool_files(spool) == sorted(written)

    lines = sync_pending(server.url)  # what run.py does at its start: the server is still away
    assert len(lines) == 1 and "unreachable" in lines[0] and "run `python -m orchestrator sync`" in lines[0]
    assert sync_pending("http://127.0.0.1:9") == []  # another server's run.py leaves these files alone

    server.start()
    lines = sync_pending(server.url)
    assert len(lines) == len(written) and all("done, moved to runs/spool/synced/" in line for line in lines)
    # the same process once the server answers again: reads work, and a new run is written directly
    assert {r.info.run_name for r in tracker.children(ids["sweep"])} == {"#0 early", "#1 late"}
    direct = tracker.start_run("#3 direct", {Tag.KIND: RunKind.TRIAL.value})
    tracker.finish(direct, "ok")
    assert not is_placeholder(direct) and spool_files(spool) == []
    client = _client(server.url)
    snap = _snapshot(client, "outage-unit")
    assert set(snap) == {"sweep", "#0 early", "#1 late", "#3 direct"}
    early, late, sweep = snap["#0 early"], snap["#1 late"], snap["sweep"]
    assert early["id"] == ids["early"] and early["metrics"]["output_tok_s"] == [(1, 10.0), (4, 40.0)]
    assert early["tags"]["note"] == "after the outage" and early["artifacts"] == {"diagnosis.json"}
    assert (early["status"], early["tags"][Tag.STATUS]) == ("FINISHED", "ok")
    assert late["tags"][Tag.SPOOL_ID] == ids["late"] and late["tags"][Tag.PARENT] == ids["sweep"]
    assert late["params"] == {"seed": "1"} and late["metrics"]["c1/ttft_p99_ms"] == [(0, "nan")]
    assert late["artifacts"] == {"plots/plot.png", "extra/findings.json"}
    assert (late["status"], late["tags"][Tag.STATUS]) == ("FAILED", "failed")
    # the sweep's end, done by the sync: one trial failed, so the sweep did
    assert (sweep["status"], sweep["tags"][Tag.STATUS]) == ("FAILED", "failed")

    # a sync that "crashed": every write already in the server, but its progress lost (the worst
    # case: nothing recorded), or recorded up to just before the late trial's creation
    ops = {p.name: p.read_text().splitlines()[1:] for p in (spool / SYNCED_DIR).glob("*.jsonl")}
    late_file = next(name for name, lines in ops.items() if ids["late"] in lines[0])
    for rewind in ("nothing recorded", "before the late trial"):
        for path in (spool / SYNCED_DIR).iterdir():
            os.replace(path, spool / path.name)  # the files and the scratch copies beside them
        state = json.loads((spool / STATE_FILE).read_text())
        if rewind == "nothing recorded":
            state = {"applied": {}, "ids": {}}
        else:  # the files before it applied, the late trial's own not begun (nor its creation recorded)
            state["applied"] = {name: len(lines) for name, lines in ops.items() if name < late_file}
            state["ids"].pop(ids["late"])
        (spool / STATE_FILE).write_text(json.dumps(state))
        report = sync_spool()
        assert report.exit_code == 0, report
        assert "1 run(s) found already created" in " ".join(report.lines) and \
            "0 run(s) created" in report.lines[0], report.lines
        assert _snapshot(client, "outage-unit") == snap, rewind

    # a second sync has nothing to do and changes nothing
    assert sync_spool().lines == [] and _snapshot(client, "outage-unit") == snap

    # the automatic path: a spool left behind is replayed by the next run.py against that server
    server.stop()
    other = Tracker(server.url, "outage-unit")
    later = other.start_run("#2 later", {Tag.KIND: RunKind.TRIAL.value, Tag.STATUS: "running"})
    other.log_metrics(later, [("c1/output_tok_s", 12.0, 0)])
    other.finish(later, "ok")
    close_spools()
    assert is_placeholder(later) and spool_files(spool)
    server.start()
    result = run_cli(["model=tiny-test", "parallelism=tp1", "workload=tiny", f"tracking.uri={server.url}"],
                     work, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "done, moved to runs/spool/synced/" in result.stdout + result.stderr  # it says what it did
    assert spool_files(spool) == []
    after = _snapshot(client, "outage-unit")
    assert after["#2 later"]["metrics"] == {"c1/output_tok_s": [(0, 12.0)]}
    assert {k: v for k, v in after.items() if k != "#2 later"} == snap
    server.stop()
    _assert_nothing_left(tmp_path, server, [])


# -- what counts as "unreachable" ----------------------------------------------------------------------
class _Answering:
    """A socket in this process that answers every HTTP request with one status and an empty body:
    a gateway whose server is gone (5xx), or a server refusing the request (4xx)."""

    def __init__(self, status: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)  # accept() wakes up to see the test is over
        self.stop = threading.Event()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply = f"HTTP/1.1 {status} Status {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                with contextlib.suppress(OSError):
                    while b"\r\n\r\n" not in data:  # the request's head; a body (POST) is not read
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    conn.sendall(self.reply.encode())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sock.close()


# a gateway error takes the client's retries (seconds): with the slow tests
@pytest.mark.parametrize(("status", "spooled"), [pytest.param(503, True, marks=pytest.mark.slow),
                                                 pytest.param(502, True, marks=pytest.mark.slow),
                                                 (403, False), (400, False)])
def test_only_an_absent_server_is_spooled(status: int, spooled: bool, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway error (the server behind a proxy is gone) is spooled like a refused connection; a 4xx
    is an answer about the request, raised to the caller, and nothing is spooled."""
    monkeypatch.setenv("PARASWEEP_SPOOL_DIR", str(tmp_path / "spool"))
    gateway = _Answering(status)
    url = gateway.url
    try:
        began = time.monotonic()
        if spooled:
            tracker = Tracker(url, "gateway")
            run_id = tracker.start_run("a run", {Tag.KIND: RunKind.TRIAL.value})
            tracker.log_metrics(run_id, [("x", 1.0, 0)])
            close_spools()
            assert is_placeholder(run_id) and len(spool_files(tmp_path / "spool")) == 1
            assert time.monotonic() - began < 60  # the client's short retries, not its minutes-long default
        else:
            with pytest.raises(Exception) as raised:
                Tracker(url, "gateway")
            assert unreachable(raised.value) == ""
            assert spool_files(tmp_path / "spool") == []
    finally:
        gateway.close()


# -- the spool file and the command's one-line errors (no server needed) -------------------------------
def test_spool_file_is_locked_while_written_and_a_cut_short_write_is_ignored(tmp_path: Path) -> None:
    from orchestrator.store.spool import SpoolWriter, read_spool_file

    writer = SpoolWriter(tmp_path, "http://user:secret@127.0.0.1:9", "http://user:***@127.0.0.1:9", "exp")
    writer.append({"op": "set_tags", "run": "r1", "tags": {"a": "1"}})
    assert read_spool_file(writer.path).live  # its writer still has it: a sync leaves it alone
    writer.close()
    with writer.path.open("a") as f:
        f.write('{"op": "set_tags", "run": "r1", "ta')  # a write cut short by a crash: it never returned
    spool = read_spool_file(writer.path)
    assert not spool.live and spool.ops == [{"op": "set_tags", "run": "r1", "tags": {"a": "1"}}]
    assert spool.uri == "http://user:secret@127.0.0.1:9" and spool.header["uri_shown"] == "http://user:***@127.0.0.1:9"
    assert writer.path.stat().st_mode & 0o077 == 0


def test_sync_command_bad_uri_and_empty_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.__main__ import main

    monkeypatch.setenv("PARASWEEP_SPOOL_DIR", str(tmp_path / "spool"))
    assert main(["sync", "--tracking-uri", "ftp://user:pw@host/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tracking-uri=ftp://user:***@host/x" in err[0]
    assert "valid: the http(s) URL" in err[0]
    assert main(["sync"]) == 0
    assert "nothing to replay" in capsys.readouterr().out
