"""Load modes: *when* each request is sent. Knows nothing about HTTP.

* Closed loop: C workers (streams); each sends its next request as soon as its previous one ends, so
  the server always has C requests (the classic "concurrency C" point). With ``LoadPoint.ramp_s`` > 0
  the streams enter one by one (the *ramp*), stream k at ``k / C * ramp_s``: over about one request's
  duration, their requests are spread out instead of starting, prefilling and finishing together wave
  after wave (which fixed lengths would otherwise repeat for ever). 0 starts every stream at once.
* Closed loop on sessions (multi-turn): C streams, each sending one session's turns in order (the
  next a think time after the previous answer), then the next session. Open loop on sessions: each
  session's first turn leaves on the arrival schedule, its later turns as in closed loop.
* Open loop: requests leave at precomputed offsets from one schedule start (Poisson, gamma, evenly
  spaced, or a trace's own timestamps). We sleep until each *absolute* send time, so a late wake-up
  is caught up on the next request instead of accumulating (the cause of vLLM's 183-of-200 QPS
  under-delivery, vllm#21104).
  ``max_concurrency`` optionally caps requests in flight (a request past the cap waits, then goes).

Warmup requests are simply the first ``warmup_requests`` indices of the same stream: in closed
loop they fill the pipeline so measured requests start at steady state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from vocab.load import LoadPoint

from . import clock

# send(index, scheduled_epoch_time_or_None) performs one request; it must not raise.
SendFn = Callable[[int, float | None], Awaitable[None]]
# enough(): the point's stop rule says its throughput is known well enough: send nothing more
EnoughFn = Callable[[], bool]


def shard_share(total: int, shard: int, shards: int) -> int:
    """This shard's part of ``total`` when it is split as evenly as possible."""
    return total // shards + (1 if shard < total % shards else 0)


async def drive(
    point: LoadPoint,
    send: SendFn,
    *,
    shard: int = 0,
    shards: int = 1,
    start_perf: float | None = None,
    enough: EnoughFn | None = None,
) -> None:
    """Run every request of ``point`` through ``send`` according to its load mode.

    With ``shards`` > 1 this process runs only request indices ``i % shards == shard``, with its
    share of the concurrency (or of ``max_concurrency``); open-loop shards share one schedule that
    starts at ``start_perf`` (a ``time.perf_counter`` value), so together they send the point. With
    ``enough``, nothing more is sent once it returns True (the requests in flight finish).
    """
    if point.open_loop and point.sessions is not None:
        await _open_sessions(point, send, shard, shards, start_perf, enough)
    elif point.open_loop:
        await _open_loop(point, send, shard, shards, start_perf, enough)
    elif point.sessions is not None:
        await _session_loop(point, send, shard, shards, start_perf, enough)
    else:
        await _closed_loop(point, send, shard, shards, start_perf, enough)


async def _closed_loop(
    point: LoadPoint, send: SendFn, shard: int, shards: int, start_perf: float | None,
    enough: EnoughFn | None,
) -> None:
    assert point.concurrency is not None
    if start_perf is not None:
        delay = start_perf - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    warmup = point.warmup_requests
    limit = None if point.num_requests is None else warmup + point.num_requests
    duration = point.duration_s
    workers = shard_share(point.concurrency, shard, shards)
    next_index = shard
    deadline = float("inf")

    async def worker() -> None:
        nonlocal next_index, deadline
        while limit is None or next_index < limit:
            if enough is not None and enough():
                return
            i = next_index
            if i >= warmup and duration is not None:
                now = time.perf_counter()
                if deadline == float("inf"):
                    deadline = now + clock.wall_span(duration)  # the first measured send opens the window
                elif now >= deadline:
                    return
            next_index += shards  # single-threaded loop: no lock needed between read and increment
            await send(i, None)

    n_workers = workers if limit is None else min(workers, max(0, (limit - shard + shards - 1) // shards))
    await _enter_streams(point, n_workers, worker, shard, shards)


async def _session_loop(
    point: LoadPoint, send: SendFn, shard: int, shards: int, start_perf: float | None,
    enough: EnoughFn | None,
) -> None:
    """Closed loop on sessions: each stream takes the next session (this shard's: ``s % shards ==
    shard``) and sends its turns in order, each ``think_s`` after the previous answer ended."""
    assert point.concurrency is not None and point.sessions is not None
    if start_perf is not None:
        delay = start_perf - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    starts = point.session_starts()
    limit, warmup, duration = point.total_requests, point.warmup_requests, point.duration_s
    next_session = shard
    deadline = float("inf")

    def stop_before(i: int) -> bool:
        nonlocal deadline
        if i >= limit or (enough is not None and enough()):
            return True
        if i >= warmup and duration is not None:
            now = time.perf_counter()
            if deadline == float("inf"):
                deadline = now + clock.wall_span(duration)  # the first measured send opens the window
            return now >= deadline
        return False

    async def worker() -> None:
        nonlocal next_session
        while next_session < len(point.sessions or ()):
            s = next_session
            next_session += shards  # single-threaded loop: no lock needed between read and increment
            for i in range(starts[s], starts[s + 1]):
                if i > starts[s] and point.think_s > 0:
                    await asyncio.sleep(clock.wall_span(point.think_s))
                if stop_before(i):
                    return
                await send(i, None)

    sessions = len(range(shard, len(point.sessions), shards))
    await _enter_streams(point, min(shard_share(point.concurrency, shard, shards), sessions), worker,
                         shard, shards)


async def _enter_streams(
    point: LoadPoint, n_workers: int, worker: Callable[[], Awaitable[None]], shard: int, shards: int
) -> None:
    """Start ``n_workers`` streams running ``worker``, ramped in as ``point.ramp_s`` says, and wait
    for them all."""
    assert point.concurrency is not None
    if n_workers <= 0:
        return
    ramp_start = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    try:
        for k in range(n_workers):
            # this stream's place among every shard's streams, so the shards interleave their entries
            entry = clock.wall_span(point.ramp_s * (k * shards + shard) / point.concurrency)
            delay = ramp_start + entry - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(worker()))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _open_loop(
    point: LoadPoint, send: SendFn, shard: int, shards: int, start_perf: float | None,
    enough: EnoughFn | None,
) -> None:
    offsets = point.send_offsets()
    cap = point.max_concurrency
    if cap is not None and shards > 1:
        cap = max(1, shard_share(cap, shard, shards))
    sem = asyncio.Semaphore(cap) if cap else None
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, scheduled: float) -> None:
        if sem is None:
            await send(i, scheduled)
        else:
            async with sem:
                await send(i, scheduled)

    if start_perf is None:
        start_perf = time.perf_counter()
    start_epoch = clock.from_perf(start_perf)
    perf = time.perf_counter
    try:
        for i in range(shard, len(offsets), shards):
            if enough is not None and enough():
                break
            off = float(offsets[i])
            delay = start_perf + clock.wall_span(off) - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(i, start_epoch + off))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))
    finally:
        # Cancelled (the point was stopped) while sleeping until the next send: the requests in
        # flight belong to this point and must end with it, not run on after it has returned.
        if tasks:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*list(tasks), return_exceptions=True)


async def _open_sessions(
    point: LoadPoint, send: SendFn, shard: int, shards: int, start_perf: float | None,
    enough: EnoughFn | None,
) -> None:
    """Sessions arriving at a rate: session s's first turn leaves at its offset on the schedule (this
    shard's sessions: ``s % shards == shard``); each later turn ``think_s`` after the previous answer
    ended. Sessions overlap freely (no cap)."""
    assert point.sessions is not None
    offsets = point.session_offsets()
    starts = point.session_starts()
    limit = point.total_requests
    if start_perf is None:
        start_perf = time.perf_counter()
    start_epoch = clock.from_perf(start_perf)
    perf = time.perf_counter

    async def session(s: int) -> None:
        for i in range(starts[s], min(starts[s + 1], limit)):
            if i > starts[s]:
                if enough is not None and enough():
                    return
                if point.think_s > 0:
                    await asyncio.sleep(clock.wall_span(point.think_s))
            await send(i, start_epoch + float(offsets[s]) if i == starts[s] else None)

    tasks: set[asyncio.Task[None]] = set()
    try:
        for s in range(shard, len(point.sessions), shards):
            if starts[s] >= limit or (enough is not None and enough()):
                break
            delay = start_perf + clock.wall_span(float(offsets[s])) - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(session(s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))
    finally:
        if tasks:  # cancelled: the sessions' requests in flight end with the point
            for task in tasks:
                task.cancel()
            await asyncio.gather(*list(tasks), return_exceptions=True)


class LagMonitor:
    """Measures how late the event loop wakes a ~10 ms ticker (ms of overshoot per tick).

    If the client is CPU-bound, every timestamp it takes is late by about this much; a p99 above
    a few ms means the measured latencies include the client's own queueing.
    """

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.samples_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # Only the ticker's own cancellation is expected here.
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        interval = self.interval_s
        while True:
            expected = time.perf_counter() + interval
            await asyncio.sleep(interval)
            self.samples_ms.append(clock.engine_span(max(0.0, time.perf_counter() - expected)) * 1000.0)
