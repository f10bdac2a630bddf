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
from .shard import (
    PointOptions,
    PointStop,
    ProgressFn,
    RecordSink,
    StopFn,
    resolve_model,
    run_shard,
    run_sync,
)
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
    should_stop: StopFn | None = None,
    read_timeout_setting: str = "sock_read_timeout",
) -> PointResult:
    """:func:`run_point` for callers that already run an event loop (always one process)."""
    opts = PointOptions(
        records_path, on_progress, sock_read_timeout, lag_threshold_ms, slo, should_stop, read_timeout_setting
    )
    return await _run_here(url, point, spec, opts)


async def _run_here(url: str, point: LoadPoint, spec: RequestSpec, opts: PointOptions) -> PointResult:
    base = normalize_url(url)
    sink = RecordSink(point, opts)
    stop = PointStop(opts.should_stop) if opts.should_stop is not None else None
    try:
        spec = await resolve_model(base, spec)
        lag_ms = await run_shard(
            base,
            point,
            spec,
            sink.add,
            sock_read_timeout=opts.sock_read_timeout,
            read_timeout_setting=opts.read_timeout_setting,
            stop=stop,
        )
    finally:
        sink.close()
    return opts.finish(point, spec, sink.records, lag_ms, stop.reason if stop is not None else None)


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
    should_stop: StopFn | None = None,
    read_timeout_setting: str = "sock_read_timeout",
) -> PointResult:
    """Drive ``point`` against the server at ``url`` and return its metrics and records.

    Runs its own event loop, so call it from synchronous code. ``on_progress(done, total)`` is
    called after each measured request (keep it cheap: it runs on the load generator's loop;
    ``total`` is 0 while unknown, for a closed-loop point bounded by duration). With
    ``records_path`` each finished request is appended to that JSONL file as it finishes.
    ``workers`` > 1 splits the point over that many processes (see :mod:`workloads.workers`).
    ``slo`` adds goodput metrics (requests meeting every given latency bound).

    ``sock_read_timeout``: a request that receives nothing for this long fails as ``timeout``
    (stalled), and its error names ``read_timeout_setting``, the setting that changes it.

    ``should_stop`` is asked every 0.2 s on the loop (keep it cheap and non-blocking). When it returns
    a reason, the point stops: nothing more is sent, requests in flight are cancelled and recorded
    (``error_kind`` ``aborted``, error ``"aborted: <reason>"``, end time now), and the result is
    returned at once with ``"stopped early: <reason>"`` first among its invalid reasons. Only with
    one process: with ``workers`` > 1 it raises ``ValueError`` (the records in flight in the worker
    processes could not be kept on a stop).
    """
    opts = PointOptions(
        records_path, on_progress, sock_read_timeout, lag_threshold_ms, slo, should_stop, read_timeout_setting
    )
    if workers > 1:
        if should_stop is not None:
            raise ValueError("run_point: should_stop needs workers=1")
        return run_point_workers(url, point, spec, workers, opts)
    return run_sync(_run_here(url, point, spec, opts))
