"""Run one load point end to end: connections, requests, schedule, records, metrics, self-check."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from vocab.load import LoadPoint, RequestSpec
from vocab.records import PointResult, RecordWriter, RequestRecord

from .backend import fetch_model, make_session, normalize_url, send_request, send_request_fast
from .fasthttp import Pool
from .metrics import DEFAULT_LAG_THRESHOLD_MS, SLO, summarize, validity_reasons
from .payloads import PreparedRequest, build_request
from .scheduler import LagMonitor, drive, shard_share

ProgressFn = Callable[[int, int], None]
RecordFn = Callable[[RequestRecord], None]
T = TypeVar("T")

# Bodies are serialised before the point starts unless they would take more memory than this;
# then each is built just before it is sent (a few tens of microseconds per request).
PREBUILD_LIMIT_BYTES = 256 * 1024 * 1024
HTTP_CLIENTS = ("fast", "aiohttp")
GC_THRESHOLD0 = 20_000


def _prepare(
    spec: RequestSpec, point: LoadPoint, shard: int, shards: int
) -> Callable[[int], PreparedRequest]:
    n = point.measured_requests
    if n is None:  # closed loop bounded by time: the count is unknown, build each just in time
        return lambda i: build_request(spec, i)
    indices = range(shard, point.warmup_requests + n, shards)
    est = len(indices) * (spec.input_len * 7 + 256)
    if est > PREBUILD_LIMIT_BYTES:
        return lambda i: build_request(spec, i)
    built = {i: build_request(spec, i) for i in indices}
    return built.__getitem__


async def run_shard(
    base: str,
    point: LoadPoint,
    spec: RequestSpec,
    on_record: RecordFn,
    *,
    shard: int = 0,
    shards: int = 1,
    start_perf: float | None = None,
    sock_read_timeout: float = 300.0,
    http: str = "fast",
    get_request: Callable[[int], PreparedRequest] | None = None,
) -> list[float]:
    """Send this process's share of ``point``; ``on_record`` gets each finished request.

    Returns the event-loop lag samples (ms). ``spec.model`` must already be resolved.
    """
    if http not in HTTP_CLIENTS:
        raise ValueError(f"http must be one of {', '.join(HTTP_CLIENTS)}, got {http!r}")
    label = point.label
    warmup = point.warmup_requests
    if get_request is None:
        get_request = _prepare(spec, point, shard, shards)
    lag = LagMonitor()
    pool = Pool(base, read_timeout=sock_read_timeout) if http == "fast" else None
    session = make_session(sock_read_timeout=sock_read_timeout) if pool is None else None
    api = spec.api

    async def send(i: int, scheduled: float | None) -> None:
        req = get_request(i)
        rec = RequestRecord(
            point=label, index=i, warmup=i < warmup, scheduled_time=scheduled, input_tokens=req.input_tokens
        )
        if pool is not None:
            await send_request_fast(pool, req, api, rec)
        else:
            assert session is not None
            await send_request(session, base, req, api, rec)
        on_record(rec)

    if pool is not None:
        try:  # before the clock and the lag monitor start: connects are not load
            await pool.open(_connections_ahead(point, shard, shards))
        except BaseException:
            pool.close()
            raise

    # Garbage collection: orjson makes a few dicts per event, so the collector runs often, and a
    # full collection walks every object of the process (tens of ms: a TTFT/ITL spike). Freezing
    # what exists now and collecting the young generations less often removes those pauses.
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, 50, 1000)
    lag.start()
    try:
        await drive(point, send, shard=shard, shards=shards, start_perf=start_perf)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        await lag.stop()
        if pool is not None:
            pool.close()
        if session is not None:
            await session.close()
    return lag.samples_ms


def _connections_ahead(point: LoadPoint, shard: int, shards: int) -> int:
    """Connections to open before a point starts: one per closed-loop worker of this shard.

    Open loop opens none: its requests leave over time, and a cap may never be reached.
    """
    if point.concurrency is None:
        return 0
    n = shard_share(point.concurrency, shard, shards)
    if point.num_requests is not None:
        n = min(n, len(range(shard, point.warmup_requests + point.num_requests, shards)))
    return n


async def resolve_model(base: str, spec: RequestSpec) -> RequestSpec:
    """Fill ``spec.model`` from ``GET /v1/models`` for the OpenAI APIs when it is None."""
    if spec.api == "generate" or spec.model is not None:
        return spec
    async with make_session(sock_read_timeout=10.0) as session:
        return dataclasses.replace(spec, model=await fetch_model(session, base))


@dataclass(frozen=True)
class PointOptions:
    """The keyword arguments of :func:`run_point` / :func:`run_point_async`, passed on as one value."""

    records_path: Path | None = None
    on_progress: ProgressFn | None = None
    sock_read_timeout: float = 300.0
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS
    http: str = "fast"
    slo: SLO | None = None

    def finish(self, point: LoadPoint, records: list[RequestRecord], lag_ms: list[float]) -> PointResult:
        return finish(point, records, lag_ms, lag_threshold_ms=self.lag_threshold_ms, slo=self.slo)


class RecordSink:
    """Where a point's finished records go: kept, appended to the records file, counted for progress."""

    def __init__(self, point: LoadPoint, opts: PointOptions) -> None:
        self.records: list[RequestRecord] = []
        self.done = 0
        self.total = point.measured_requests or 0
        self.on_progress = opts.on_progress
        self.writer = RecordWriter(opts.records_path) if opts.records_path is not None else None

    def add(self, rec: RequestRecord) -> None:
        self.records.append(rec)
        if self.writer is not None:
            self.writer.write(rec)
        if not rec.warmup:
            self.done += 1
            if self.on_progress is not None:
                self.on_progress(self.done, max(self.total, self.done))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def run_point_async(
    url: str,
    point: LoadPoint,
    spec: RequestSpec,
    *,
    records_path: Path | None = None,
    on_progress: ProgressFn | None = None,
    sock_read_timeout: float = 300.0,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    http: str = "fast",
    slo: SLO | None = None,
) -> PointResult:
    """:func:`run_point` for callers that already run an event loop (always one process)."""
    opts = PointOptions(records_path, on_progress, sock_read_timeout, lag_threshold_ms, http, slo)
    return await _run_point_async(url, point, spec, opts)


async def _run_point_async(url: str, point: LoadPoint, spec: RequestSpec, opts: PointOptions) -> PointResult:
    base = normalize_url(url)
    sink = RecordSink(point, opts)
    try:
        spec = await resolve_model(base, spec)
        lag_ms = await run_shard(
            base, point, spec, sink.add, sock_read_timeout=opts.sock_read_timeout, http=opts.http
        )
    finally:
        sink.close()
    return opts.finish(point, sink.records, lag_ms)


def finish(
    point: LoadPoint,
    records: list[RequestRecord],
    lag_ms: list[float],
    *,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    slo: SLO | None = None,
) -> PointResult:
    """Metrics and verdict from the (merged) records of a point."""
    records = sorted(records, key=lambda r: r.index)
    metrics = summarize(records, point, lag_ms=lag_ms, lag_threshold_ms=lag_threshold_ms, slo=slo)
    reasons = validity_reasons(metrics, point, lag_threshold_ms=lag_threshold_ms)
    return PointResult(point, metrics, reasons, records)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh event loop (uvloop when installed: about half the CPU per event)."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        factory = None
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError("run_point() was called inside a running event loop; await run_point_async()")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def run_point(
    url: str,
    point: LoadPoint,
    spec: RequestSpec,
    *,
    records_path: Path | None = None,
    on_progress: ProgressFn | None = None,
    sock_read_timeout: float = 300.0,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    http: str = "fast",
    slo: SLO | None = None,
    workers: int = 1,
) -> PointResult:
    """Drive ``point`` against the server at ``url`` and return its metrics and records.

    Runs its own event loop, so call it from synchronous code. ``on_progress(done, total)`` is
    called after each measured request (keep it cheap: it runs on the load generator's loop;
    ``total`` is 0 while unknown, for a closed-loop point bounded by duration). With
    ``records_path`` each finished request is appended to that JSONL file as it finishes.
    ``workers`` > 1 splits the point over that many processes (see :mod:`workloads.workers`).
    ``http`` picks the client: ``fast`` (parasweep's own, the default) or ``aiohttp``.
    ``slo`` adds goodput metrics (requests meeting every given latency bound).
    """
    opts = PointOptions(records_path, on_progress, sock_read_timeout, lag_threshold_ms, http, slo)
    if workers > 1:
        from .workers import run_point_workers

        return run_point_workers(url, point, spec, workers, opts)
    return run_sync(_run_point_async(url, point, spec, opts))
