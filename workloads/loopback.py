"""A fast no-op streaming server: the yardstick for the client's own ceiling.

    python -m workloads.loopback --port 0 [--ttft-ms 10] [--itl-ms 10] [--cpu 0]

It answers SGLang ``/generate`` and OpenAI ``/v1/completions`` / ``/v1/chat/completions`` with
streamed SSE events on a fixed timetable and does no other work: each stream sends its first token
``ttft_ms`` after the request arrived and every further token ``itl_ms`` after the previous one's
*scheduled* time (so a busy server catches up instead of drifting). It is written directly on
asyncio's ``Protocol`` (no web framework) and every event body is precomputed, so one core serves
tens of thousands of events per second; ``python -m workloads calibrate`` and
``benchmarks/loadgen_bench.py`` use it to measure the *client*.

Timing uses a 1 ms timer wheel: one loop callback per millisecond sends every event that is due,
so the server's cost is one ``transport.write`` per event plus ~1000 wake-ups a second.

Shapes (one SSE event per token):

* ``/generate``: ``{"text": <cumulative>, "meta_info": {"id", "finish_reason", "prompt_tokens",
  "completion_tokens" (cumulative), "cached_tokens"}}``, the SGLang 0.5 default (cumulative text).
* ``/v1/completions``: ``choices[0].text`` delta, ``"usage": null``; an include_usage chunk at the end.
* ``/v1/chat/completions``: a role chunk, content deltas, a finish chunk, an include_usage chunk.

It supports HTTP/1.1 keep-alive with ``Content-Length`` request bodies (what HTTP clients such as
the load generator's, aiohttp, httpx and curl send) and answers with chunked transfer encoding.
``GET /health`` answers 200. The first stdout line is ``PORT <n>``.

One module: it runs as a process of its own (``python -m workloads.loopback``), and its parts (the
canned events, the timer wheel, the protocol) exist only for that server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import sys
from typing import Any

import orjson

TICK_S = 0.001
_JSON = b"application/json"


def _chunk(payload: bytes) -> bytes:
    """One HTTP chunk holding one SSE event."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: Any) -> bytes:
    return _chunk(b"data: " + orjson.dumps(obj) + b"\n\n")


_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


@functools.lru_cache(maxsize=256)
def _script(api: str, n: int, prompt_tokens: int, include_usage: bool) -> tuple[bytes, list[bytes], bytes]:
    """(bytes sent with the first token, one event per later token, the tail after the last token).

    Cached per shape, so serving a request costs no JSON encoding at all.
    """
    events: list[bytes] = []
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    tail = b""
    head = b""
    if api == "generate":
        text = ""
        for i in range(1, n + 1):
            text += " tok"
            meta = {
                "id": "loopback",
                "finish_reason": {"type": "length", "length": n} if i == n else None,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": i,
                "cached_tokens": 0,
            }
            events.append(_event({"text": text, "meta_info": meta}))
    elif api == "completions":
        for i in range(1, n + 1):
            choice = {
                "index": 0,
                "text": " tok",
                "logprobs": None,
                "finish_reason": "length" if i == n else None,
            }
            events.append(
                _event(
                    {
                        "id": "loopback",
                        "object": "text_completion",
                        "model": "loopback",
                        "choices": [choice],
                        "usage": None,
                    }
                )
            )
        if include_usage:
            tail = _event(
                {
                    "id": "loopback",
                    "object": "text_completion",
                    "model": "loopback",
                    "choices": [],
                    "usage": usage,
                }
            )
    else:

        def chat(delta: dict[str, Any], finish: str | None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _event(
                {
                    "id": "loopback",
                    "object": "chat.completion.chunk",
                    "model": "loopback",
                    "choices": [choice],
                }
            )

        head = chat({"role": "assistant", "content": ""}, None)
        events = [chat({"content": " tok"}, None) for _ in range(n)]
        tail = chat({}, "length")
        if include_usage:
            tail += _event(
                {
                    "id": "loopback",
                    "object": "chat.completion.chunk",
                    "model": "loopback",
                    "choices": [],
                    "usage": usage,
                }
            )
    return head, events, tail + _DONE


class Stream:
    __slots__ = ("due", "events", "next_i", "proto", "tail")

    def __init__(self, proto: Protocol, events: list[bytes], tail: bytes, due: float) -> None:
        self.proto = proto
        self.events = events
        self.tail = tail
        self.next_i = 0
        self.due = due


class Wheel:
    """Buckets of streams keyed by the millisecond their next event is due."""

    def __init__(self, loop: asyncio.AbstractEventLoop, itl_s: float) -> None:
        self.loop = loop
        self.itl_s = itl_s
        self.buckets: dict[int, list[Stream]] = {}
        self.cursor = int(loop.time() / TICK_S)
        self.loop.call_at((self.cursor + 1) * TICK_S, self._tick)

    def add(self, s: Stream) -> None:
        key = max(int(s.due / TICK_S), self.cursor + 1)
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = [s]
        else:
            bucket.append(s)

    def _tick(self) -> None:
        now_key = int(self.loop.time() / TICK_S)
        buckets = self.buckets
        itl = self.itl_s
        while self.cursor < now_key:
            self.cursor += 1
            due = buckets.pop(self.cursor, None)
            if not due:
                continue
            for s in due:
                proto = s.proto
                if proto.transport is None:
                    continue  # the client went away
                i = s.next_i
                if i + 1 >= len(s.events):
                    proto.transport.write(s.events[i] + s.tail)
                    proto.stream_done()
                    continue
                proto.transport.write(s.events[i])
                s.next_i = i + 1
                s.due += itl
                self.add(s)
        self.loop.call_at((self.cursor + 1) * TICK_S, self._tick)


class Protocol(asyncio.Protocol):
    def __init__(self, server: LoopbackServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.busy and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            lines = head.split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            parts = lines[0].split(" ")
            method, path = parts[0], parts[1] if len(parts) > 1 else "/"
            self.handle(method, path.split("?")[0], body)

    def respond(self, status: str, body: bytes, ctype: bytes = _JSON) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (status.encode(), ctype, len(body), body)
        )

    def handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET":
            if path == "/v1/models":
                self.respond(
                    "200 OK",
                    orjson.dumps({"object": "list", "data": [{"id": "loopback", "object": "model"}]}),
                )
            elif path in ("/health", "/health_generate"):
                self.respond("200 OK", b"ok", b"text/plain")
            elif path in ("/server_info", "/get_server_info"):
                self.respond(
                    "200 OK", orjson.dumps({"server": "workloads.loopback", "internal_states": [{}]})
                )
            else:
                self.respond("404 Not Found", b'{"error": "not found"}')
            return
        api = {"/generate": "generate", "/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(
            path
        )
        if method != "POST" or api is None:
            self.respond("404 Not Found", b'{"error": "not found"}')
            return
        try:
            req = orjson.loads(body)
            if api == "generate":
                n = int((req.get("sampling_params") or {}).get("max_new_tokens", 128))
                ids = req.get("input_ids")
                prompt = len(ids) if isinstance(ids, list) else len(str(req.get("text", "")).split())
            elif api == "completions":
                n = int(req.get("max_tokens") or 16)
                p = req.get("prompt", "")
                prompt = len(p) if isinstance(p, list) else len(str(p).split())
            else:
                n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
                prompt = sum(len(str(m.get("content", "")).split()) for m in req.get("messages", []))
            usage = bool((req.get("stream_options") or {}).get("include_usage"))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            self.respond("400 Bad Request", b'{"error": {"message": "bad request body"}}')
            return
        head, events, tail = _script(api, max(1, n), prompt, usage)
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + head
        )
        self.busy = True  # HTTP/1.1 without pipelining: the next request comes after this response
        srv = self.server
        srv.wheel.add(Stream(self, events, tail, srv.loop.time() + srv.ttft_s))

    def stream_done(self) -> None:
        self.busy = False
        if self.buf:
            self.data_received(b"")


class LoopbackServer:
    def __init__(self, loop: asyncio.AbstractEventLoop, ttft_ms: float, itl_ms: float) -> None:
        self.loop = loop
        self.ttft_s = ttft_ms / 1000.0
        self.wheel = Wheel(loop, itl_ms / 1000.0)


async def serve(host: str, port: int, ttft_ms: float, itl_ms: float) -> None:
    loop = asyncio.get_running_loop()
    srv = LoopbackServer(loop, ttft_ms, itl_ms)
    server = await loop.create_server(lambda: Protocol(srv), host, port, backlog=4096)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workloads.loopback", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=10.0, help="request arrival -> first token (default 10)")
    p.add_argument("--itl-ms", type=float, default=10.0, help="time between tokens of a stream (default 10)")
    p.add_argument("--cpu", type=int, action="append", help="pin the server to this CPU (repeatable)")
    a = p.parse_args(argv)
    if a.cpu and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, set(a.cpu))
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=factory) as r:
        r.run(serve(a.host, a.port, a.ttft_ms, a.itl_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
