"""A load point as it runs in virtual time: until its numbers are known, not for a measurement's budget.

A measured point is capped by what a GPU hour affords (``workload.requests_per_concurrency`` requests
per stream, ``workload.max_point_s``). A predicted one costs milliseconds of CPU per virtual second, so
it runs until its throughput is known to ``workload.predicted.ci_target`` and its TTFT and ITL p99 to
``workload.predicted.latency_ci_target``, or until ``workload.predicted.budget_s`` seconds of measured
sends have passed on the engine's virtual clock, whichever comes first
(``workloads.window.StabilityTracker`` is the stop rule, the same one a measured point's throughput
follows). Its window is cut by the same rule as a measured point's.

A p99 needs a few hundred requests before its interval exists at all (the order statistic above it
must be among the samples), which at low concurrency takes most of the budget. The trial's own points
(the summary table, ``pred/``) wait for it. The candidates a diagnosis, the end of a sweep and a search
predict by the dozen are judged on the same footing as each other, their throughput to
``candidate_ci_target`` (±5 %: a verdict calls a change worth making at +5 %) or the budget, and each
carries its own intervals (throughput, and p99s where known) to say how sure it is: holding every
candidate to the trial's own targets would make a sweep's end three times as long.

Not changed: warm-up requests, the ramp, the load itself; a trace's point (the trace fixes its requests);
a point of multi-turn sessions keeps its count of sessions (its turns are planned up front), and runs
them all unless its numbers are known sooner.
"""

from __future__ import annotations

import dataclasses
import math

from orchestrator.config.schema import PredictedPointConf
from vocab.load import LoadPoint
from vocab.records import PointResult

# a closed-loop point's requests per stream when only the budget bounds it: far beyond what any target
# needs (the stop rule ends it long before), a guard that keeps the count finite
MAX_REQUESTS_PER_STREAM = 10_000
# a candidate's closed-loop point (``latency=False``) is also bounded by its count, three times the four
# per stream a measured search point sends: its budget in request durations. In seconds alone, a fast
# model's millisecond steps make 60 virtual seconds thousands of them, and a candidate whose requests
# run in step (fixed lengths) never settles to ±5 %; the search then judged half as many a minute
CANDIDATE_REQUESTS_PER_STREAM = 12


def in_virtual_time(point: LoadPoint, predicted: PredictedPointConf, latency: bool = True) -> LoadPoint:
    """``point`` as a prediction runs it (module docstring). ``latency=False``: one of the many
    candidates a diagnosis or a search compares (below): its throughput to ``candidate_ci_target``, or
    the budget."""
    if point.schedule is not None:
        return point
    budget = float(predicted.budget_s)
    targets = {"ci_target": float(predicted.ci_target if latency else predicted.candidate_ci_target),
               "latency_ci_target": float(predicted.latency_ci_target) if latency else None,
               "duration_s": budget}
    if point.sessions is not None:
        return dataclasses.replace(point, **targets)
    if point.concurrency is not None:
        per_stream = MAX_REQUESTS_PER_STREAM if latency else CANDIDATE_REQUESTS_PER_STREAM
        n = per_stream * point.concurrency
    else:
        assert point.rate is not None
        n = max(point.num_requests or 1, math.ceil(point.rate * budget))
    return dataclasses.replace(point, num_requests=n, **targets)


def budget_hits(results: list[PointResult]) -> list[str]:
    """The labels of the points run in virtual time that stopped at their budget before their numbers
    were known (their ``budget_hit`` metric)."""
    return [r.point.label for r in results if r.metrics.get("budget_hit") == 1.0]
