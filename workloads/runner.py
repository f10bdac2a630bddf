"""Run one load point end to end and return its :class:`~vocab.records.PointResult`.

In this process (:func:`run_point_async`, or :func:`run_point` on its own event loop), or over
several worker processes (:func:`run_point` with ``workers`` > 1, see :mod:`workloads.workers`).
The pieces both share live in :mod:`workloads.shard`.
"""

from __future__ import annotations

from pathlib import Path

from vocab.load import LoadPoint, RequestSpec
from vocab.records import PointResult

from .backend import normalize_url
from .metrics import DEFAULT_LAG_THRESHOLD_MS, SLO
from .shard import PointOptions, ProgressFn, RecordSink, resolve_model, run_shard, run_sync
from .workers import run_point_workers


async def run_point_async(
    url: str,
    point: LoadPoint,
    spec: RequestSpec,
    *,
    records_path: Path | None = None,
    on_progress: ProgressFn | None = None,
    sock_read_timeout: float = 300.0,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    slo: SLO | None = None,
) -> PointResult:
    """:func:`run_point` for callers that already run an event loop (always one process)."""
    opts = PointOptions(records_path, on_progress, sock_read_timeout, lag_threshold_ms, slo)
    return await _run_here(url, point, spec, opts)


async def _run_here(url: str, point: LoadPoint, spec: RequestSpec, opts: PointOptions) -> PointResult:
    base = normalize_url(url)
    sink = RecordSink(point, opts)
    try:
        spec = await resolve_model(base, spec)
        lag_ms = await run_shard(base, point, spec, sink.add, sock_read_timeout=opts.sock_read_timeout)
    finally:
        sink.close()
    return opts.finish(point, sink.records, lag_ms)


def run_point(
    url: str,
    point: LoadPoint,
    spec: RequestSpec,
    *,
    records_path: Path | None = None,
    on_progress: ProgressFn | None = None,
    sock_read_timeout: float = 300.0,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    slo: SLO | None = None,
    workers: int = 1,
) -> PointResult:
    """Drive ``point`` against the server at ``url`` and return its metrics and records.

    Runs its own event loop, so call it from synchronous code. ``on_progress(done, total)`` is
    called after each measured request (keep it cheap: it runs on the load generator's loop;
    ``total`` is 0 while unknown, for a closed-loop point bounded by duration). With
    ``records_path`` each finished request is appended to that JSONL file as it finishes.
    ``workers`` > 1 splits the point over that many processes (see :mod:`workloads.workers`).
    ``slo`` adds goodput metrics (requests meeting every given latency bound).
    """
    opts = PointOptions(records_path, on_progress, sock_read_timeout, lag_threshold_ms, slo)
    if workers > 1:
        return run_point_workers(url, point, spec, workers, opts)
    return run_sync(_run_here(url, point, spec, opts))
