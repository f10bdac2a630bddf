"""One clock for every timestamp the load generator records.

``time.time()`` can jump (NTP slews, manual changes) and has coarse resolution on some
platforms, while ``time.perf_counter()`` is monotonic and precise but has an arbitrary origin.
We take one wall-clock base at import and add perf_counter deltas to it, so timestamps are
epoch seconds (joinable with telemetry sampled on the same host) *and* differences between
them are exact to the perf_counter resolution.

A simulated engine can run faster (or slower) than real time (``--sim-time-scale F``: F of its
seconds per wall second). Measured on the wall clock its latencies would be F times short and its
rates F times high; so, while such an engine is measured, :func:`engine_clock` makes this clock read
the engine's own seconds instead: ``origin + F * (wall - origin)``, where ``origin`` is the wall
epoch of the engine's time zero. Every timestamp taken through this module then lands on the
engine's timeline (the one its logs, ``meta_info`` and ``/metrics`` use), and every duration the
load generator reads off it is in the engine's seconds. Sleeps are wall time: :func:`wall_span`
turns a span of the engine's seconds into the wall seconds to wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

_WALL0 = time.time()
_PERF0 = time.perf_counter()
# the engine clock in force: F engine seconds per wall second, from the wall epoch ``_ORIGIN``
_SCALE = 1.0
_ORIGIN = 0.0


def _wall(perf: float) -> float:
    return _WALL0 + (perf - _PERF0)


def now() -> float:
    """Current time as epoch seconds (on the engine's clock inside :func:`engine_clock`), monotonic
    for the life of the process."""
    return from_perf(time.perf_counter())


def to_perf(epoch: float) -> float:
    """Convert one of our epoch timestamps back to the perf_counter timeline (for sleeps)."""
    return _ORIGIN + (epoch - _ORIGIN) / _SCALE - _WALL0 + _PERF0


def from_perf(perf: float) -> float:
    """A ``time.perf_counter()`` value as one of our epoch timestamps."""
    return _ORIGIN + (_wall(perf) - _ORIGIN) * _SCALE


def wall_span(seconds: float) -> float:
    """The wall seconds that hold ``seconds`` of this clock's (what to sleep, or wait)."""
    return seconds / _SCALE


def engine_span(wall_seconds: float) -> float:
    """A span measured on the wall clock (``time.perf_counter`` differences) in this clock's seconds."""
    return wall_seconds * _SCALE


def in_force() -> tuple[float, float]:
    """The engine clock in force, as :func:`engine_clock` takes it: (seconds per wall second, origin);
    (1.0, 0.0) is the wall clock. For handing the same clock to another process."""
    return _SCALE, _ORIGIN


@contextmanager
def engine_clock(seconds_per_wall_second: float, origin: float) -> Iterator[None]:
    """Read the engine's seconds while the block runs: an engine that plays ``seconds_per_wall_second``
    of its time per wall second, whose time zero was the wall epoch ``origin``. For the whole process
    (the sampler threads stamp their rows on it too); the clock in force before is restored after."""
    global _SCALE, _ORIGIN
    if not seconds_per_wall_second > 0:
        raise ValueError(f"engine_clock: seconds per wall second must be > 0, got {seconds_per_wall_second}")
    before = _SCALE, _ORIGIN
    _SCALE, _ORIGIN = float(seconds_per_wall_second), float(origin)
    try:
        yield
    finally:
        _SCALE, _ORIGIN = before
