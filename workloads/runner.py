"""Run one load point end to end: session, requests, schedule, records, metrics, self-check."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .backend import fetch_model, make_session, normalize_url, send_request
from .metrics import DEFAULT_LAG_THRESHOLD_MS, summarize, validity_reasons
from .payloads import PreparedRequest, RequestSpec, build_request
from .records import RecordWriter, RequestRecord
from .scheduler import LagMonitor, LoadPoint, drive

ProgressFn = Callable[[int, int], None]
T = TypeVar("T")

# Bodies are serialised before the point starts unless they would take more memory than this;
# then each is built just before it is sent (a few tens of microseconds per request).
PREBUILD_LIMIT_BYTES = 256 * 1024 * 1024


@dataclass
class PointResult:
    """Outcome of one load point. ``invalid_reasons`` is empty iff ``metrics['valid'] == 1``."""

    point: LoadPoint
    metrics: dict[str, float]
    invalid_reasons: list[str] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons


def _prepare(spec: RequestSpec, total: int) -> Callable[[int], PreparedRequest]:
    est = total * (spec.input_len * 7 + 256)
    if est > PREBUILD_LIMIT_BYTES:
        return lambda i: build_request(spec, i)
    built = [build_request(spec, i) for i in range(total)]
    return built.__getitem__


async def run_point_async(
    url: str,
    point: LoadPoint,
    spec: RequestSpec,
    *,
    records_path: Path | None = None,
    on_progress: ProgressFn | None = None,
    sock_read_timeout: float = 300.0,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
) -> PointResult:
    """:func:`run_point` for callers that already run an event loop."""
    base = normalize_url(url)
    total = point.total_requests
    label = point.label
    records: list[RequestRecord | None] = [None] * total
    done = 0
    writer = RecordWriter(records_path) if records_path is not None else None
    lag = LagMonitor()
    try:
        async with make_session(sock_read_timeout=sock_read_timeout) as session:
            if spec.api != "generate" and spec.model is None:
                spec = dataclasses.replace(spec, model=await fetch_model(session, base))
            get_request = _prepare(spec, total)

            async def send(i: int, scheduled: float | None) -> None:
                nonlocal done
                req = get_request(i)
                rec = RequestRecord(
                    point=label,
                    index=i,
                    warmup=i < point.warmup_requests,
                    scheduled_time=scheduled,
                    input_tokens=req.input_tokens,
                )
                await send_request(session, base, req, spec.api, rec)
                records[i] = rec
                if writer is not None:
                    writer.write(rec)
                if not rec.warmup:
                    done += 1
                    if on_progress is not None:
                        on_progress(done, point.num_requests)

            lag.start()
            try:
                await drive(point, send)
            finally:
                await lag.stop()
    finally:
        if writer is not None:
            writer.close()

    metrics = summarize(records, point, lag_ms=lag.samples_ms, lag_threshold_ms=lag_threshold_ms)
    reasons = validity_reasons(metrics, point, lag_threshold_ms=lag_threshold_ms)
    return PointResult(point, metrics, reasons, [r for r in records if r is not None])


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
) -> PointResult:
    """Drive ``point`` against the server at ``url`` and return its metrics and records.

    Runs its own event loop, so call it from synchronous code. ``on_progress(done, total)`` is
    called after each measured request (keep it cheap: it runs on the load generator's loop).
    With ``records_path`` each finished request is appended to that JSONL file as it finishes.
    """
    return run_sync(
        run_point_async(
            url,
            point,
            spec,
            records_path=records_path,
            on_progress=on_progress,
            sock_read_timeout=sock_read_timeout,
            lag_threshold_ms=lag_threshold_ms,
        )
    )
