"""One clock for every timestamp the load generator records.

``time.time()`` can jump (NTP slews, manual changes) and has coarse resolution on some
platforms, while ``time.perf_counter()`` is monotonic and precise but has an arbitrary origin.
We take one wall-clock base at import and add perf_counter deltas to it, so timestamps are
epoch seconds (joinable with telemetry sampled on the same host) *and* differences between
them are exact to the perf_counter resolution.
"""

from __future__ import annotations

import time

_WALL0 = time.time()
_PERF0 = time.perf_counter()


def now() -> float:
    """Current time as epoch seconds, monotonic for the life of the process."""
    return _WALL0 + (time.perf_counter() - _PERF0)


def to_perf(epoch: float) -> float:
    """Convert one of our epoch timestamps back to the perf_counter timeline (for sleeps)."""
    return epoch - _WALL0 + _PERF0


def from_perf(perf: float) -> float:
    """A ``time.perf_counter()`` value as one of our epoch timestamps."""
    return _WALL0 + (perf - _PERF0)
