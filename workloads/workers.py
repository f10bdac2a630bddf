"""One load point over several worker processes, when one process is the limit.

The parent splits the point by request index (worker k sends indices ``i % N == k``), each worker
takes its share of the concurrency (closed loop) or of ``max_concurrency`` (open loop), and all
workers follow one open-loop schedule from a common start time agreed after every worker has
started and built its requests. Workers stream finished records back over a queue in small
batches; the parent is the only writer of the records file, calls ``on_progress``, merges the
records and every worker's event-loop lag samples, and computes the metrics and the verdict once,
over all records (so achieved concurrency and rate are the point's, not a worker's).

Workers are started with the ``spawn`` method (safe inside Ray workers and threads); each costs
~0.3 s to start. A worker that crashes makes the point raise ``RuntimeError`` with its traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import time
import traceback
from typing import Any

from vocab.load import LoadPoint, RequestSpec
from vocab.records import PointResult, RequestRecord

from . import clock
from .backend import normalize_url
from .shard import PointOptions, RecordSink, prepare_requests, resolve_model, run_shard, run_sync

BATCH_INTERVAL_S = 0.05
START_DELAY_S = 0.2


def _worker(
    k: int,
    n: int,
    base: str,
    point: LoadPoint,
    spec: RequestSpec,
    sock_read_timeout: float,
    read_timeout_setting: str,
    out: Any,
    start: Any,
    go: Any,
    engine_clock: tuple[float, float],
) -> None:
    try:
        with clock.engine_clock(*engine_clock):  # the parent's clock: the records join its own
            get_request = prepare_requests(spec, point, k, n)
            out.put(("ready", k, None))
            if not go.wait(120):
                return
            start_perf = clock.to_perf(start.value)
            batch: list[RequestRecord] = []
            last = time.perf_counter()

            def on_record(rec: RequestRecord) -> None:
                nonlocal last
                batch.append(rec)
                now = time.perf_counter()
                if now - last >= BATCH_INTERVAL_S:
                    out.put(("records", k, batch[:]))
                    batch.clear()
                    last = now

            async def main() -> list[float]:
                return await run_shard(
                    base,
                    point,
                    spec,
                    on_record,
                    shard=k,
                    shards=n,
                    start_perf=start_perf,
                    sock_read_timeout=sock_read_timeout,
                    read_timeout_setting=read_timeout_setting,
                    get_request=get_request,
                )

            lag = run_sync(main())
            if batch:
                out.put(("records", k, batch))
            out.put(("done", k, lag))
    except BaseException:
        out.put(("error", k, traceback.format_exc()))


def run_point_workers(
    url: str, point: LoadPoint, spec: RequestSpec, workers: int, opts: PointOptions
) -> PointResult:
    """Run ``point`` over ``workers`` processes; the records, progress and verdict are this process's."""
    base = normalize_url(url)
    spec = run_sync(resolve_model(base, spec))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Value("d", 0.0)
    go = ctx.Event()
    finished = 0
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                k,
                workers,
                base,
                point,
                spec,
                opts.sock_read_timeout,
                opts.read_timeout_setting,
                out,
                start,
                go,
                clock.in_force(),
            ),
            daemon=True,
        )
        for k in range(workers)
    ]
    lags: list[float] = []
    sink = RecordSink(point, opts)
    try:
        for p in procs:
            p.start()
        ready = 0
        while finished < workers:
            try:
                kind, k, payload = out.get(timeout=0.5)
            except queue_module.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"load generator worker exited with code {dead[0].exitcode}") from None
                continue
            if kind == "ready":
                ready += 1
                if ready == workers:
                    start.value = clock.now() + START_DELAY_S
                    go.set()
            elif kind == "records":
                for rec in payload:
                    sink.add(rec)
            elif kind == "done":
                lags.extend(payload)
                finished += 1
            else:
                raise RuntimeError(f"load generator worker {k} failed:\n{payload}")
    finally:
        sink.close()
        if finished < workers:  # an error or Ctrl-C: stop the rest instead of letting them start
            for p in procs:
                if p.is_alive():
                    p.kill()
        go.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return opts.finish(point, spec, sink.records, lags)
