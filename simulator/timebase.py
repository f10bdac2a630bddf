"""Simulated time: the event queue the model runs on, and the driver that ties it to the wall clock.

The model only sees ``Simulation`` (``now``, ``schedule``). Predictions (``predict.py``) run the queue
flat out, jumping from event to event; the live server (``server.py``) lets ``LiveDriver`` run it
against the wall clock on its asyncio loop (docs/simulator.md, "Live mode").
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any


class Simulation:
    """A heap of (time, seq, callback, args). Callbacks run with ``now`` set to their event time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = itertools.count()
        self.on_schedule: Callable[[float], None] | None = None  # a driver's hook: "earliest may change"

    def schedule(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        if t < self.now:
            t = self.now  # never schedule into the past: it would reorder already-processed history
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))
        if self.on_schedule is not None:
            self.on_schedule(t)

    def peek(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_until(self, t_end: float) -> int:
        """Process every event with time <= t_end, in time order. Returns how many ran."""
        n = 0
        heap = self._heap
        while heap and heap[0][0] <= t_end:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(*args)
            n += 1
        return n


class LiveDriver:
    """Follows the wall clock on an asyncio loop: simulated t maps to wall t0 + t / scale.

    One loop timer is kept armed for the earliest pending event (no polling task, no spinning). The
    event loop's timers have 1 ms resolution (epoll/libuv round timeouts up to whole ms), so a wakeup
    comes 0-1 ms after the requested time. The timer is therefore armed ``EARLY_S`` before the event and
    each wakeup processes every event due up to ``EARLY_S`` past the wall clock: emissions land within
    about +-0.5 ms of their scheduled wall time instead of 0-1 ms late. Events still run at their own
    simulated time, so the model's numbers do not depend on wakeup jitter at all.
    """

    EARLY_S = 0.0005  # wall seconds

    def __init__(self, sim: Simulation, loop: asyncio.AbstractEventLoop, scale: float = 1.0) -> None:
        self.sim = sim
        self.loop = loop
        self.scale = scale
        self._t0_loop = loop.time()
        self._t0_wall = time.time()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._running = False
        self.lag = 0.0  # wall seconds the last wakeup came after its event was due (server overloaded?)
        sim.on_schedule = self._on_schedule

    def now(self) -> float:
        """Simulated time corresponding to the wall clock right now (never behind processed events)."""
        return max((self.loop.time() - self._t0_loop) * self.scale, self.sim.now)

    def wall(self, t_sim: float) -> float:
        """The wall epoch at which simulated time ``t_sim`` is played."""
        return self._t0_wall + t_sim / self.scale

    def epoch(self, t_sim: float) -> float:
        """Simulated time ``t_sim`` on the engine's own clock as epoch seconds: the wall epoch of its
        time zero plus ``t_sim``. At ``--sim-time-scale`` F this clock runs F times as fast as the wall
        clock; every time the engine reports (log stamps, ``meta_info``) is on it, as a real engine
        reports on its own clock. At F = 1 it is the wall clock."""
        return self._t0_wall + t_sim

    def epoch_now(self) -> float:
        """The engine's clock now (:meth:`epoch` of the present)."""
        return self._t0_wall + self.now()

    def _on_schedule(self, t: float) -> None:
        if not self._running and t < self._timer_at:
            self._arm(t)

    def _arm(self, t: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = t
        self._timer = self.loop.call_at(self._t0_loop + t / self.scale - self.EARLY_S, self._fire)

    def _fire(self) -> None:
        due = self._timer_at
        self._timer = None
        self._timer_at = float("inf")
        self._running = True
        now = (self.loop.time() - self._t0_loop) * self.scale
        self.lag = max(now - due, 0.0) / self.scale
        try:
            self.sim.run_until(now + self.EARLY_S * self.scale)
        finally:
            self._running = False
        nxt = self.sim.peek()
        if nxt is not None:
            self._arm(nxt)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
