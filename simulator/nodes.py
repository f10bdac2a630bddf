"""The simulated engine across nodes: one process per node that meet before serving, as SGLang's do.

SGLang started with ``--nnodes N`` runs one process per node; rank 0 opens the process group at
``--dist-init-addr HOST:PORT``, every other rank connects there, and nothing is served until all N are
in. Once serving, the ranks work in lock step (collectives, pipeline hops), so a node that goes away
fails the others. The simulated engine keeps that contract over a plain TCP connection per follower:

* rank 0 listens at ``--dist-init-addr`` (on that host: an address it does not own is an error) and
  is not ready until the ``N - 1`` others have joined, each saying its rank once; a follower that
  leaves afterwards ends rank 0 with an error naming its rank; when rank 0 is stopped, it says so to
  every follower first;
* a follower connects (retrying while rank 0 starts), says its rank, and stands by until it is
  stopped or rank 0 stops (exit 0), or rank 0 goes without a word (exit 1).

Rank 0 alone models the whole trial's timing (its cost model prices the hops between nodes); the
followers hold the place, the launch and the failure behaviour of SGLang's other ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

JOIN_TIMEOUT_S = 600.0  # without --dist-timeout: how long the ranks wait for each other to join
RETRY_S = 0.2  # a follower's pause between attempts to reach rank 0
WELCOME, BYE = b"welcome\n", b"bye\n"


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); ValueError otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dist-init-addr {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class NodeGroup:
    """Rank 0's side: the followers that joined, and the first one that left."""

    def __init__(self, nnodes: int) -> None:
        self.nnodes = nnodes
        self.joined: dict[int, asyncio.StreamWriter] = {}
        self.all_in = asyncio.Event()
        self.lost = asyncio.Event()
        self.lost_rank: int | None = None
        self._server: asyncio.Server | None = None

    async def open(self, address: str) -> None:
        host, port = split_address(address)
        self._server = await asyncio.start_server(self._follower, host, port, reuse_address=True)

    async def _follower(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode(errors="replace").split()
        rank = int(line[1]) if len(line) == 2 and line[0] == "rank" and line[1].isdigit() else -1
        if not 0 < rank < self.nnodes or rank in self.joined:
            print(f"refused a connection at --dist-init-addr that is not a new rank of 1..{self.nnodes - 1}: "
                  f"{' '.join(line)!r}", file=sys.stderr, flush=True)
            writer.close()
            return
        self.joined[rank] = writer
        writer.write(WELCOME)
        await writer.drain()
        if len(self.joined) == self.nnodes - 1:
            self.all_in.set()
        with contextlib.suppress(OSError):  # a reset is a follower gone, as an end of stream is
            await reader.read()  # a follower never sends more: this returns when it goes
        if not self.lost.is_set() and self._server is not None:
            self.lost_rank = rank
            self.lost.set()

    async def close(self) -> None:
        """Tell every follower that rank 0 stops (they stop too, cleanly), then close."""
        server, self._server = self._server, None  # a follower leaving from now on is no failure
        if server is not None:
            server.close()
        for writer in self.joined.values():
            with contextlib.suppress(OSError):
                writer.write(BYE)
                await writer.drain()
            writer.close()


async def _join(address: str, rank: int, nnodes: int, timeout_s: float
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connected and welcomed; the writer too (dropped, it would close the connection)."""
    host, port = split_address(address)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:  # rank 0 not listening yet
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"node rank {rank} of {nnodes} could not reach rank 0 at {address} "
                                   f"within {timeout_s:g} s (--dist-timeout)") from None
            await asyncio.sleep(RETRY_S)
            continue
        writer.write(f"rank {rank}\n".encode())
        with contextlib.suppress(OSError):
            await writer.drain()
        answer = b""
        with contextlib.suppress(OSError):
            answer = await reader.readline()
        if answer == WELCOME:
            return reader, writer
        writer.close()
        raise ConnectionError(f"rank 0 at {address} refused node rank {rank} of {nnodes}")


async def unless_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> asyncio.Future[T] | None:
    """``work`` run to its end (its finished future, result or error), or None when ``stop`` is set
    first (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        task.cancel()
        return None
    stopped.cancel()
    return task


async def _follow(address: str, rank: int, nnodes: int, timeout_s: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"node rank {rank} of {nnodes}: joining rank 0 at {address}", flush=True)
    joined = await unless_stopped(_join(address, rank, nnodes, timeout_s), stop)
    if joined is None:
        return 0
    try:
        reader, _writer = joined.result()
    except (TimeoutError, ConnectionError) as exc:
        print(f"RuntimeError: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"node rank {rank} of {nnodes}: joined rank 0 at {address}; rank 0 models every node, this one "
          "stands by until stopped", flush=True)
    heard = await unless_stopped(reader.readline(), stop)
    if heard is None:
        return 0
    if not heard.exception() and heard.result() == BYE:
        print(f"node rank {rank} of {nnodes}: rank 0 stopped; stopping too", flush=True)
        return 0
    print(f"RuntimeError: node rank 0 at {address} went away; node rank {rank} cannot go on alone",
          file=sys.stderr, flush=True)
    return 1


def follow(address: str, rank: int, nnodes: int, timeout_s: float | None) -> int:
    """Node ``rank`` > 0: join rank 0 at ``address`` and stand by; the process's exit code."""
    if not 0 < rank < nnodes:
        print(f"ValueError: node_rank {rank} is not in 0..{nnodes - 1} (--nnodes {nnodes})", file=sys.stderr,
              flush=True)
        return 1
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_follow(address, rank, nnodes, timeout_s or JOIN_TIMEOUT_S))
    return 0
