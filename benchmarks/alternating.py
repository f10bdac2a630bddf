"""Timing two variants of the same work against each other: run alternately, so the machine's noise hits
both alike, and compare medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def alternating_medians(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall seconds of each variant over ``repeats`` rounds, the variants taking turns."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}
