"""Live progress: trials write a small JSON file, the driver renders all of them.

A file (replaced atomically) rather than a Ray actor, so the same display works for a single
in-process trial, for trials in Ray workers, and for a person running ``cat progress.json``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

PROGRESS_FILE = "progress.json"
# Set in Ray workers by the launcher: the driver renders every trial's progress, the trial only writes it.
DRIVER_RENDERS_PROGRESS_ENV = "PARASWEEP_IN_RAY"


class ProgressWriter:
    """Trial side: ``update(point="c8", done=3, total=32)``; writes at most every ``interval_s``."""

    def __init__(self, trial_dir: Path, trial: str, interval_s: float = 0.25) -> None:
        self.path = trial_dir / PROGRESS_FILE
        self.interval_s = interval_s
        self.state: dict[str, Any] = {"trial": trial, "status": "starting", "started": time.time()}
        self._last = 0.0
        self._lock = threading.Lock()

    def update(self, force: bool = False, **fields: Any) -> None:
        with self._lock:
            self.state.update(fields)
            now = time.monotonic()
            if not force and now - self._last < self.interval_s:
                return
            self._last = now
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.state))
            os.replace(tmp, self.path)


def read_progress(trial_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((trial_dir / PROGRESS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


@dataclass
class TrialSlot:
    """Driver side view of one trial."""

    trial_dir: Path
    label: str
    state: str = "queued"  # queued | running | done


class ProgressView:
    """Driver side: a live table on a terminal, one plain line per change elsewhere (CI, logs)."""

    def __init__(self, slots: list[TrialSlot], console: Console | None = None, interval_s: float = 0.5):
        self.slots = slots
        self.console = console or Console(stderr=True)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Live | None = None
        self._seen: dict[str, tuple[Any, ...]] = {}

    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        self._thread = threading.Thread(target=self._loop, name="parasweep-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        self.refresh()
        if self._live:
            self._live.__exit__(None, None, None)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.refresh()

    def refresh(self) -> None:
        if self._live:
            self._live.update(self._table())
            return
        for slot in self.slots:
            p = read_progress(slot.trial_dir) or {}
            key = (p.get("status"), p.get("point")) if p else (slot.state,)
            if self._seen.get(slot.label) != key and (p or slot.state != "queued"):
                self._seen[slot.label] = key
                self.console.print(f"[parasweep] {slot.label}: {self._describe(slot, p)}", highlight=False)

    @staticmethod
    def _describe(slot: TrialSlot, p: dict[str, Any]) -> str:
        status = p.get("status", slot.state)
        if p.get("point"):
            return (f"{status}, load point {p['point']} ({p.get('point_index', 0) + 1}/"
                    f"{p.get('points_total', '?')}), {p.get('done', 0)}/{p.get('total', '?')} requests")
        return status + (f": {p['message']}" if p.get("message") else "")

    def _table(self) -> Table:
        counts = {s: sum(1 for x in self.slots if x.state == s) for s in ("queued", "running", "done")}
        table = Table(title=f"parasweep: {counts['running']} running, {counts['queued']} queued, "
                            f"{counts['done']} done", title_justify="left")
        for col in ("trial", "status", "load point", "requests", "elapsed"):
            table.add_column(col)
        for slot in self.slots:
            p = read_progress(slot.trial_dir) or {}
            point = p.get("point") or ""
            if point:
                point += f" ({p.get('point_index', 0) + 1}/{p.get('points_total', '?')})"
            reqs = f"{p.get('done', 0)}/{p['total']}" if p.get("total") else ""
            elapsed = f"{time.time() - p['started']:.0f}s" if p.get("started") else ""
            table.add_row(slot.label, p.get("status", slot.state), point, reqs, elapsed)
        return table
