"""A guardian that ends what the driver leaves behind when it dies without cleaning up.

``kill -9`` of the driver, or the OOM killer, runs no ``finally``: nothing in the driver can stop its
trials' engines or the local Ray it started. Measured with Ray 2.60 (tests/test_driver_killed.py): after
SIGKILL of a sweep's driver the GCS and the raylet end at once, the workers within seconds (a trial's
worker mostly without closing the trial's run; one that lives long enough gets Ray's exit as
``SystemExit`` and closes it as killed) and with them, through the deathsig wrapper, the engines; but
Ray's dashboard and runtime-env agents live on, orphaned, for about a minute. In a single run the engine
ends by itself through the deathsig wrapper, and the trial's run is left open.

The design, and why it is the simplest that holds:

* A separate, tiny process (``python -m orchestrator.process.guardian``), started by the driver before
  anything launches, because nothing inside a killed driver runs.
* It notices the driver's death by its own parent pid changing, polled twice a second. A pipe whose EOF
  means death would be simpler to wait on, but any process forked by the driver (the load generator's
  workers are) holds a copy of its write end, so EOF could come late or never; ``PR_SET_PDEATHSIG`` in
  every process cannot be arranged either: Ray starts its agents and workers from the raylet.
* What it ends: every process descending from the driver, recorded with its start time on each poll
  while the driver lives. Once the driver is gone its orphans hang from init and the tree no longer
  finds them; the start time keeps a reused pid from being hit. Also the live engine process groups
  named by ``server/*.pgid`` files under the sweep directory (checked to be that trial's engine), in case
  an engine started after the last poll.
* It runs in its own session, so Ctrl-C in the terminal or a signal to the driver's group does not end
  it before the driver; it outlives the driver by the grace period below at most.
* Those processes first get a moment to end by themselves (after a clean exit nothing is left, and
  after a kill most of Ray follows the driver). Then engines get SIGTERM, as a trial stops them, so
  that an engine frees its GPUs in order, and SIGKILL after a grace period. Everything else gets
  SIGKILL at once: with the driver gone, nothing of Ray's or of the load generator's has anything left
  to do or to save, and nothing else ends them reliably (Ray's agents ignore SIGINT; a Ray worker
  turns SIGTERM into an exit, which its trial records as killed). A trial so cut short leaves its
  run "running", and the next run closes it as killed with what its directory holds
  (orchestrator/store/stale.py). What had to be stopped is written to ``guardian.log`` in the sweep
  directory.

Only this machine's processes are covered: trials on a Ray cluster joined with ``ray.address`` are
ended by Ray itself when their driver's job dies, and their engines by the deathsig wrapper.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

GUARDIAN_LOG = "guardian.log"
POLL_S = 0.5  # how often the driver's descendants are recorded, and how soon its death is noticed
SETTLE_S = 2.0  # leftovers' time to end by themselves before they are signalled
GRACE_S = 10.0  # an engine's SIGTERM to SIGKILL (a trial gives its engine as long by default)

_STARTED: subprocess.Popen[bytes] | None = None  # the driver's guardian (one per driver process)


def start_guardian(sweep_dir: Path) -> None:
    """Start this driver's guardian once (later calls do nothing)."""
    global _STARTED
    if _STARTED is not None:
        return
    sweep_dir.mkdir(parents=True, exist_ok=True)
    _STARTED = subprocess.Popen(  # argv list, no shell; no stdio of ours, so no pipe waits for it
        [sys.executable, "-m", "orchestrator.process.guardian", "--driver", str(os.getpid()),
         "--sweep-dir", str(sweep_dir)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)


def engine_processes(pgid: int, trial_dir: Path) -> list[psutil.Process]:
    """The live members of process group ``pgid`` when that group is ``trial_dir``'s engine: a member's
    command line names the trial directory (the simulated engine's flags do) or its output goes to the
    trial's server log (every engine's does). Anything else is not ours, whatever its group id (ids are
    reused), and is left alone."""
    return _if_engine(_groups({pgid}).get(pgid, []), trial_dir)


def engine_groups(sweep_dir: Path) -> list[psutil.Process]:
    """The live engine processes of the trials under ``sweep_dir`` (a sweep's ``<n>/`` or a single
    run's directory itself)."""
    named: dict[int, Path] = {}
    for pgid_file in [*sweep_dir.glob("server/*.pgid"), *sweep_dir.glob("*/server/*.pgid")]:
        with contextlib.suppress(OSError, ValueError):
            named[int(pgid_file.read_text())] = pgid_file.parent.parent
    groups = _groups(set(named)) if named else {}
    return [p for pgid, members in groups.items() for p in _if_engine(members, named[pgid])]


def _groups(pgids: set[int]) -> dict[int, list[psutil.Process]]:
    """The live members of each of these process groups (one pass over the processes)."""
    found: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            pgid = os.getpgid(proc.pid)
            if pgid in pgids:
                found.setdefault(pgid, []).append(proc)
    return found


def _if_engine(members: list[psutil.Process], trial_dir: Path) -> list[psutil.Process]:
    logs = os.path.realpath(trial_dir / "server")  # the engine's log, its DP replicas' and router's
    for proc in members:
        with contextlib.suppress(psutil.Error, OSError):
            if (str(trial_dir) in " ".join(proc.cmdline())
                    or os.path.dirname(os.readlink(f"/proc/{proc.pid}/fd/1")) == logs):
                return members
    return []


def stop_processes(terminate: Iterable[psutil.Process], kill: Iterable[psutil.Process] = (),
                   grace_s: float = GRACE_S) -> list[str]:
    """SIGTERM ``terminate`` and SIGKILL ``kill``, then SIGKILL what still runs after ``grace_s``;
    ``["pid name", ...]`` of those that were signalled (those already gone are skipped)."""
    signalled: dict[int, psutil.Process] = {}
    said: list[str] = []
    for procs, sig in ((terminate, signal.SIGTERM), (kill, signal.SIGKILL)):
        for proc in _running(procs):
            if proc.pid in signalled:
                continue
            with contextlib.suppress(psutil.Error):
                name = proc.name()
                proc.send_signal(sig)
                signalled[proc.pid] = proc
                said.append(f"{proc.pid} {name}")
    for last, wait_s in ((False, grace_s), (True, 5.0)):
        deadline = time.monotonic() + wait_s
        while (alive := _running(signalled.values())) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not last:
            for proc in alive:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
    return said


def _running(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those still running: psutil's is_running compares the start time, so a reused pid is not taken
    for ours; a zombie has ended (its parent has yet to reap it)."""
    alive = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


def _descendants(driver: psutil.Process) -> dict[int, psutil.Process]:
    me = os.getpid()
    with contextlib.suppress(psutil.Error):
        return {p.pid: p for p in driver.children(recursive=True) if p.pid != me}
    return {}


def _still_running(known: dict[int, psutil.Process]) -> list[psutil.Process]:
    """Those of ``known`` that still run, with any children they have now."""
    alive = _running(known.values())
    for proc in list(alive):
        with contextlib.suppress(psutil.Error):
            alive += proc.children(recursive=True)
    return alive


def guard(driver_pid: int, sweep_dir: Path, settle_s: float = SETTLE_S, grace_s: float = GRACE_S) -> None:
    """Record the driver's descendants until the driver is gone, then end those still running."""
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:
        return
    known: dict[int, psutil.Process] = {}
    while os.getppid() == driver_pid:
        known = {pid: p for pid, p in known.items() if p.is_running()} | _descendants(driver)
        time.sleep(POLL_S)
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and (_still_running(known) or engine_groups(sweep_dir)):
        time.sleep(0.2)
    engines = engine_groups(sweep_dir)
    stopped = stop_processes(engines, [p for p in _still_running(known) if p not in engines], grace_s)
    if stopped:
        with contextlib.suppress(OSError), (sweep_dir / GUARDIAN_LOG).open("a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} the driver (pid {driver_pid}) ended and left "
                      f"{len(stopped)} process(es) running; stopped: {', '.join(stopped)}\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.process.guardian",
                                     description="end what a driver leaves running when it dies")
    parser.add_argument("--driver", type=int, required=True, help="the driver's pid (this process's parent)")
    parser.add_argument("--sweep-dir", type=Path, required=True, help="where its trials' directories are")
    args = parser.parse_args()
    guard(args.driver, args.sweep_dir)


if __name__ == "__main__":
    main()
