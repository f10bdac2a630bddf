"""The spool: tracking writes kept on local disk while the MLflow server cannot be reached, replayed
by ``python -m orchestrator sync`` (``orchestrator/store/sync.py``). Layout and guarantees:
docs/mlflow-layout.md, "When the tracking server goes away".

One file per writing process (``runs/spool/<time>-<pid>-<n>.jsonl``): a header line (the server, the
experiment, who wrote it), then one JSON line per write, in the order they were made. The writing
process holds an exclusive ``flock`` on its file while it has it open, so a sync can tell a file
still being written (locked) from a finished one, also when the writer was killed outright (the
kernel drops the lock with the process). The sync's progress lives next to the files, in
``sync-state.json``: per file, how many writes were applied, and every placeholder run id mapped
to the real one, replaced atomically after each write.

Nothing here talks to MLflow: ``tracking.py`` writes spool files, ``sync.py``
replays them.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPOOL_DIR_ENV = "PARASWEEP_SPOOL_DIR"
PLACEHOLDER_PREFIX = "spool-"
FORMAT = 1
STATE_FILE = "sync-state.json"
SYNCED_DIR = "synced"
_SEQUENCE = itertools.count()


def spool_root() -> Path:
    """``runs/spool`` under the working directory (where the default store is; Ray workers on this
    machine share the driver's working directory), or ``$PARASWEEP_SPOOL_DIR``."""
    return Path(os.environ.get(SPOOL_DIR_ENV) or Path.cwd() / "runs" / "spool").resolve()


def new_placeholder() -> str:
    return PLACEHOLDER_PREFIX + uuid.uuid4().hex


def is_placeholder(run_id: str | None) -> bool:
    return bool(run_id) and str(run_id).startswith(PLACEHOLDER_PREFIX)


def same_server(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def _fsync_write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)  # a spooled write is the only copy of it: it must survive a crash of the machine too


class SpoolWriter:
    """One process's spool file for one server and experiment, created on the first write."""

    def __init__(self, root: Path, uri: str, uri_shown: str, experiment: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.path = root / f"{stamp}-{os.getpid()}-{next(_SEQUENCE):03d}-{uuid.uuid4().hex[:6]}.jsonl"
        # 0600: the header holds the tracking URI as given, which may carry a password
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._count = 0
        self.open_runs: set[str] = set()
        header = {"parasweep_spool": FORMAT, "uri": uri, "uri_shown": uri_shown, "experiment": experiment,
                  "pid": os.getpid(), "host": socket.gethostname(),
                  "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        _fsync_write(self._fd, (json.dumps(header) + "\n").encode())

    @property
    def files_dir(self) -> Path:
        """Copies of files that would not outlive the writer (scratch files), one folder per spool file."""
        return self.path.with_suffix(".files")

    def append(self, op: dict[str, Any]) -> None:
        if op.pop("copy", False):  # a scratch file: keep a copy, the original may be gone by the sync
            source = Path(op["path"])
            target = self.files_dir / str(self._count) / source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            op["path"] = str(target)
        self._count += 1
        _fsync_write(self._fd, (json.dumps(op) + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock: the file is finished and may be synced
            self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0


@dataclass
class SpoolFile:
    """A spool file as the sync sees it: header, the complete write lines, and whether its writer
    still has it open."""

    path: Path
    header: dict[str, Any]
    ops: list[dict[str, Any]]
    live: bool

    @property
    def uri(self) -> str:
        return str(self.header.get("uri", ""))

    @property
    def experiment(self) -> str:
        return str(self.header.get("experiment", ""))

    @property
    def files_dir(self) -> Path:
        return self.path.with_suffix(".files")


def _is_live(path: Path) -> bool:
    """Whether a process still holds the file's lock (is still writing it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops our shared lock
    return False


def read_spool_file(path: Path) -> SpoolFile:
    """The file's header and its complete lines. A last line without its newline is a write cut short
    by a crash: that write never returned to its caller, so it is left out."""
    live = _is_live(path)
    text = path.read_bytes().decode(errors="replace")
    lines = text.split("\n")
    complete = lines[:-1]  # the part after the last newline is empty or a cut-short write
    if not complete:
        raise ValueError(f"{path}: no header line (not a parasweep spool file)")
    header = json.loads(complete[0])
    if header.get("parasweep_spool") != FORMAT:
        raise ValueError(f"{path}: not a parasweep spool file of format {FORMAT}")
    return SpoolFile(path, header, [json.loads(line) for line in complete[1:] if line.strip()], live)


def spool_files(root: Path) -> list[Path]:
    """The files waiting in ``root`` (not those already synced), oldest first: a process's files are
    named in the order it wrote them, and processes' files by when each began."""
    return sorted(root.glob("*.jsonl")) if root.is_dir() else []


@dataclass
class SyncState:
    """What the sync has done so far: writes applied per file, placeholders mapped to real run ids."""

    path: Path
    applied: dict[str, int] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> SyncState:
        path = root / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        return cls(path, {str(k): int(v) for k, v in data.get("applied", {}).items()},
                   {str(k): str(v) for k, v in data.get("ids", {}).items()})

    def save(self) -> None:
        """Atomically (a crash leaves the old state or the new one, never half of one)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _fsync_write(fd, json.dumps({"applied": self.applied, "ids": self.ids}, indent=1).encode())
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


def move_to_synced(spool: SpoolFile) -> Path:
    """A fully applied file (and its copied files) to ``synced/``: kept, not deleted."""
    target = spool.path.parent / SYNCED_DIR
    target.mkdir(exist_ok=True)
    if spool.files_dir.is_dir():
        os.replace(spool.files_dir, target / spool.files_dir.name)
    os.replace(spool.path, target / spool.path.name)
    return target / spool.path.name


@contextlib.contextmanager
def sync_lock(root: Path) -> Iterator[bool]:
    """Held for a whole sync, so two syncs (a ``run.py`` starting while ``sync`` runs) never replay
    the same file at once; yields False, without waiting, when another sync holds it."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".sync.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
