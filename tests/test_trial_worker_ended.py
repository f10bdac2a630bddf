"""A trial whose Ray worker is ended under it is closed ``killed``, never ``failed``.

When the raylet goes (the sweep's driver was killed), Ray ends each of its workers by raising
``SystemExit`` in the worker's main thread. Here a signal handler raises it in this process's main
thread in the middle of a prediction's load, the same way, without Ray: the run must be closed with the
status and reason of a kill, and the exit must go on up (the worker is leaving).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.store.tracking import Tracker
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan
from orchestrator.trial.run import TrialRunSettings, execute_trial
from tests.conftest import sqlite_store
from vocab.hardware import load_hardware
from vocab.status import Tag, TrialStatus


def _long_prediction(tmp_path: Path) -> ParasweepConf:
    """A prediction whose points take seconds of CPU in the simulator."""
    cfg = ParasweepConf()
    cfg.predict = True
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("rtx-pro-6000-pcie-x8")
    cfg.workload.concurrency = [64, 128, 256]
    cfg.workload.input_len, cfg.workload.output_len = 16, 256
    cfg.tracking.uri = sqlite_store(tmp_path / "mlflow.db")
    return cfg


def _in_the_simulation(frame: FrameType | None) -> bool:
    """Whether the main thread is computing the load (in ``drive_load``) and not writing to the store.

    An exit that lands inside a store write leaves SQLite's lock with the interrupted connection, and
    the trial's last writes then wait for it: the run stays ``running`` until the next run closes it
    as stale. That is the other outcome the live kill test accepts; this test is about the first."""
    names = []
    while frame is not None:
        names.append((frame.f_code.co_name, frame.f_code.co_filename))
        frame = frame.f_back
    in_load = any(name == "drive_load" for name, _ in names)
    writing = any("sqlalchemy" in path or "mlflow" in path or path.endswith("tracking.py")
                  for _, path in names)
    return in_load and not writing


def test_a_worker_ended_with_system_exit_closes_its_trial_killed(tmp_path: Path) -> None:
    cfg = _long_prediction(tmp_path)
    plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(0, "ended", tmp_path / "trial", ("ended",)))
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main  # signals reach the main thread only
    done = threading.Event()

    def end_the_worker(_signum: int, frame: FrameType | None) -> None:
        if _in_the_simulation(frame):
            done.set()
            sys.exit(1)

    def keep_asking() -> None:
        while not done.wait(0.005):
            signal.pthread_kill(main, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, end_the_worker)
    sender = threading.Thread(target=keep_asking, daemon=True)
    try:
        sender.start()
        with pytest.raises(SystemExit):
            execute_trial(plan, TrialRunSettings(cfg.tracking.uri, "ended", own_progress_view=False))
    finally:
        done.set()
        sender.join(timeout=5)
        signal.signal(signal.SIGUSR1, previous)
    tracker = Tracker(cfg.tracking.uri, "ended")
    (run,) = tracker.client.search_runs([tracker.experiment_id])
    assert run.data.tags[Tag.STATUS] == TrialStatus.KILLED.value and run.info.status == "KILLED"
    assert run.data.tags[Tag.ERROR] == "its worker was ended (the sweep's driver or Ray went away)"
