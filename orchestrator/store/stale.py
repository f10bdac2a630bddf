"""Close the runs that a killed driver left ``running``: one job, done at the start of the next run.

A driver killed outright (``kill -9``, the OOM killer) closes nothing: its sweep run and the trial that
was running stay ``parasweep.status=running`` in MLflow for ever. Every sweep run records its driver
(host, pid namespace, pid, and the process's start time: :func:`driver_tags`); a trial run is judged
by its own driver tags if it has them, else by its parent sweep run's. A run is stale only when that
driver was on this host, in this pid namespace, and is gone: the pid no longer runs, or runs a process
started at another time (a reused pid). A run from another host is left alone and mentioned, as is one
that names no driver (an older parasweep).

For each stale trial: its engine's process groups, named by ``server/*.pgid`` in the trial directory,
are stopped if they still run and really are that trial's engine; what the trial directory holds is
uploaded (the request records as Parquet, the server log with secrets taken out, the progress file;
the complete load points' metrics were logged as each point ended); then the run is closed as
killed, saying why. Stale sweep runs are closed the same way, after their trials.

It lives at the top of ``orchestrator`` (not in ``launcher``/``trial``) because ``sweep.ensure_started``
calls it, and the trial stages import ``sweep``: using the trial recorder from here would close an
import loop, so the few lines that upload the trial's files are written out here, to the same
artifact paths the recorder uses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from orchestrator.process.guardian import engine_processes, stop_processes
from orchestrator.redact import redact_text, secret_values
from orchestrator.store.tracking import Tracker
from vocab.status import RunKind, Tag, TrialStatus

log = logging.getLogger("parasweep")

START_TIME_SLACK_S = 1.0  # a process's start time is known to a clock tick; a reused pid differs by more


def driver_tags() -> dict[str, str]:
    """This process as the driver of the runs it creates."""
    me = psutil.Process()
    return {Tag.DRIVER_HOST: socket.gethostname(), Tag.DRIVER_PID_NAMESPACE: _pid_namespace(),
            Tag.DRIVER_PID: str(me.pid), Tag.DRIVER_STARTED: f"{me.create_time():.2f}"}


def _pid_namespace() -> str:
    """Which pids this process sees: two containers may share a host name but not their pids, and a
    pid from another namespace must not be judged here."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:  # not Linux: the host name alone
        return ""


@dataclass(frozen=True)
class Driver:
    host: str
    pid_namespace: str
    pid: int
    started: float

    @classmethod
    def of(cls, tags: dict[str, str]) -> Driver | None:
        try:
            return cls(tags[Tag.DRIVER_HOST], tags.get(Tag.DRIVER_PID_NAMESPACE, ""),
                       int(tags[Tag.DRIVER_PID]), float(tags[Tag.DRIVER_STARTED]))
        except (KeyError, ValueError):
            return None

    @property
    def here(self) -> bool:
        """Its pid means the same process here: same host name and pid namespace."""
        return self.host == socket.gethostname() and self.pid_namespace == _pid_namespace()

    def gone(self) -> bool:
        """Judged here: the pid runs no more, or runs another process (a zombie counts as gone)."""
        try:
            proc = psutil.Process(self.pid)
            return (abs(proc.create_time() - self.started) > START_TIME_SLACK_S
                    or proc.status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:  # not ours to inspect: it runs
            return False

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host}"


def close_stale_runs(tracker: Tracker, say: Callable[[str], None] = print) -> list[str]:
    """Close this experiment's runs whose driver is gone (trials first, then sweeps); ``say`` one line
    per closed run, and one for the runs left alone. Returns the ids of the closed runs."""
    if tracker.experiment_id is None:  # a tracking server known to be away: nothing to read now
        return []
    try:
        running = tracker.client.search_runs(
            [tracker.experiment_id], filter_string=f"tags.`{Tag.STATUS}` = '{TrialStatus.RUNNING.value}'",
            max_results=50000)
    except Exception as exc:  # housekeeping: the new run goes on, and the next one tries again
        say(f"parasweep: warning: could not look for stale runs: {_first_line(exc)}")
        return []
    parents: dict[str, dict[str, str]] = {}

    def driver_of(run: Any) -> Driver | None:
        own = Driver.of(run.data.tags)
        parent_id = run.data.tags.get(Tag.PARENT)
        if own is not None or not parent_id:
            return own
        if parent_id not in parents:
            try:
                parents[parent_id] = tracker.client.get_run(parent_id).data.tags
            except Exception:  # a parent deleted by hand: nothing to judge by
                parents[parent_id] = {}
        return Driver.of(parents[parent_id])

    closed: list[str] = []
    elsewhere: set[str] = set()
    unknown = left = 0
    # trials before sweeps, so that a sweep is never closed while its trial still says running
    for run in sorted(running, key=lambda r: r.data.tags.get(Tag.KIND) == RunKind.SWEEP.value):
        driver = driver_of(run)
        if driver is None:
            unknown += 1
            continue
        if not driver.here:  # its pid means nothing here
            elsewhere.add(driver.host)
            left += 1
            continue
        if not driver.gone():
            continue  # a sweep running right now beside this one
        reason = f"closed by the next run: its driver ({driver}) was gone"
        try:
            stopped = close_run(tracker, run, reason)
        except Exception as exc:  # the new run goes on; this one stays as it was, and is tried next time
            say(f"parasweep: warning: could not close stale run {run.info.run_id}: {_first_line(exc)}")
            continue
        closed.append(run.info.run_id)
        engine = f"; stopped its engine ({stopped} process(es))" if stopped else ""
        say(f"parasweep: closed {_what(run)} {run.info.run_id} as killed: its driver ({driver}) was "
            f"gone{engine}")
    if left:
        say(f"parasweep: {left} run(s) marked running by a driver on another host or in another "
            f"container ({', '.join(sorted(elsewhere))}) left as they are")
    if unknown:
        say(f"parasweep: {unknown} run(s) marked running name no driver (an older parasweep); left as "
            "they are")
    return closed


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _what(run: Any) -> str:
    tags = run.data.tags
    if tags.get(Tag.KIND) == RunKind.SWEEP.value:
        return "sweep run"
    return f"trial run #{tags.get(Tag.TRIAL_NUM, '?')} {tags.get(Tag.OVERRIDES, '')}".rstrip()


def close_run(tracker: Tracker, run: Any, reason: str) -> int:
    """Stop the run's leftover engine, upload what its trial directory holds, close it as killed with
    ``reason``; the number of engine processes stopped."""
    run_id, tags = run.info.run_id, run.data.tags
    trial_dir = Path(tags[Tag.TRIAL_DIR]) if tags.get(Tag.TRIAL_DIR) else None
    stopped = 0
    if trial_dir is not None and trial_dir.is_dir():
        # written by orchestrator/process/server.py: the engine's, and its DP replicas' and router's
        for pgid_file in sorted((trial_dir / "server").glob("*.pgid")):
            with contextlib.suppress(OSError, ValueError):
                stopped += len(stop_processes(engine_processes(int(pgid_file.read_text()), trial_dir)))
        upload_partial(tracker, run_id, trial_dir)
    note = {Tag.NOTE: reason} if not tags.get(Tag.NOTE) else {}
    tracker.set_tags(run_id, {Tag.STALE_CLOSED: reason, Tag.ERROR: reason, **note})
    tracker.finish(run_id, TrialStatus.KILLED.value)
    return stopped


def upload_partial(tracker: Tracker, run_id: str, trial_dir: Path) -> None:
    """What a trial keeps on disk as it runs, to the artifact paths its recorder would have used;
    each part on its own, so one that cannot be read does not keep the others."""
    from vocab.records import read_records, records_to_dataframe

    def records() -> None:
        jsonl = trial_dir / "records" / "requests.jsonl"
        if jsonl.exists():
            out = jsonl.with_suffix(".parquet")
            records_to_dataframe(list(read_records(jsonl))).to_parquet(out, index=False)
            tracker.log_artifact(run_id, out, "records")

    def server_log() -> None:
        source = trial_dir / "server" / "server.log"
        if source.exists():  # the engine may echo its arguments: upload a copy with secrets taken out
            upload = trial_dir / "server" / "redacted" / "server.log"
            upload.parent.mkdir(parents=True, exist_ok=True)
            upload.write_text(redact_text(source.read_text(errors="replace"), _secrets(trial_dir)))
            tracker.log_artifact(run_id, upload, "server")
        for name in ("argv.json", "server_info.json"):  # written redacted by the trial
            tracker.log_artifact(run_id, trial_dir / "server" / name, "server")

    def progress() -> None:
        tracker.log_artifact(run_id, trial_dir / "progress.json")

    for part in (records, server_log, progress):
        try:
            part()
        except Exception:
            log.exception("could not upload %s of stale run %s", part.__name__, run_id)


def _secrets(trial_dir: Path) -> set[str]:
    """The secret values of the trial's config, as Hydra saved it in the trial directory."""
    try:
        return secret_values(yaml.safe_load((trial_dir / ".hydra" / "config.yaml").read_text()))
    except (OSError, yaml.YAMLError):
        return set()
