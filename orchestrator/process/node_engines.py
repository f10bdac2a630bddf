"""The engine processes of a trial across nodes that do not serve HTTP: node ranks 1..N-1.

A trial wider than one node runs as one Ray task in bundle 0 of a placement group with one bundle per
node (the launcher reserves it, strictly spread). That task starts rank 0's engine itself, like any
trial's; for every other bundle it starts a :class:`NodeEngine` actor there, which runs that node's
engine command as a process group of its own (with the GPUs Ray gave the actor as its
``CUDA_VISIBLE_DEVICES``), tells when it exits, and stops it. The engine's log stays on its node until
the stop, when its text comes back to the trial, which keeps it next to rank 0's: no file system is
shared between nodes.

The trial learns that an engine on another node exited without asking anyone: each actor has a call
that returns only when its engine exits, and the trial checks those calls' results without waiting
(``ray.wait(timeout=0)``), so the engine watch can ask every fraction of a second. An actor that dies
(its node lost) answers those calls with an error, which reads as that node's engine being gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.environment import placement
from orchestrator.errors import EngineStartError
from orchestrator.gpu_release import RELEASE_WAIT_S, process_group_pids, wait_gpus_free
from orchestrator.process.server import ServerProcess, exit_reason, log_tail

LOG_BYTES_KEPT = 4 << 20  # the end of a node's engine log brought back to the trial (4 MiB)
ACTOR_START_TIMEOUT_S = 120.0
OTHER_NODE_NEWS_S = 1.0  # how long rank 0's exit waits for news of another node's, which crosses Ray


@dataclass(frozen=True)
class EngineFiles:
    """The files a trial's engine command names under ``root`` (the simulated engine's hardware
    profile, calibration and shrunk model config, written on rank 0's node before the launch), carried
    to another node: written under a folder of that node's, and the command's paths pointed there."""

    root: str
    contents: dict[str, bytes] = field(default_factory=dict)  # path relative to root -> bytes

    @classmethod
    def under(cls, root: Path) -> EngineFiles:
        found = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
        return cls(str(root), {str(p.relative_to(root)): p.read_bytes() for p in found})

    def place(self, folder: Path, argv: list[str]) -> list[str]:
        """Write the files under ``folder``; ``argv`` with every path under ``root`` moved there."""
        for rel, data in self.contents.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
        if not self.contents:
            return list(argv)
        return [str(folder) + arg[len(self.root):] if arg == self.root or arg.startswith(self.root + os.sep)
                else arg for arg in argv]


def head_address() -> str:
    """The address of this node (rank 0's) as the cluster's other nodes reach it: Ray's own."""
    import ray

    return str(ray.util.get_node_ip_address())


@dataclass(frozen=True)
class NodeExit:
    """An engine of another node that exited: its rank, why, and when (epoch seconds, its node's clock;
    None when its actor died with it)."""

    rank: int
    reason: str
    at: float | None


class NodeEngine:
    """One node's engine process, run by a Ray actor placed on that node (``ray.remote`` is applied
    where it is started, so this module imports Ray only there). Its calls run on threads of their
    own (the actor is started with ``max_concurrency``), so ``wait_exit`` never blocks ``stop``; a lock
    keeps a stop that comes first (a cancelled trial) from being overtaken by the start."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.log_path = Path(tempfile.mkdtemp(prefix=f"parasweep-node{rank}-")) / "server.log"
        self.server: ServerProcess | None = None
        self.engine_name = ""
        self.stopped = False
        self.lock = threading.Lock()

    def start(self, argv: list[str], env: dict[str, str], stop_grace_s: float, files: EngineFiles,
              engine_name: str) -> dict[str, str]:
        """Start the engine with this process's environment (Ray's CUDA_VISIBLE_DEVICES for the
        actor's GPUs) plus ``env``, after writing the files its command line names on this node;
        returns where it runs (host, Ray node, GPU UUIDs)."""
        with self.lock:
            if self.stopped:
                raise EngineStartError(f"the engine of node {self.rank} was stopped before it started")
            argv = files.place(self.log_path.parent / "engine", argv)
            self.server = ServerProcess(argv, self.log_path, "127.0.0.1", 0, env={**os.environ, **env},
                                        stop_grace_s=stop_grace_s)
            self.engine_name = engine_name
            self.server.start()
        return placement(engine_name, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def wait_exit(self) -> tuple[int, float]:
        """The engine's exit code and the time it exited, returned when it exits (a stop included)."""
        assert self.server is not None and self.server.proc is not None
        code = self.server.proc.wait()
        return code, time.time()

    def stop(self) -> str:
        """Stop the whole process group (and, for SGLang, wait until this node's GPUs are free for the
        next trial); the end of its log. Its folder is removed."""
        with self.lock:
            self.stopped = True
            server = self.server
        notes = []
        if server is not None:
            pids = process_group_pids(server.pid or 0)
            server.stop()
            if self.engine_name == "sglang":
                notes = wait_gpus_free(os.environ.get("CUDA_VISIBLE_DEVICES"), RELEASE_WAIT_S, pids or None)
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, self.log_path.stat().st_size - LOG_BYTES_KEPT))
                text = f.read().decode(errors="replace")
        except OSError:
            text = "(no log)"
        finally:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)
        return text + "".join(f"\n[parasweep] {note}" for note in notes)


class OtherNodes:
    """Node ranks 1..N-1 of the trial running in this process: started, watched, stopped, their logs
    kept as ``server/server-node<r>.log`` beside rank 0's."""

    def __init__(self, log_dir: Path, gpus_per_node: int, cpus: float) -> None:
        self.log_dir, self.gpus_per_node, self.cpus = log_dir, gpus_per_node, cpus
        self._actors: dict[int, Any] = {}
        self._exits: dict[Any, int] = {}  # each actor's wait_exit reference -> its rank
        self.places: list[dict[str, str]] = []  # where each other node's engine runs, in rank order
        self.ranks: list[int] = []  # the ranks started (kept after the stop, for their logs)
        self._stop_grace_s = 10.0
        self._head_exited_at: float | None = None  # when rank 0's engine exited (watch_head)

    def watch_head(self, proc: subprocess.Popen[bytes]) -> None:
        """Note when rank 0's engine exits (a thread waits for it), to tell which node's went first."""
        def wait() -> None:
            proc.wait()
            self._head_exited_at = time.time()

        threading.Thread(target=wait, name="engine-exit-clock", daemon=True).start()

    def gone_first(self, head_code: int | None) -> str | None:
        """Why another node's engine is gone, when it went before rank 0's (``head_code``: rank 0's exit
        code, None while it runs), or None. The ranks fail together, so the one that went first is the
        failure; with rank 0 gone, news of another node's exit may still be crossing Ray: wait for it a
        moment. Cheap while rank 0 runs: no call leaves this process."""
        gone = self.exited(wait_s=OTHER_NODE_NEWS_S if head_code is not None else 0.0)
        if gone is None:
            return None
        head_at = self._head_exited_at if self._head_exited_at is not None else time.time()
        first = head_code is None or gone.at is None or gone.at <= head_at  # an actor that died: first
        return gone.reason if first else None

    def log_path(self, rank: int) -> Path:
        return self.log_dir / f"server-node{rank}.log"

    def start(self, argvs: dict[int, list[str]], env: dict[str, str], stop_grace_s: float,
              files: EngineFiles, engine_name: str) -> None:
        """One actor per rank in bundle ``rank`` of this task's placement group, each starting its
        node's engine; returns when every engine process has been started (not when it is ready)."""
        import ray
        from ray.exceptions import RayError
        from ray.util import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = get_current_placement_group()
        if group is None:
            raise EngineStartError("a trial across nodes runs in a placement group of one bundle per node "
                                   "(a sweep's trial on a Ray cluster); this one was started outside one")
        self._stop_grace_s, self.ranks = stop_grace_s, sorted(argvs)
        actor_class = ray.remote(NodeEngine)
        for rank in argvs:
            where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
            self._actors[rank] = actor_class.options(
                num_gpus=self.gpus_per_node, num_cpus=self.cpus, max_concurrency=4,
                scheduling_strategy=where).remote(rank)
        started = {rank: actor.start.remote(argvs[rank], env, stop_grace_s, files, engine_name)
                   for rank, actor in self._actors.items()}
        # the bundles are reserved already: an actor that does not start within this is not coming
        try:
            self.places = [ray.get(started[rank], timeout=ACTOR_START_TIMEOUT_S) for rank in sorted(started)]
        except RayError as exc:  # a timeout, or the actor's error
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            raise EngineStartError(f"the engines of the other nodes did not start: {type(exc).__name__}: "
                                   f"{first}") from None
        self._exits = {actor.wait_exit.remote(): rank for rank, actor in self._actors.items()}

    def exited(self, wait_s: float = 0.0) -> NodeExit | None:
        """The first engine on another node found gone (it exited, or its actor died), or None.
        Without ``wait_s``, cheap: no call leaves this process."""
        import ray

        if not self._exits:
            return None
        done, _ = ray.wait(list(self._exits), num_returns=1, timeout=wait_s)
        for ref in done:
            rank = self._exits[ref]
            try:
                code, at = ray.get(ref)
            except Exception as exc:  # the actor (or its node) died: its engine went with it
                return NodeExit(rank, f"engine on node {rank} lost with its Ray actor ({type(exc).__name__})",
                                None)
            return NodeExit(rank, exit_reason(code, f"engine on node {rank}"), at)
        return None

    def problem(self) -> str | None:
        """Why an engine on another node is gone, or None (for a wait that watches them all)."""
        gone = self.exited()
        return gone.reason if gone is not None else None

    def log_tails(self, lines: int = 10) -> str:
        """The end of each other node's log, once stopped (its log is then here), for a failure message."""
        return "\n".join(f"node {rank} engine log tail ({self.log_path(rank)}):\n"
                         f"{log_tail(self.log_path(rank), lines)}" for rank in self.ranks
                         if self.log_path(rank).exists())

    def stop(self) -> None:
        """Stop every other node's engine (its whole process group; all at once), keep its log, end its
        actor. Safe to call more than once; an actor that does not answer is killed outright (its
        engine, started with a parent-death signal, goes with it)."""
        import ray

        actors, self._actors, self._exits = self._actors, {}, {}
        if not actors:
            return
        stops = {rank: actor.stop.remote() for rank, actor in actors.items()}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for rank, ref in stops.items():
            try:
                # its stop: the grace, the kill (5 s), and for SGLang the GPUs let go, with a margin
                text = ray.get(ref, timeout=self._stop_grace_s + RELEASE_WAIT_S + 15)
            except Exception as exc:
                text = f"(the log of node {rank} could not be fetched: {type(exc).__name__})"
            with self.log_path(rank).open("a") as f:
                f.write(text)
        for actor in actors.values():
            ray.kill(actor, no_restart=True)
