"""The load generator's clock on a time-scaled simulated engine's seconds (``workloads.clock``)."""

from __future__ import annotations

import time

import pytest

from workloads import clock


def test_outside_an_engine_clock_it_reads_the_wall_clock() -> None:
    assert clock.in_force() == (1.0, 0.0)
    assert abs(clock.now() - time.time()) < 0.5
    assert clock.wall_span(3.0) == clock.engine_span(3.0) == 3.0


def test_inside_it_reads_the_engines_seconds_and_converts_spans_and_sleeps_back() -> None:
    origin = clock.now() - 10.0  # the engine's time zero: ten wall seconds ago
    wall_before = clock.now()
    with clock.engine_clock(4.0, origin):
        assert clock.in_force() == (4.0, origin)
        # the engine has played 40 of its seconds in those ten wall seconds
        assert clock.now() - origin == pytest.approx(4.0 * (wall_before - origin), abs=0.5)
        # a wall span between two perf_counter instants is four times as long on it (to the ~0.2 us
        # an epoch's float resolves)
        p0 = time.perf_counter()
        assert clock.from_perf(p0 + 0.05) - clock.from_perf(p0) == pytest.approx(0.2, abs=1e-6)
        # a timestamp maps back to the perf_counter instant it stands for, to sleep until it
        assert clock.to_perf(clock.from_perf(p0)) == pytest.approx(p0, abs=1e-6)
        assert clock.wall_span(8.0) == 2.0 and clock.engine_span(0.5) == 2.0
    assert clock.in_force() == (1.0, 0.0)  # restored
    assert abs(clock.now() - time.time()) < 0.5


def test_a_scale_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0, got 0"), clock.engine_clock(0.0, 0.0):
        pass
    assert clock.in_force() == (1.0, 0.0)
