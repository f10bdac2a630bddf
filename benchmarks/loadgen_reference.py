"""A minimal raw-asyncio streaming client: the yardstick parasweep's load generator is held to.

    python benchmarks/loadgen_reference.py --url http://127.0.0.1:PORT --concurrency 512 \
        --requests 2048 --input-len 128 --output-len 200 [--cpu 1]

It does the least a correct closed-loop client can do: one keep-alive TCP connection per
concurrency slot, hand-written HTTP/1.1 on ``asyncio.Protocol`` (uvloop), a chunked-encoding
decoder, SSE events split on blank lines, and token counts read from SGLang ``/generate``'s
cumulative ``meta_info.completion_tokens`` with a byte search (no JSON parsing at all). Each
network read is timestamped with ``time.perf_counter()`` as ``data_received`` starts. It prints one
JSON object: ``output_tok_s``, ``request_s``, ``ttft_*_ms``, ``itl_*_ms`` (per-token), ``duration_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from urllib.parse import urlsplit

import numpy as np
import orjson

_KEY = b'"completion_tokens":'


class Slot(asyncio.Protocol):
    """One connection = one closed-loop worker."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)
        self.client.on_lost(self)

    # -- one request ----------------------------------------------------------------------------
    def send(self, payload: bytes) -> None:
        self.raw = b""  # undecoded HTTP bytes
        self.in_body = False
        self.chunk_left = -1  # bytes left in the current chunk (-1: reading a size line)
        self.sse = b""  # decoded body bytes not yet forming a full event
        self.tokens = 0
        self.ttft = -1.0
        self.last = 0.0
        self.itl: list[float] = []
        self.t_send = time.perf_counter()
        assert self.transport is not None
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        raw = self.raw + data if self.raw else data
        if not self.in_body:
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                self.raw = raw
                return
            if not raw.startswith(b"HTTP/1.1 200"):
                self.client.fail(self, raw[: raw.find(b"\r\n")].decode("latin-1"))
                return
            self.in_body = True
            raw = raw[end + 4 :]
        body = []
        pos = 0
        n = len(raw)
        finished = False
        while pos < n:
            if self.chunk_left < 0:
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(raw[pos:eol], 16)
                pos = eol + 2
                if size == 0:
                    finished = True
                    break
                self.chunk_left = size + 2  # the data plus its trailing CRLF
            take = min(self.chunk_left, n - pos)
            body.append(raw[pos : pos + take])
            pos += take
            self.chunk_left -= take
            if self.chunk_left == 0:
                self.chunk_left = -1
                body[-1] = body[-1][:-2] if body[-1].endswith(b"\r\n") else body[-1]
        self.raw = raw[pos:] if not finished else b""
        if body:
            self._events(b"".join(body), t)
        if finished:
            self.client.done(self)

    def _events(self, data: bytes, t: float) -> None:
        buf = self.sse + data if self.sse else data
        start = 0
        new = self.tokens
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            k = buf.find(_KEY, start, end)
            if k >= 0:
                j = k + len(_KEY)
                stop = j
                while buf[stop : stop + 1].isdigit() or buf[stop : stop + 1] == b" ":
                    stop += 1
                new = int(buf[j:stop])
            start = end + 2
        self.sse = buf[start:]
        if new > self.tokens:
            if self.ttft < 0:
                self.ttft = t - self.t_send
            else:
                gap = (t - self.last) / (new - self.tokens)
                self.itl.extend([gap] * (new - self.tokens))
            self.last = t
            self.tokens = new


class Client:
    def __init__(self, host: str, port: int, payloads: list[bytes], concurrency: int) -> None:
        self.host, self.port = host, port
        self.payloads = payloads
        self.concurrency = concurrency
        self.next = 0
        self.finished = 0
        self.errors: list[str] = []
        self.sends: list[float] = []
        self.ends: list[float] = []
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        self.tokens = 0
        self.all_done = asyncio.get_running_loop().create_future()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        slots = []
        for _ in range(self.concurrency):
            _, slot = await loop.create_connection(lambda: Slot(self), self.host, self.port)
            slots.append(slot)
        for slot in slots:
            self._next(slot)
        await self.all_done
        for slot in slots:
            if slot.transport is not None:
                slot.transport.close()

    def _next(self, slot: Slot) -> None:
        if self.next >= len(self.payloads):
            return
        i = self.next
        self.next += 1
        slot.send(self.payloads[i])

    def done(self, slot: Slot) -> None:
        end = time.perf_counter()
        self.sends.append(slot.t_send)
        self.ends.append(end)
        if slot.ttft >= 0:
            self.ttfts.append(slot.ttft)
        self.itls.extend(slot.itl)
        self.tokens += slot.tokens
        self._finish_one(slot)

    def fail(self, slot: Slot, why: str) -> None:
        self.errors.append(why)
        if slot.transport is not None:
            slot.transport.close()

    def on_lost(self, slot: Slot) -> None:
        if not self.all_done.done() and self.next < len(self.payloads):
            self.errors.append("connection lost")
            self._finish_one(None)

    def _finish_one(self, slot: Slot | None) -> None:
        self.finished += 1
        if self.finished >= len(self.payloads):
            if not self.all_done.done():
                self.all_done.set_result(None)
        elif slot is not None:
            self._next(slot)


def _pct(name: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values) * 1000.0
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        f"{name}_mean_ms": float(a.mean()),
        f"{name}_p50_ms": float(p50),
        f"{name}_p90_ms": float(p90),
        f"{name}_p99_ms": float(p99),
        f"{name}_max_ms": float(a.max()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--requests", type=int, default=2048)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", type=int, action="append", help="pin the client to this CPU (repeatable)")
    a = p.parse_args(argv)
    if a.cpu and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, set(a.cpu))
    u = urlsplit(a.url if "://" in a.url else "http://" + a.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    rnd = random.Random(a.seed)
    payloads = []
    for _ in range(a.requests):
        body = orjson.dumps(
            {
                "input_ids": [rnd.randrange(32000) for _ in range(a.input_len)],
                "sampling_params": {"max_new_tokens": a.output_len, "ignore_eos": True, "temperature": 0},
                "stream": True,
            }
        )
        payloads.append(
            b"POST /generate HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port, len(body), body)
        )

    async def go() -> Client:
        client = Client(host, port, payloads, min(a.concurrency, a.requests))
        await client.run()
        return client

    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with asyncio.Runner(loop_factory=factory) as r:
        c = r.run(go())
    duration = max(c.ends) - min(c.sends) if c.ends else float("nan")
    out = {
        "client": "reference",
        "completed": len(c.ends),
        "errors": len(c.errors),
        "duration_s": duration,
        "output_tokens": c.tokens,
        "output_tok_s": c.tokens / duration,
        "request_s": len(c.ends) / duration,
        **_pct("ttft", c.ttfts),
        **_pct("itl", c.itls),
    }
    sys.stdout.write(orjson.dumps(out).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
