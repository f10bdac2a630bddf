"""A dead, frozen or faulty engine during a trial: noticed in seconds, the trial failed cleanly (records
kept, error.txt, diagnosis.json, the MLflow run FAILED), the sweep going on with its other trials, and
no process left behind.

* ``/health`` prober (orchestrator/process/health.py) against in-process sockets: refused connections
  count after a short streak, unanswered probes only after the longer patience, one answer clears.
* A trial (no Hydra) whose engine is SIGKILLed, then SIGSTOPped, by the test in the middle of a long
  point: the process exit, then the unanswered ``/health``, ends it.
* One real sweep (Hydra, local Ray, sqlite MLflow) where each trial carries one of the simulated
  engine's faults (``engine.sim_faults.*``), next to a trial without any.

Bounds on time are generous (a busy 2-core machine); the design targets are ~0.2 s after an exit,
~2 s of refused connections and 30 s of unanswered probes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.process.health import HealthProber
from orchestrator.store.tracking import Tracker
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan
from orchestrator.trial.run import TrialOutcome, TrialRunSettings, execute_trial
from tests.conftest import NO_DRAWING, run_cli, sqlite_store
from vocab.hardware import load_hardware
from vocab.records import read_records
from vocab.status import RunKind, Tag, TrialStatus


def _leftovers(marker: Path) -> list[str]:
    """Processes whose command line names ``marker`` (the engine's names its trial directory)."""
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if str(marker) in cmdline:
            left.append(f"{p.pid}: {cmdline[:200]}")
    return left


def _no_leftovers(marker: Path, timeout_s: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _leftovers(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


# -- the /health prober, against sockets in this process ------------------------------------------
class _Health:
    """A one-thread HTTP server that answers every request with ``status`` (changeable)."""

    def __init__(self) -> None:
        self.status = 200
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" % self.status)


@pytest.fixture
def health_server() -> Iterator[_Health]:
    server = _Health()
    try:
        yield server
    finally:
        server.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (close alone does not)
        server.sock.close()
        server.thread.join(timeout=5)
        assert not server.thread.is_alive()


def _wait_verdict(prober: HealthProber, timeout_s: float = 15.0) -> str | None:
    deadline = time.monotonic() + timeout_s
    while prober.verdict is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return prober.verdict


def test_the_point_timeout_counts_from_the_points_first_question_not_from_its_set_up(tmp_path: Path) -> None:
    # the watch is made before the point's set-up (cache flush, the energy counter, the load
    # generator's first imports) and first asked once requests are being sent: only the latter counts
    import sys

    from orchestrator.process.server import ServerProcess
    from orchestrator.trial.session import EngineWatch

    with ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "server.log",
                       "127.0.0.1", 9) as server:
        watch = EngineWatch(server, None, point_timeout_s=0.3)
        time.sleep(0.5)  # a set-up longer than the limit
        assert watch() is None and not watch.timed_out
        time.sleep(0.5)
        assert watch() == "point timed out after 0.3 s (workload.point_timeout_s)" and watch.timed_out


def test_refused_connections_are_noticed_after_a_short_streak() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prober = HealthProber(f"http://127.0.0.1:{port}", period_s=0.05, refused_streak=3).start()
    try:
        verdict = _wait_verdict(prober)
    finally:
        prober.stop()
    assert verdict is not None and verdict.startswith("connections refused for ")


def test_unanswered_probes_count_only_after_the_patience() -> None:
    with socket.socket() as s:  # listens (the kernel completes the handshake) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        started = time.monotonic()
        prober = HealthProber(f"http://127.0.0.1:{s.getsockname()[1]}", period_s=0.05, timeout_s=0.2,
                              patience_s=1.0).start()
        try:
            verdict = _wait_verdict(prober)
        finally:
            prober.stop()
    assert verdict is not None and verdict.startswith("no answer for ")
    assert verdict.endswith("(last: no answer within 0.2 s)")
    assert time.monotonic() - started >= 1.0  # never before the patience: a busy engine is slow


def test_an_error_status_counts_as_unanswered_and_one_answer_clears(health_server: _Health) -> None:
    health_server.status = 503  # what SGLang answers when its own 20 s check failed
    prober = HealthProber(health_server.url, period_s=0.05, patience_s=0.5).start()
    try:
        assert _wait_verdict(prober) is not None
        assert prober.verdict is not None and prober.verdict.endswith("(last: HTTP 503)")
        health_server.status = 200
        deadline = time.monotonic() + 15
        while prober.verdict is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert prober.verdict is None
    finally:
        prober.stop()


# -- a trial whose engine dies or freezes in the middle of a point ---------------------------------
def _long_trial_cfg(tmp_path: Path) -> ParasweepConf:
    """One closed-loop point of 40 requests x 400 tokens at a tenth of the simulated engine's speed:
    minutes of load, so an early end can only be the fault's."""
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.engine.time_scale = 0.1
    cfg.engine.stop_grace_s = 2.0
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("rtx-pro-6000-pcie-x8")
    cfg.workload.concurrency = [4]
    cfg.workload.input_len, cfg.workload.output_len = 16, 400
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 10, 0
    cfg.tracking.uri = sqlite_store(tmp_path / "mlflow.db")
    return cfg


def _run_and_hit(tmp_path: Path, cfg: ParasweepConf, sig: signal.Signals, after_records: int
                 ) -> tuple[TrialOutcome, float, float]:
    """Run the trial; once ``after_records`` requests are on disk, send ``sig`` to the engine's process
    group. Returns the outcome, when the signal went and when the trial returned (monotonic)."""
    trial_dir = tmp_path / "trial"
    plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(0, "fault", trial_dir, ("fault",)))
    sent: list[float] = []

    def hit() -> None:
        pgid_file, records = trial_dir / "server" / "server.pgid", trial_dir / "records" / "requests.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if pgid_file.exists() and records.exists() and len(list(read_records(records))) >= after_records:
                os.killpg(int(pgid_file.read_text()), sig)
                sent.append(time.monotonic())
                return
            time.sleep(0.05)

    hitter = threading.Thread(target=hit, daemon=True)
    hitter.start()
    outcome = execute_trial(plan, TrialRunSettings(cfg.tracking.uri, "faults", own_progress_view=False))
    returned = time.monotonic()
    hitter.join(timeout=5)
    assert sent, f"the engine was not hit: {outcome.status} {outcome.error[:500]}"
    return outcome, sent[0], returned


def _assert_failed_cleanly(tmp_path: Path, outcome: TrialOutcome, first_line: str) -> None:
    trial_dir = tmp_path / "trial"
    assert outcome.status is TrialStatus.FAILED
    assert outcome.error.splitlines()[0] == first_line
    assert outcome.error.splitlines()[-1] == first_line  # where the sweep's summary looks
    assert "engine log tail" in outcome.error
    assert (trial_dir / "error.txt").read_text().splitlines()[0] == first_line
    findings = json.loads((trial_dir / "diagnosis.json").read_text())
    assert findings[0]["id"] == "trial_failed" and first_line in findings[0]["evidence"]
    assert (trial_dir / "records" / "requests.parquet").exists()
    run = Tracker(sqlite_store(tmp_path / "mlflow.db"), "faults").client.get_run(outcome.run_id)
    assert run.info.status == "FAILED" and run.data.tags[Tag.STATUS] == "failed"
    # the tag keeps the message's end (the recorder's limit): the line repeated there
    assert run.data.tags[Tag.ERROR].splitlines()[-1] == first_line
    # the point cut short was logged, marked invalid
    assert run.data.metrics["c4/valid"] == 0 and run.data.metrics["c4/num_requests"] > 0
    assert _no_leftovers(tmp_path) == []


@pytest.mark.slow
def test_engine_killed_mid_point_fails_the_trial_within_seconds(tmp_path: Path) -> None:
    cfg = _long_trial_cfg(tmp_path)
    outcome, killed, returned = _run_and_hit(tmp_path, cfg, signal.SIGKILL, after_records=4)
    assert returned - killed < 20, f"the trial took {returned - killed:.0f} s to notice the exit"
    records = list(read_records(tmp_path / "trial" / "records" / "requests.jsonl"))
    done = [r for r in records if r.error is None]
    assert len(done) >= 4  # every request finished before the kill is kept
    # the rest of the point was not burnt on refused connections: at most one per sender (of 4)
    assert sum(1 for r in records if r.error_kind == "connect") <= 4
    assert all(r.error_kind in ("disconnected", "connect", "aborted") for r in records if r.error)
    first = f"engine exited with code -9 (SIGKILL) during point c4 after {len(done)} of 40 requests"
    _assert_failed_cleanly(tmp_path, outcome, first)


@pytest.mark.slow
def test_frozen_engine_is_noticed_by_its_health(tmp_path: Path) -> None:
    """SIGSTOP: the process is alive, its port open, nothing answers; stalls are left at their
    default (300 s) and the point timeout is off, so only the /health patience (30 s) can end it."""
    cfg = _long_trial_cfg(tmp_path)
    cfg.workload.point_timeout_s = None
    outcome, frozen, returned = _run_and_hit(tmp_path, cfg, signal.SIGSTOP, after_records=1)
    assert 25 < returned - frozen < 90, f"noticed after {returned - frozen:.0f} s"
    first = outcome.error.splitlines()[0]
    assert first.startswith("engine not answering /health: no answer for ")
    records = list(read_records(tmp_path / "trial" / "records" / "requests.jsonl"))
    aborted = [r for r in records if r.error_kind == "aborted"]
    assert len(aborted) == 4  # the four in flight, each kept with the reason
    assert all(r.error == "aborted: " + first.split(" during point")[0] for r in aborted)
    _assert_failed_cleanly(tmp_path, outcome, first)


# -- the simulated engine's faults in one sweep ----------------------------------------------------
# Each trial's fault is one engine.sim_faults value; the timeouts are sweep-wide: long enough for a
# healthy engine to start and serve its tiny points with up to eight trials (and other tests) starting
# at once on two cores, so that only the faults decide which trials fail; the point timeout (20 s) below
# the health prober's 30 s, so a hung engine is always caught by the former.
FAULTS = {
    "none": "{}",
    "crash": "{crash_after_requests:5}",
    "hang": "{hang_after_requests:5}",
    # 0.1: two of c1's nine streams stall (arrivals 3 and 7 with seed 0), each held until the client's
    # 5 s stall timeout, well inside the 20 s point timeout; 0.2 stalled three, 15-18 s of a point's 20,
    # which a busy machine could push past the limit
    "stall": "{stall_stream_fraction:0.1}",
    "hang_before_ready": "{hang_before_ready:true}",
    "startup_delay": "{startup_delay_s:2.0}",
    "oom": "{oom_at_start:true}",
    "http_error": "{http_error_fraction:0.2}",
    "malformed": "{malformed_sse_fraction:0.2}",
    "cut": "{cut_stream_fraction:0.2}",
}
# in real time: the stall timeout counts the engine's seconds and the point timeout the wall's, and
# the timings above are the wall's
SWEEP = ["model=tiny-test", "workload=tiny", "parallelism=tp1", "ray.num_cpus=2", "engine.time_scale=1",
         *NO_DRAWING, "workload.requests_per_concurrency=5", "workload.output_len=32",
         "workload.stall_timeout_s=5", "workload.point_timeout_s=20", "engine.startup_timeout_s=60",
         "engine.stop_grace_s=2", "engine.sim_faults=" + ",".join(FAULTS.values())]


def _fault_of(label: str) -> str:
    """The FAULTS key of a trial from its label (``engine.sim_faults={oom_at_start:True}``: Hydra
    writes the value back in its own spelling)."""
    for fault, value in FAULTS.items():
        key = value.strip("{}").split(":")[0]
        if (key and "{" + key + ":" in label) or (not key and label.endswith("={}")):
            return fault
    raise AssertionError(f"no fault matches the trial label {label!r}")


@pytest.fixture(scope="module")
def fault_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    workdir = tmp_path_factory.mktemp("faults")
    started = time.monotonic()
    result = run_cli(["-m", *SWEEP], workdir, timeout=900, store=True)
    took = time.monotonic() - started
    store = Tracker(f"sqlite:///{workdir / 'runs' / 'mlflow.db'}", "parasweep").client
    exp = store.get_experiment_by_name("parasweep")
    runs = store.search_runs([exp.experiment_id]) if exp is not None else []
    trials = {}
    for run in runs:
        if run.data.tags.get(Tag.KIND) != RunKind.TRIAL.value:
            continue
        trials[_fault_of(run.data.tags[Tag.OVERRIDES])] = run
    return {"workdir": workdir, "result": result, "trials": trials, "took": took,
            "leftovers": _no_leftovers(workdir)}


def _trial_dir(sweep: dict[str, object], fault: str) -> Path:
    return Path(sweep["trials"][fault].data.tags[Tag.TRIAL_DIR])  # type: ignore[index]


def _records(sweep: dict[str, object], fault: str) -> list:
    return list(read_records(_trial_dir(sweep, fault) / "records" / "requests.jsonl"))


@pytest.mark.slow
def test_sweep_goes_on_past_its_faulty_trials(fault_sweep: dict[str, object]) -> None:
    result, trials = fault_sweep["result"], fault_sweep["trials"]
    assert set(trials) == set(FAULTS), result.stdout + result.stderr  # type: ignore[union-attr]
    status = {k: run.data.tags[Tag.STATUS] for k, run in trials.items()}  # type: ignore[union-attr]
    failed = {"crash", "hang", "hang_before_ready", "oom"}
    expected = {k: "failed" if k in failed else "ok" for k in FAULTS}
    why = {k: trials[k].data.tags.get(Tag.ERROR, "").splitlines()[-1:]  # type: ignore[union-attr]
           for k in FAULTS if status[k] != expected[k]}
    assert status == expected, f"unexpected outcomes, with each trial's last error line: {why}"
    assert result.returncode == 1  # type: ignore[union-attr]
    assert "Traceback" not in result.stderr  # type: ignore[union-attr]
    assert fault_sweep["leftovers"] == []


@pytest.mark.slow
def test_crash_and_hang_fail_their_trial_with_one_clear_line(fault_sweep: dict[str, object]) -> None:
    trials = fault_sweep["trials"]
    crash = trials["crash"].data.tags[Tag.ERROR].splitlines()[-1]  # type: ignore[index]
    assert crash.startswith("engine exited with code ") and " during point c1 after " in crash
    records = _records(fault_sweep, "crash")
    assert sum(1 for r in records if r.error is None) >= 3  # what ran before the crash is kept
    hang = trials["hang"].data.tags[Tag.ERROR].splitlines()[-1]  # type: ignore[index]
    # c1 keeps one request in flight: the one the timeout cut short; the hung ones before it stalled
    assert hang == "point c1 timed out after 20 s (workload.point_timeout_s); 1 request unanswered"
    hung = Counter(r.error for r in _records(fault_sweep, "hang") if r.error)
    assert hung["aborted: point timed out after 20 s (workload.point_timeout_s)"] == 1
    assert hung["stalled: no data for 5 s (workload.stall_timeout_s)"] >= 1
    for fault in ("crash", "hang"):
        trial_dir = _trial_dir(fault_sweep, fault)
        assert (trial_dir / "error.txt").exists() and (trial_dir / "records" / "requests.parquet").exists()
        assert trials[fault].info.status == "FAILED"  # type: ignore[index]


@pytest.mark.slow
def test_start_up_faults(fault_sweep: dict[str, object]) -> None:
    trials = fault_sweep["trials"]
    never = (_trial_dir(fault_sweep, "hang_before_ready") / "error.txt").read_text()
    assert never.startswith("engine not ready after 60 s (engine.startup_timeout_s)")
    assert never.rstrip().endswith("this server never becomes ready")  # the engine's log says why
    oom = (_trial_dir(fault_sweep, "oom") / "error.txt").read_text()
    assert oom.startswith("engine exited with code 1 before it was ready")
    assert "CUDA out of memory" in oom  # the engine's own OOM line, from its log tail
    assert trials["oom"].info.status == trials["hang_before_ready"].info.status == "FAILED"  # type: ignore[index]
    slow = trials["startup_delay"]  # type: ignore[index]
    assert slow.data.metrics["c4/completed"] == 20  # a slow start within the timeout is no fault


@pytest.mark.slow
def test_stream_faults_are_counted_per_point_and_the_trial_stays_ok(fault_sweep: dict[str, object]) -> None:
    """A fraction of broken streams is the engine's behaviour under test, not a failed trial: each
    point completes, its errors are counted by kind, and a point is invalid only if most failed."""
    trials = fault_sweep["trials"]
    kinds = {"stall": "timeout", "http_error": "http_5xx", "malformed": "malformed", "cut": "disconnected"}
    for fault, kind in kinds.items():
        metrics = trials[fault].data.metrics  # type: ignore[index]
        errors = metrics["c1/errors"] + metrics["c4/errors"]
        assert errors > 0 and metrics["c1/errors_" + kind] + metrics["c4/errors_" + kind] == errors, fault
        assert metrics["c4/num_requests"] == 20, fault  # every request was sent and recorded
        counted = Counter(r.error_kind for r in _records(fault_sweep, fault) if r.error and not r.warmup)
        assert counted == {kind: errors}, fault
    stalled = [r for r in _records(fault_sweep, "stall") if r.error_kind == "timeout"]
    assert all(r.error == "stalled: no data for 5 s (workload.stall_timeout_s)" for r in stalled)
    healthy = trials["none"].data.metrics  # type: ignore[index]
    assert healthy["c1/errors"] == healthy["c4/errors"] == 0
