"""One closed-loop job on one HTTP client, measured from inside the client process.

    .venv/bin/python benchmarks/loadgen_clients.py --url http://127.0.0.1:PORT --client fast|aiohttp \
        --concurrency 64 --requests 2000 --output-len 8 --ttft-ms 1 --itl-ms 1 [--input-len 128]

``benchmarks/loadgen_bench.py`` runs this once per client, concurrency and repetition against the
loopback server (``python -m workloads.loopback``) and compares the clients. Both clients do the same
job through the same harness: request bodies built before the point, connections opened before the
clock starts (one per closed-loop worker), the collector quieted as ``workloads`` does it, the load
generator's own scheduler (``drive``) and event-loop lag monitor, every SSE event parsed, validated
and accounted into a ``RequestRecord`` by the same code. Only the HTTP layer differs:

* ``fast``: parasweep's client (``workloads.fasthttp.Pool`` + ``workloads.backend.send_request``), the
  code ``python -m workloads`` runs.
* ``aiohttp``: aiohttp as well tuned as we know how, *with pre-opened connections*. One session, a
  ``TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60)``, no total timeout,
  ``read_bufsize`` 4 MiB, no decompression, and before the clock starts C concurrent ``GET /health``
  requests that leave C warm keep-alive connections in the pool (counted with a trace hook: the
  point itself must open none). Each response is read with ``iter_any()`` and the end of the
  chunked body is drained after ``[DONE]`` so the connection goes back to the pool. This is the
  aiohttp send path the load generator had, kept here so the comparison can be rerun.

It prints one JSON object: ``request_s``, ``output_tok_s``, ``cpu_s`` (process CPU while the point
ran), ``cpu_us_per_request``, ``cpu_us_per_event``, ``chunk_lag_p50_ms`` / ``_p99_ms`` (how long after
the server's timetable said a token was due the client timestamped the read that brought it),
``client_lag_p99_ms`` (the event-loop ticker), ``errors``, ``connections_during_point``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from typing import Protocol

import aiohttp
import numpy as np
import orjson

from workloads import LoadPoint, RequestRecord, RequestSpec, clock, summarize
from workloads.backend import account_events, normalize_url, send_request
from workloads.fasthttp import Pool
from workloads.payloads import PreparedRequest, build_request
from workloads.scheduler import LagMonitor, drive
from workloads.shard import quiet_gc, run_sync
from workloads.sse import SSEParser
from workloads.streams import StreamError, make_stream


class Client(Protocol):
    async def open(self, n: int) -> None: ...

    async def send(self, req: PreparedRequest, api: str, rec: RequestRecord) -> None: ...

    async def close(self) -> None: ...

    def connections_opened(self) -> int: ...


class FastClient:
    def __init__(self, base: str) -> None:
        self.pool = Pool(base)
        self.opened = 0

    async def open(self, n: int) -> None:
        self.opened = await self.pool.open(n)

    async def send(self, req: PreparedRequest, api: str, rec: RequestRecord) -> None:
        await send_request(self.pool, req, api, rec)

    async def close(self) -> None:
        self.pool.close()

    def connections_opened(self) -> int:
        return self.pool.connections_opened


# auto_decompress=False only stops aiohttp decoding; also ask the server not to compress.
HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity", "Accept": "text/event-stream"}


class AiohttpClient:
    """The aiohttp send path, tuned, with C connections opened and warmed before the point."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.created = 0
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(self._on_create)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
            read_bufsize=4 * 1024 * 1024,
            auto_decompress=False,
            headers=HEADERS,
            trace_configs=[trace],
        )

    async def _on_create(self, *_: object) -> None:
        self.created += 1

    async def open(self, n: int) -> None:
        async def warm() -> None:
            async with self.session.get(self.base + "/health") as resp:
                await resp.read()

        await asyncio.gather(*(warm() for _ in range(n)))

    def connections_opened(self) -> int:
        return self.created

    async def send(self, req: PreparedRequest, api: str, rec: RequestRecord) -> None:
        state = make_stream(api)
        parser = SSEParser()
        now = clock.now
        rec.send_time = now()
        try:
            async with self.session.post(self.base + req.path, data=req.body) as resp:
                rec.first_byte_time = now()
                rec.http_status = resp.status
                if resp.status >= 400:
                    raise StreamError("http_5xx" if resp.status >= 500 else "http_4xx", f"HTTP {resp.status}")
                done = False
                async for data in resp.content.iter_any():
                    t = now()
                    events = parser.feed(data)
                    if events and account_events(events, state, t, rec):
                        done = True
                        break
                if done:
                    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                        async with asyncio.timeout(1.0):
                            while await resp.content.readany():
                                pass
                elif state.finish_reason is None:
                    raise StreamError("disconnected", "stream ended before [DONE]")
        except StreamError as e:
            rec.error_kind, rec.error = e.kind, e.message
        except (TimeoutError, aiohttp.ClientError) as e:
            rec.error_kind, rec.error = "disconnected", f"{type(e).__name__}: {e}"
        finally:
            if rec.end_time is None:
                rec.end_time = now()
            rec.output_tokens = state.output_tokens
            rec.finish_reason = state.finish_reason

    async def close(self) -> None:
        await self.session.close()


def chunk_lags_ms(records: list[RequestRecord], ttft_ms: float, itl_ms: float) -> list[float]:
    """Per token-carrying read: arrival time minus when the loopback timetable made its last token due."""
    out: list[float] = []
    for r in records:
        if r.error is not None or r.send_time is None:
            continue
        k = 0
        for t, n in zip(r.chunk_times, r.chunk_tokens, strict=True):
            if n <= 0:
                continue
            k += n
            due = r.send_time + (ttft_ms + (k - 1) * itl_ms) / 1000.0
            out.append((t - due) * 1000.0)
    return out


async def run_job(a: argparse.Namespace) -> dict[str, float]:
    base = normalize_url(a.url)
    spec = RequestSpec(api="generate", input_len=a.input_len, output_len=a.output_len, seed=a.seed)
    point = LoadPoint(num_requests=a.requests, concurrency=a.concurrency)
    reqs = [build_request(spec, i) for i in range(a.requests)]
    client: Client = FastClient(base) if a.client == "fast" else AiohttpClient(base)
    records: list[RequestRecord] = []

    async def send(i: int, scheduled: float | None) -> None:
        rec = RequestRecord(point=point.label, index=i, input_tokens=reqs[i].input_tokens)
        await client.send(reqs[i], spec.api, rec)
        records.append(rec)

    try:
        await client.open(a.concurrency)
        before = client.connections_opened()
        lag = LagMonitor()
        with quiet_gc():
            lag.start()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            try:
                await drive(point, send)
            finally:
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                await lag.stop()
        during = client.connections_opened() - before
    finally:
        await client.close()
    m = summarize(records, point, lag_ms=lag.samples_ms)
    events = sum(sum(r.chunk_tokens) for r in records)
    lags = chunk_lags_ms(records, a.ttft_ms, a.itl_ms)
    p50, p99 = np.percentile(lags, [50, 99]) if lags else (float("nan"), float("nan"))
    return {
        "client": a.client,  # type: ignore[dict-item]
        "concurrency": a.concurrency,
        "requests": a.requests,
        "completed": m["completed"],
        "errors": m["errors"],
        "wall_s": wall,
        "request_s": m["request_s"],
        "output_tok_s": m["output_tok_s"],
        "cpu_s": cpu,
        "cpu_share": cpu / wall,
        "cpu_us_per_request": cpu / max(1, len(records)) * 1e6,
        "cpu_us_per_event": cpu / max(1, events) * 1e6,
        "chunk_lag_p50_ms": float(p50),
        "chunk_lag_p99_ms": float(p99),
        "ttft_p99_ms": m["ttft_p99_ms"],
        "client_lag_p99_ms": m["client_lag_p99_ms"],
        "connections_during_point": during,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--client", choices=("fast", "aiohttp"), required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--ttft-ms", type=float, default=1.0, help="the loopback server's --ttft-ms")
    p.add_argument("--itl-ms", type=float, default=1.0, help="the loopback server's --itl-ms")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = run_sync(run_job(a))
    sys.stdout.write(orjson.dumps(out).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
