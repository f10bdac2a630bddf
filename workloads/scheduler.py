"""Load modes: *when* each request is sent. Knows nothing about HTTP.

* Closed loop: C workers; each sends its next request as soon as its previous one ends, so the
  server always has C requests (the classic "concurrency C" point).
* Open loop: requests leave at precomputed offsets from one schedule start (Poisson or evenly
  spaced). We sleep until each *absolute* send time, so a late wake-up is caught up on the next
  request instead of accumulating (the cause of vLLM's 183-of-200 QPS under-delivery, vllm#21104).
  ``max_concurrency`` optionally caps requests in flight (a request past the cap waits, then goes).

Warmup requests are simply the first ``warmup_requests`` indices of the same stream: in closed
loop they fill the pipeline so measured requests start at steady state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from . import clock

Arrival = Literal["poisson", "constant"]

# send(index, scheduled_epoch_time_or_None) performs one request; it must not raise.
SendFn = Callable[[int, float | None], Awaitable[None]]


@dataclass(frozen=True)
class LoadPoint:
    """One load level: exactly one of ``concurrency`` (closed loop) or ``rate`` (open loop, req/s)."""

    num_requests: int
    concurrency: int | None = None
    rate: float | None = None
    arrival: Arrival = "poisson"
    max_concurrency: int | None = None
    warmup_requests: int = 0
    seed: int = 0  # seeds the Poisson arrival schedule

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.rate is not None and not (self.rate > 0 and np.isfinite(self.rate)):
            raise ValueError("rate must be a positive finite number of requests per second")
        if self.arrival not in ("poisson", "constant"):
            raise ValueError("arrival must be 'poisson' or 'constant'")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if self.num_requests < 1 or self.warmup_requests < 0:
            raise ValueError("num_requests must be >= 1 and warmup_requests >= 0")

    @property
    def label(self) -> str:
        """``c8`` for concurrency 8, ``r2.5`` / ``r200`` for rates (the MLflow metric prefix)."""
        if self.concurrency is not None:
            return f"c{self.concurrency}"
        return f"r{self.rate:g}"

    @property
    def open_loop(self) -> bool:
        return self.rate is not None

    @property
    def total_requests(self) -> int:
        return self.warmup_requests + self.num_requests

    def send_offsets(self) -> np.ndarray:
        """Send time of every request (warmup first), in seconds from the schedule start."""
        if self.rate is None:
            raise ValueError("closed-loop points have no send schedule")
        n = self.total_requests
        if self.arrival == "constant":
            return np.arange(n, dtype=float) / self.rate
        gaps = np.random.default_rng(self.seed).exponential(1.0 / self.rate, size=n)
        gaps[0] = 0.0  # the first request opens the schedule
        return np.cumsum(gaps)


async def drive(point: LoadPoint, send: SendFn) -> None:
    """Run every request of ``point`` through ``send`` according to its load mode."""
    if point.open_loop:
        await _open_loop(point, send)
    else:
        await _closed_loop(point, send)


async def _closed_loop(point: LoadPoint, send: SendFn) -> None:
    assert point.concurrency is not None
    total = point.total_requests
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < total:
            i = next_index
            next_index += 1  # single-threaded loop: no lock needed between read and increment
            await send(i, None)

    await asyncio.gather(*(worker() for _ in range(min(point.concurrency, total))))


async def _open_loop(point: LoadPoint, send: SendFn) -> None:
    offsets = point.send_offsets()
    sem = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, scheduled: float) -> None:
        if sem is None:
            await send(i, scheduled)
        else:
            async with sem:
                await send(i, scheduled)

    start_perf = time.perf_counter()
    start_epoch = clock.now()
    for i, off in enumerate(offsets.tolist()):
        delay = start_perf + off - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i, start_epoch + off))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*list(tasks))


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
            self.samples_ms.append(max(0.0, time.perf_counter() - expected) * 1000.0)
