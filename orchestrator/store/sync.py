"""``python -m orchestrator sync [--tracking-uri URI]``: replay the spool (``store/spool.py``) into
the MLflow server once it is back; ``run.py`` does the same for its own server when it starts
(:func:`sync_pending`) and again when a sweep ends.

Guarantees (docs/mlflow-layout.md, "When the tracking server goes away"):

- every spooled write is applied once, in the order it was made; the id map and the count of
  applied writes per file are saved after each write, so a sync that stops anywhere (a crash, the
  server going away again) resumes where it stopped;
- the one write that may have reached the server without being counted is harmless to repeat: a run
  is found again by its ``parasweep.spool_id`` tag instead of being created twice, a metric value keeps
  its original timestamp and step (MLflow's SQL store keeps one row per key, timestamp, step and
  value), params, tags, artifacts and statuses overwrite themselves with the same values;
- files whose writer is still running are left for later; a finished file is moved to
  ``runs/spool/synced/``, never deleted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.redact import redact_url
from orchestrator.store.spool import (
    SpoolFile,
    SyncState,
    is_placeholder,
    move_to_synced,
    read_spool_file,
    same_server,
    spool_files,
    spool_root,
    sync_lock,
)
from orchestrator.store.tracking import (
    MLFLOW_STATUS,
    ensure_experiment,
    interrupted_status,
    is_http,
    mlflow_client,
    scrubbed,
    server_answers,
    sweep_status,
    unreachable,
)
from vocab.status import Tag, TrialStatus

SYNC_COMMAND = "python -m orchestrator sync"


class _Unreachable(Exception):
    """The server stopped answering during the sync: stop everything, keep what is left."""

    def __init__(self, server: str, why: str) -> None:
        super().__init__(why)
        self.server = server


class _Waiting(Exception):
    """The write names a run whose creation is in another file not applied yet (later in the order,
    still being written, or stopped): this file waits for that one."""

    def __init__(self, run_id: str, creator: str) -> None:
        super().__init__(f"run {run_id} (created in {creator})")


@dataclass
class _FileRun:
    """One file's replay: where it stands and what it did in this sync."""

    spool: SpoolFile
    target: str
    next_op: int
    created: int = 0
    found: int = 0
    applied: int = 0
    missing: list[str] = field(default_factory=list)
    error: str = ""
    waiting_for: str = ""

    @property
    def done(self) -> bool:
        return self.next_op >= len(self.spool.ops)


@dataclass
class SyncReport:
    lines: list[str]  # one per file
    exit_code: int  # 0 all done (or nothing to do), 1 a write the server refused, 2 server unreachable
    unreachable: str = ""  # the one line saying which server could not be reached, and what waits


class _Replayer:
    """Applies spooled writes to one server with a plain MLflow client (never the Tracker, which would
    spool a failure again)."""

    def __init__(self, target: str, state: SyncState, creators: dict[str, str]) -> None:
        self.target = target
        self.client = mlflow_client(target)
        self.state = state
        self.creators = creators  # placeholder -> the file (name) whose start_run makes it
        self.experiments: dict[str, str] = {}

    def experiment_id(self, name: str) -> str:
        if name not in self.experiments:
            self.experiments[name] = ensure_experiment(self.target, name)
        return self.experiments[name]

    def real_id(self, run_id: str, file: _FileRun) -> str:
        """The server's id of a run named in a spooled write."""
        if not is_placeholder(run_id):
            return run_id
        if run_id in self.state.ids:
            return self.state.ids[run_id]
        creator = self.creators.get(run_id)
        if creator is not None and creator != file.spool.path.name:
            raise _Waiting(run_id, creator)
        found = self.find(run_id, file.spool.experiment)
        if found is None:
            raise LookupError(f"run {run_id} was never created (its start is in no spool file)")
        self.state.ids[run_id] = found
        return found

    def find(self, placeholder: str, experiment: str) -> str | None:
        from mlflow.entities import ViewType

        runs = self.client.search_runs([self.experiment_id(experiment)],
                                       filter_string=f"tags.`{Tag.SPOOL_ID}` = '{placeholder}'",
                                       run_view_type=ViewType.ALL, max_results=2)
        return runs[0].info.run_id if runs else None

    def mapped(self, tags: dict[str, str], file: _FileRun) -> dict[str, str]:
        """Tag values that are placeholders (``mlflow.parentRunId`` of a spooled sweep) -> real ids."""
        return {k: (self.real_id(v, file) if k != Tag.SPOOL_ID and is_placeholder(v) else v)
                for k, v in tags.items()}

    def apply(self, op: dict[str, Any], file: _FileRun) -> None:
        from mlflow.entities import Metric, Param, RunTag

        kind = op["op"]
        if kind == "start_run":
            self.start_run(op, file)
            return
        run_id = self.real_id(op["run"], file)
        if kind == "log_params":
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in op["params"].items()])
        elif kind == "set_tags":
            tags = self.mapped(op["tags"], file)
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        elif kind == "log_metrics":
            self.client.log_batch(run_id, metrics=[Metric(k, float(v), int(ts), int(step))
                                                   for k, v, ts, step in op["metrics"]])
        elif kind == "log_artifact":
            if Path(op["path"]).exists():
                self.client.log_artifact(run_id, op["path"], op.get("artifact_path"))
            else:  # the user removed it: say so, and keep going (the rest of the run is still worth having)
                file.missing.append(op["path"])
        elif kind == "log_dict":
            self.client.log_dict(run_id, op["data"], op["artifact_file"])
        elif kind == "finish":
            self.finish(run_id, op["status"], int(op["time"]))
        elif kind == "close_sweep":
            self.close_sweep(run_id, int(op["code"]), int(op["time"]), file.spool.experiment)
        else:
            raise ValueError(f"unknown spooled write {kind!r}")

    def start_run(self, op: dict[str, Any], file: _FileRun) -> None:
        placeholder = op["run"]
        if placeholder in self.state.ids:
            return
        experiment = self.experiment_id(file.spool.experiment)
        found = self.find(placeholder, file.spool.experiment)  # created by a sync that then stopped
        if found is not None:
            file.found += 1
            self.state.ids[placeholder] = found
            return
        tags = {**self.mapped(op["tags"], file), Tag.SPOOL_ID: placeholder}
        run = self.client.create_run(experiment, start_time=int(op["time"]), run_name=op["name"], tags=tags)
        file.created += 1
        self.state.ids[placeholder] = run.info.run_id

    def finish(self, run_id: str, status: str, ended: int) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(Tag.STATUS, status)])
        self.client.set_terminated(run_id, MLFLOW_STATUS[status], end_time=ended)

    def close_sweep(self, sweep_run_id: str, code: int, ended: int, experiment: str) -> None:
        """What the sweep's driver could not do at its end: close its trials left running, then the
        sweep run with the status its trials and exit code give (the rule of a sweep's end)."""
        runs = self.client.search_runs([self.experiment_id(experiment)],
                                       filter_string=f"tags.mlflow.parentRunId = '{sweep_run_id}'",
                                       max_results=10000)
        statuses = []
        for run in runs:
            status = run.data.tags.get(Tag.STATUS)
            if status == TrialStatus.RUNNING:
                status = interrupted_status(code).value
                self.finish(run.info.run_id, status, ended)
            statuses.append(status)
        self.finish(sweep_run_id, sweep_status(code, statuses), ended)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _step(file: _FileRun, replayer: _Replayer, state: SyncState,
          allow: Callable[[_FileRun, dict[str, Any]], bool]) -> bool:
    """Apply the file's writes from where it stands while ``allow`` accepts them; True if any was."""
    progressed = False
    while not file.done and not file.error:
        op = file.spool.ops[file.next_op]
        if not allow(file, op):
            break
        try:
            replayer.apply(op, file)
        except _Waiting as exc:
            file.waiting_for = str(exc)
            break
        except Exception as exc:
            why = unreachable(exc)
            if why:
                raise _Unreachable(file.target, why) from exc
            first = scrubbed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, file.target)
            file.error = f"write {file.next_op + 1} ({op.get('op')}) refused: {first[:300]}"
            break
        file.waiting_for = ""
        file.next_op += 1
        file.applied += 1
        state.applied[file.spool.path.name] = file.next_op
        state.save()  # after every write: a sync that stops here resumes at the next one
        progressed = True
    return progressed


def _replay(files: list[_FileRun], replayers: dict[str, _Replayer], state: SyncState) -> None:
    """Every file as far as it goes, round after round while any moves (a file waiting for a run made
    in a later file goes on once that one has run). A sweep's close comes last, once every other file
    for its server is done: it reads back every trial of the sweep, so their writes must be in."""
    def rounds(allow: Callable[[_FileRun, dict[str, Any]], bool]) -> None:
        moved = True
        while moved:
            moved = False
            for file in files:
                moved |= _step(file, replayers[file.target], state, allow)

    def others_done(file: _FileRun) -> bool:
        return all(f.done for f in files if f is not file and f.target == file.target)

    rounds(lambda file, op: op["op"] != "close_sweep")
    rounds(lambda file, op: op["op"] != "close_sweep" or others_done(file))


def _file_line(file: _FileRun, moved_to: Path | None) -> str:
    spool = file.spool
    what = (f"{_shown(spool.path)}: {redact_url(file.target)}, experiment {spool.experiment}: "
            f"{file.created} run(s) created, {file.applied} write(s) applied")
    if file.found:
        what += f", {file.found} run(s) found already created"
    if file.missing:
        what += f", {len(file.missing)} artifact file(s) gone (not uploaded): {', '.join(file.missing[:3])}"
    if moved_to is not None:
        return f"{what}; done, moved to {_shown(moved_to.parent)}/"
    if file.error:
        return f"{what}; stopped at {file.error}; the file stays in the spool"
    if file.waiting_for:
        return f"{what}; waiting for {file.waiting_for}"
    left = len(spool.ops) - file.next_op
    if spool.ops[file.next_op]["op"] == "close_sweep":
        return f"{what}; {left} write(s) left: the sweep's end waits for the other files"
    return f"{what}; {left} write(s) left"


def sync_spool(root: Path | None = None, target: str | None = None, only_uri: str | None = None
               ) -> SyncReport:
    """Replay the finished spool files in ``root`` (default: :func:`spool.spool_root`), each against
    the server it names, or against ``target`` when given; ``only_uri``: only the files of that
    server. One line per file, and the exit code of ``python -m orchestrator sync``."""
    root = root or spool_root()
    names = spool_files(root)
    if not names:
        return SyncReport([], 0)
    with sync_lock(root) as locked:
        if not locked:
            return SyncReport([f"{_shown(root)}: another sync is running; this one skipped"], 0)
        return _sync_locked(root, names, target, only_uri)


def _sync_locked(root: Path, names: list[Path], target: str | None, only_uri: str | None) -> SyncReport:
    state = SyncState.load(root)
    spools, lines = [], []
    for path in names:
        try:
            spools.append(read_spool_file(path))
        except (ValueError, OSError) as exc:
            lines.append(f"{_shown(path)}: unreadable, left as it is ({str(exc).splitlines()[0]})")
    bad = len(lines)
    # which file creates each placeholder run: a write about it in another file waits for that file
    creators = {op["run"]: s.path.name for s in spools for op in s.ops if op["op"] == "start_run"}
    mine = [s for s in spools if only_uri is None or same_server(s.uri, only_uri)]
    live = [s for s in mine if s.live]
    files = [_FileRun(s, target or s.uri, state.applied.get(s.path.name, 0)) for s in mine if not s.live]
    servers = {f.target for f in files}
    down = {server: "no answer to GET /health" for server in servers
            if is_http(server) and not server_answers(server)}
    replayers = {server: _Replayer(server, state, creators) for server in servers - down.keys()}
    try:
        _replay([f for f in files if f.target not in down], replayers, state)
    except _Unreachable as exc:
        down[exc.server] = str(exc)
    for file in files:
        if file.target in down and not file.applied:
            continue  # nothing happened to it: the unreachable line covers it
        moved = None
        if file.done:
            moved = move_to_synced(file.spool)
            state.applied.pop(file.spool.path.name, None)
            state.save()
        lines.append(_file_line(file, moved))
    if live:
        lines.append(f"{_shown(root)}: {len(live)} file(s) still being written by running processes; "
                     "left for a later sync")
    if down:
        waiting = sum(1 for f in files if not f.done)
        where = ", ".join(f"{redact_url(s)} ({why})" for s, why in sorted(down.items()))
        return SyncReport(lines, 2, f"tracking server unreachable: {where}; {waiting} spool file(s) wait in "
                                    f"{_shown(root)}/; run `{SYNC_COMMAND}` when it is back")
    return SyncReport(lines, 1 if bad or any(f.error for f in files) else 0)


def sync_pending(uri: str) -> list[str]:
    """What ``run.py`` calls when it starts, right after its store passed ``check_store``: replay the
    spool files of that server left by earlier runs. The lines to print (none when there was
    nothing to do)."""
    if not is_http(uri):
        return []
    report = sync_spool(only_uri=uri)
    return report.lines + ([report.unreachable] if report.unreachable else [])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=SYNC_COMMAND, description="Replay the writes spooled while the MLflow tracking server was "
        "unreachable (runs/spool/) into the server, then move each file to runs/spool/synced/.")
    # --tracking-uri, as in `analysis report|compare` and `orchestrator calibrate`
    parser.add_argument("--tracking-uri", help="replay into this tracking server instead of the one each "
                        "spool file names (e.g. the server moved, or its URI needs credentials)")
    args = parser.parse_args(argv)
    if args.tracking_uri is not None and not is_http(args.tracking_uri):
        print(f"sync: --tracking-uri={redact_url(args.tracking_uri)}: invalid; valid: the http(s) URL of "
              "an MLflow tracking server", file=sys.stderr)
        return 2
    report = sync_spool(target=args.tracking_uri)
    for line in report.lines:
        print(f"sync: {line}")
    if report.unreachable:
        print(f"sync: {report.unreachable}", file=sys.stderr)
    elif not report.lines:
        print(f"sync: nothing to replay in {_shown(spool_root())}/")
    return report.exit_code
