"""A trial whose Ray worker is ended under it is closed ``killed``, never ``failed``.

When the raylet goes (the sweep's driver was killed), Ray ends each of its workers by raising
``SystemExit`` in the worker's main thread. Here a signal handler raises it in this process's main
thread in the middle of a prediction's load, the same way, without Ray, either while the load is being
computed or inside a store write: the run must be closed with the status and reason of a kill, and the
exit must go on up (the worker is leaving).
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
    """A prediction of four points, each seconds of CPU in the simulator and one store write at its end."""
    cfg = ParasweepConf()
    cfg.predict = True
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("rtx-pro-6000-pcie-x8")
    cfg.workload.concurrency = [4, 64, 128, 256]
    cfg.workload.input_len, cfg.workload.output_len = 16, 256
    cfg.tracking.uri = sqlite_store(tmp_path / "mlflow.db")
    return cfg


def _where(frame: FrameType | None) -> str:
    """``computing``: the main thread is in the load and not in the store; ``writing``: it is inside a
    point's SQL statement; else ``elsewhere``."""
    names, paths = [], []
    while frame is not None:
        names.append(frame.f_code.co_name)
        paths.append(frame.f_code.co_filename)
        frame = frame.f_back
    in_store = any("sqlalchemy" in path or "mlflow" in path or path.endswith("tracking.py") for path in paths)
    if "drive_load" in names and not in_store:
        return "computing"
    if "log_point" in names and any(name.startswith("do_execute") for name in names):
        return "writing"
    return "elsewhere"


# "writing": the statement the exit interrupts stays referenced from the exit's traceback, and with it
# SQLite's lock on the store: unless the trial lets go of it, its closing writes wait out the busy
# timeout and fail (about 110 s) and the run is left running
@pytest.mark.parametrize("lands", ["computing", "writing"])
def test_a_worker_ended_with_system_exit_closes_its_trial_killed(tmp_path: Path, lands: str) -> None:
    cfg = _long_prediction(tmp_path)
    plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(0, "ended", tmp_path / "trial", ("ended",)))
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main  # signals reach the main thread only
    done = threading.Event()

    def end_the_worker(_signum: int, frame: FrameType | None) -> None:
        if _where(frame) == lands:
            done.set()
            sys.exit(1)

    # a store write lasts milliseconds: asked that often, an exit lands in one of the four
    every_s = 0.0005 if lands == "writing" else 0.005

    def keep_asking() -> None:
        while not done.wait(every_s):
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
