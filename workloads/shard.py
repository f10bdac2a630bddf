"""One process's share of a load point, and what a point's records go through.

Used by :mod:`workloads.runner` (a point in this process) and :mod:`workloads.workers` (a point over
several processes), which both import from here and never from each other:

* :func:`prepare_requests` builds the request bodies of a shard before the point starts;
* :func:`run_shard` opens the connections, quiets the garbage collector, starts the lag monitor
  and sends the shard's requests on the scheduler's timetable, until done or until a
  :class:`PointStop` gives a reason to stop early;
* :class:`PointOptions`, :class:`RecordSink` and :func:`finish`: the point's settings, where its
  finished records go, and its metrics and verdict;
* :func:`resolve_model` and :func:`run_sync`: the OpenAI ``model`` field and the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from vocab.load import LoadPoint, RequestSpec
from vocab.records import STOPPED_EARLY, PointResult, RecordWriter, RequestRecord

from . import clock
from .backend import fetch_model, send_request
from .fasthttp import Pool
from .metrics import DEFAULT_LAG_THRESHOLD_MS, SLO, summarize, validity_reasons
from .payloads import PreparedRequest, build_request, prompt_ids
from .prefix_reuse import offered_reuse
from .scheduler import LagMonitor, drive, shard_share
from .window import StabilityTracker

ProgressFn = Callable[[int, int], None]
RecordFn = Callable[[RequestRecord], None]
# () -> None to go on, or a short reason to stop the point now ("engine exited with code -9")
StopFn = Callable[[], str | None]
T = TypeVar("T")

# Bodies are serialised before the point starts unless they would take more memory than this;
# then each is built just before it is sent (a few tens of microseconds per request).
PREBUILD_LIMIT_BYTES = 256 * 1024 * 1024
GC_THRESHOLD0 = 20_000
# How often a point asks its ``should_stop`` whether to stop: one timer per period on the loop, no
# cost per request; a dead engine is noticed within this (plus the caller's own detection time).
STOP_POLL_S = 0.2
# How often a point with a ``ci_target`` asks whether its throughput is known well enough (one pass
# over the point's token times in numpy each time; nothing per request)
STABLE_CHECK_S = 0.5


def prepare_requests(
    spec: RequestSpec, point: LoadPoint, shard: int = 0, shards: int = 1
) -> Callable[[int], PreparedRequest]:
    """Request index -> its prepared request, for the indices of this shard.

    Built up front when the point has a known count and the bodies fit in
    :data:`PREBUILD_LIMIT_BYTES`; otherwise each is built when asked for.
    """
    n = point.measured_requests
    if n is None:  # closed loop bounded by time: the count is unknown, build each just in time
        return lambda i: build_request(spec, i)
    indices = shard_indices(point, shard, shards)
    if spec.source is None and len(indices) * (spec.input_len * 7 + 256) > PREBUILD_LIMIT_BYTES:
        return lambda i: build_request(spec, i)
    built: dict[int, PreparedRequest] = {}
    size = 0
    for i in indices:
        built[i] = req = build_request(spec, i)
        size += len(req.body)
        if size > PREBUILD_LIMIT_BYTES:  # a source's lengths are only known once built
            return lambda i: built[i] if i in built else build_request(spec, i)
    return built.__getitem__


def shard_indices(point: LoadPoint, shard: int, shards: int) -> Sequence[int]:
    """The request indices this shard sends: ``i % shards == shard``, or with sessions the turns of
    the sessions ``s % shards == shard`` (a session's turns stay in one process, in order)."""
    total = point.total_requests
    if point.sessions is None:
        return range(shard, total, shards)
    starts = point.session_starts()
    return [i for s in range(shard, len(point.sessions), shards)
            for i in range(starts[s], min(starts[s + 1], total))]


def connections_ahead(point: LoadPoint, shard: int = 0, shards: int = 1) -> int:
    """Connections to open before a point starts: one per closed-loop worker of this shard.

    Open loop opens none: its requests leave over time, and a cap may never be reached.
    """
    if point.concurrency is None:
        return 0
    n = shard_share(point.concurrency, shard, shards)
    if point.sessions is not None:
        return min(n, len(range(shard, len(point.sessions), shards)))
    if point.num_requests is not None:
        n = min(n, len(range(shard, point.warmup_requests + point.num_requests, shards)))
    return n


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep the garbage collector from stalling the event loop while a point runs.

    orjson makes a few dicts per event, so the collector runs often, and a full collection walks
    every object of the process (tens of ms: a TTFT/ITL spike). Freezing what exists now and
    collecting the young generation less often removes those pauses; both are restored on exit.
    """
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


class PointStop:
    """Stops a point early when ``should_stop`` gives a reason.

    :meth:`watch` runs the point's sending as a task and waits for it in slices of
    :data:`STOP_POLL_S`, asking between slices: one timer per slice and nothing per request. A
    request that cannot connect asks at once (:meth:`check`) and, if there is no reason yet, holds
    its sender back for one poll, so a dead engine does not burn the rest of the point on refused
    connections in the meantime. On a reason the sending task is
    cancelled: nothing more is sent, and each request still in flight is cancelled and recorded as
    ``aborted`` (see :func:`run_shard`). The first reason is kept in :attr:`reason`.
    """

    def __init__(self, should_stop: StopFn) -> None:
        self.should_stop = should_stop
        self.reason: str | None = None
        self._task: asyncio.Future[None] | None = None

    def check(self) -> bool:
        """Ask now; on a reason keep it and cancel the sending. True when the point is stopping."""
        if self.reason is None:
            self.reason = self.should_stop() or None
            if self.reason is not None and self._task is not None:
                self._task.cancel()
        return self.reason is not None

    async def watch(self, sending: Coroutine[Any, Any, None]) -> None:
        self._task = task = asyncio.ensure_future(sending)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=STOP_POLL_S)
                if not task.done():
                    self.check()
            if not task.cancelled():
                task.result()  # a failure of the scheduler itself is raised, not swallowed
        finally:
            if not task.done():  # this coroutine itself was cancelled (Ctrl-C): the sending goes too
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


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
    read_timeout_setting: str = "sock_read_timeout",
    get_request: Callable[[int], PreparedRequest] | None = None,
    stop: PointStop | None = None,
) -> list[float]:
    """Send this process's share of ``point``; ``on_record`` gets each finished request.

    Returns the event-loop lag samples (ms). ``spec.model`` must already be resolved. With ``stop``,
    the point ends early when it gives a reason (``stop.reason`` says which): requests in flight
    are recorded with ``error_kind`` ``aborted`` and an end time of now; unsent ones are not sent.
    """
    label = point.label
    warmup = point.warmup_requests
    if get_request is None:
        get_request = prepare_requests(spec, point, shard, shards)
    api = spec.api
    pool = Pool(base, read_timeout=sock_read_timeout, read_timeout_setting=read_timeout_setting)
    rule = StopRule(point)

    async def send(i: int, scheduled: float | None) -> None:
        if stop is not None and stop.reason is not None:
            return  # stopping: send nothing more (the cancellation reaches every sender soon)
        req = get_request(i)
        rec = RequestRecord(
            point=label, index=i, warmup=i < warmup, scheduled_time=scheduled, input_tokens=req.input_tokens
        )
        rule.sent(rec)
        try:
            await send_request(pool, req, api, rec)
        except asyncio.CancelledError:
            if stop is not None and stop.reason is not None:
                # stopped early: the request was sent and never answered; keep it (end time: now)
                rec.error_kind, rec.error = "aborted", f"aborted: {stop.reason}"
                on_record(rec)
            raise
        rule.ended(rec)
        on_record(rec)
        if rec.error_kind == "connect" and stop is not None and not stop.check():
            # A refused connection: the engine may be dying. Its port closes a moment before its exit
            # can be seen, so this sender waits for one more poll instead of burning the rest of the
            # point on refused connections in the meantime.
            await asyncio.sleep(STOP_POLL_S)

    lag = LagMonitor()
    try:
        # Before the clock and the lag monitor start: connects are not load.
        await pool.open(connections_ahead(point, shard, shards))
        with quiet_gc():
            # Asked only now: the first question starts the point's time (workload.point_timeout_s),
            # and the full collection before it takes seconds in a large process on a busy machine
            # (10 s of a 20 s limit was measured beside two CPU burners)
            if stop is not None and stop.check():
                return lag.samples_ms  # e.g. the engine died between points: send nothing
            lag.start()
            try:
                sending = drive(point, send, shard=shard, shards=shards, start_perf=start_perf,
                                enough=rule.enough)
                async with rule.watching():
                    await (sending if stop is None else stop.watch(sending))
            finally:
                await lag.stop()
    finally:
        pool.close()
    return lag.samples_ms


class StopRule:
    """The point's stop rule on the live loop: every :data:`STABLE_CHECK_S` it asks the
    :class:`~workloads.window.StabilityTracker` (when the point has a ``ci_target``) and, once the
    window's throughput is known well enough, tells the scheduler to send nothing more."""

    def __init__(self, point: LoadPoint) -> None:
        self.tracker = StabilityTracker(point, point.ci_target) if point.ci_target is not None else None
        self.reached = False

    def sent(self, rec: RequestRecord) -> None:
        if self.tracker is not None:
            self.tracker.sent(rec.index, clock.now(), rec.warmup)

    def ended(self, rec: RequestRecord) -> None:
        if self.tracker is not None:
            self.tracker.ended(rec)

    def enough(self) -> bool:
        return self.reached

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self._watch()) if self.tracker is not None else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _watch(self) -> None:
        assert self.tracker is not None
        while not self.reached:
            await asyncio.sleep(STABLE_CHECK_S)
            self.reached = self.tracker.stable(clock.now())


async def resolve_model(base: str, spec: RequestSpec) -> RequestSpec:
    """Fill ``spec.model`` from ``GET /v1/models`` for the OpenAI APIs when it is None."""
    if spec.api == "generate" or spec.model is not None:
        return spec
    return dataclasses.replace(spec, model=await fetch_model(base))


@dataclass(frozen=True)
class PointOptions:
    """The keyword arguments of ``run_point`` / ``run_point_async``, passed on as one value."""

    records_path: Path | None = None
    on_progress: ProgressFn | None = None
    sock_read_timeout: float = 300.0
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS
    slo: SLO | None = None
    should_stop: StopFn | None = None
    read_timeout_setting: str = "sock_read_timeout"

    def finish(
        self, point: LoadPoint, spec: RequestSpec, records: list[RequestRecord], lag_ms: list[float],
        stopped: str | None = None,
    ) -> PointResult:
        result = finish(
            point, records, lag_ms, lag_threshold_ms=self.lag_threshold_ms, slo=self.slo, stopped=stopped
        )
        # what the prompts sent offered a prefix cache (from their ids: known here, not in the records)
        result.metrics.update(offered_reuse(result.records, lambda i: prompt_ids(spec, i)))
        return result


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


def finish(
    point: LoadPoint,
    records: list[RequestRecord],
    lag_ms: list[float],
    *,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    slo: SLO | None = None,
    stopped: str | None = None,
) -> PointResult:
    """Metrics and verdict from the (merged) records of a point; ``stopped``: why it ended early."""
    records = sorted(records, key=lambda r: r.index)
    metrics = summarize(records, point, lag_ms=lag_ms, lag_threshold_ms=lag_threshold_ms, slo=slo)
    reasons = validity_reasons(metrics, point, lag_threshold_ms=lag_threshold_ms)
    if stopped is not None:  # a point cut short never measured the load it claims
        reasons.insert(0, STOPPED_EARLY + stopped)
        metrics["valid"] = 0.0
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
