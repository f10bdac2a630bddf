"""The fast client's hot path: SSE fast path, per-read accounting, errors mid-read, pre-opened
connections. In-process (a fake transport, or a tiny asyncio server), so no subprocess is needed."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from vocab.load import LoadPoint, RequestSpec
from vocab.records import RequestRecord
from workloads.backend import SSESink, send_request_fast
from workloads.fasthttp import HTTPError, Pool, _Conn
from workloads.payloads import build_request
from workloads.runner import _connections_ahead
from workloads.sse import DONE, SSEParser, _event_data

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _gen(ct: int, finish: bool = False) -> bytes:
    meta = {
        "id": "r",
        "finish_reason": {"type": "length"} if finish else None,
        "prompt_tokens": 7,
        "completion_tokens": ct,
        "cached_tokens": 0,
    }
    return orjson.dumps({"text": " t" * ct, "meta_info": meta})


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(payload: bytes) -> bytes:
    return _chunk(b"data: " + payload + b"\n\n")


# ---------------------------------------------------------------------------------------------
# SSE parser: the one-scan fast path must give exactly what the general path gives


def _spec_parse(stream: bytes) -> list[bytes]:
    """The SSE rules written plainly (blank-line separated blocks, data lines joined by \\n)."""
    text = stream.replace(b"\r\n", b"\n")
    blocks = text.split(b"\n\n")[:-1]  # the part after the last blank line is not an event yet
    out = []
    for block in blocks:
        payload = _event_data(block)
        if payload is not None:
            out.append(payload)
    return out


EVENTS = [
    b"data: " + _gen(3) + b"\n\n",
    b"data: [DONE]\n\n",
    b"data:tight\n\n",
    b": keep-alive\n\n",
    b"event: delta\ndata: " + _gen(4) + b"\n\n",
    b"data: one\ndata: two\n\n",
    b"data: crlf\r\n\r\n",
    b"\n\n",
    b"id: 7\r\ndata: x\r\nretry: 5\r\n\r\n",
    b"data: \n\n",
    b"data: {not json\n\n",
]


@pytest.mark.parametrize("seed", range(40))
def test_sse_fast_path_matches_the_spec_for_any_split(seed: int) -> None:
    rnd = random.Random(seed)
    stream = b"".join(rnd.choice(EVENTS) for _ in range(30))
    cuts = sorted(rnd.sample(range(1, len(stream)), 12))
    p = SSEParser()
    got: list[bytes] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        got += p.feed(stream[prev:cut])
        prev = cut
    assert got == _spec_parse(stream)
    assert p.pending == 0


def test_sse_fast_path_split_between_the_two_newlines() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\n") == []
    assert p.feed(b"\ndata: b\n") == [b"a"]
    assert p.feed(b"data: c\n\n") == [b"b\nc"]  # one event of two data lines


# ---------------------------------------------------------------------------------------------
# the fast client's sink, fed through the HTTP/1.1 parser with a fake transport


class _FakeTransport:
    def __init__(self) -> None:
        self.aborted = False

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


def _feed(reads: list[bytes]) -> tuple[RequestRecord, BaseException | None, _FakeTransport]:
    async def go() -> tuple[RequestRecord, BaseException | None, _FakeTransport]:
        loop = asyncio.get_running_loop()
        conn = _Conn(Pool("http://127.0.0.1:9"))
        transport = _FakeTransport()
        conn.transport = transport  # type: ignore[assignment]
        rec = RequestRecord(point="c1", index=0)
        fut: asyncio.Future[None] = loop.create_future()
        conn.start(b"", SSESink(rec, "generate"), fut)
        for r in reads:
            if transport.aborted:
                break
            conn.data_received(r)
        assert fut.done()
        return rec, fut.exception(), transport

    return asyncio.run(go())


def test_well_formed_stream_counts_every_event_per_read() -> None:
    events = [_sse(_gen(i, finish=i == 5)) for i in range(1, 6)]
    reads = [HEAD + events[0], events[1] + events[2], events[3][:10], events[3][10:] + events[4]]
    rec, exc, _ = _feed([*reads, _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"])
    assert exc is None
    # The third read completes no event, so it is no chunk; the fourth completes two.
    assert rec.chunk_tokens == [1, 2, 2] and len(rec.chunk_times) == 3
    assert rec.end_time is not None and rec.first_token_time == rec.chunk_times[0]


@pytest.mark.parametrize(
    ("bad", "kind"),
    [
        (b'{"text": " t t", "meta_info": {"completion_tokens": 2', "malformed"),  # cut JSON
        (b"not json at all", "malformed"),
        (b'{"text": "", "meta_info": {"completion_tokens": "2", "finish_reason": null}}', "malformed"),
        (b'{"text": "", "meta_info": null}', "malformed"),
        (b"[1, 2]", "malformed"),
        (b'{"error": {"message": "engine died"}}', "server_error"),
        (
            b'{"text": "x", "meta_info": {"completion_tokens": 2, "finish_reason": null}, "error": "x"}',
            "server_error",
        ),
    ],
)
def test_a_bad_event_mid_read_fails_the_request(bad: bytes, kind: str) -> None:
    # The bad event sits between good events of the same network read: it must not be skipped.
    reads = [HEAD + _sse(_gen(1)), _sse(_gen(2)) + _sse(bad) + _sse(_gen(3)), _sse(_gen(4))]
    rec, exc, transport = _feed(reads)
    assert exc is not None and getattr(exc, "kind", None) == kind, exc
    assert transport.aborted
    assert sum(rec.chunk_tokens) == 1  # only the first read was accounted


def test_cut_stream_and_http_error_are_still_classified() -> None:
    # The body ends (zero chunk) without [DONE] and without a finish_reason: disconnected.
    _, exc, _ = _feed([HEAD + _sse(_gen(1)) + _sse(_gen(2)) + b"0\r\n\r\n"])
    assert isinstance(exc, Exception) and getattr(exc, "kind", None) == "disconnected"
    body = b'{"error": {"message": "overloaded"}}'
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    rec, exc, _ = _feed([head % len(body) + body])
    assert getattr(exc, "kind", None) == "http_5xx" and "overloaded" in str(exc)
    assert rec.http_status == 503


# ---------------------------------------------------------------------------------------------
# pre-opened connections


class _Server:
    """Answers every POST with a 3-token /generate stream; counts the connections it accepted."""

    def __init__(self) -> None:
        self.accepted = 0
        self.protos: list[asyncio.Protocol] = []

    def factory(self) -> asyncio.Protocol:
        server = self

        class P(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                server.accepted += 1
                server.protos.append(self)
                self.transport = transport
                self.buf = b""

            def data_received(self, data: bytes) -> None:
                self.buf += data
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                length = int(self.buf[:end].lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(self.buf) < end + 4 + length:
                    return
                self.buf = self.buf[end + 4 + length :]
                body = b"".join(_sse(_gen(i, finish=i == 3)) for i in (1, 2, 3))
                self.transport.write(HEAD + body + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")  # type: ignore[attr-defined]

        return P()


def test_pool_open_preconnects_and_requests_reuse_those_connections() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        srv = _Server()
        server = await loop.create_server(srv.factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(f"http://127.0.0.1:{port}")
        try:
            assert await pool.open(4) == 4
            assert srv.accepted == 4
            req = build_request(RequestSpec(output_len=3), 0)
            recs = [RequestRecord(point="c4", index=i) for i in range(8)]
            for batch in (recs[:4], recs[4:]):
                await asyncio.gather(*(send_request_fast(pool, req, "generate", r) for r in batch))
            assert all(r.ok and r.output_tokens == 3 for r in recs), [r.error for r in recs]
            assert srv.accepted == 4  # no connection beyond the pre-opened ones
            # The server drops its idle connections: the next requests retry on new ones.
            for proto in srv.protos:
                proto.transport.close()  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)
            again = [RequestRecord(point="c4", index=i) for i in range(2)]
            await asyncio.gather(*(send_request_fast(pool, req, "generate", r) for r in again))
            assert all(r.ok for r in again), [r.error for r in again]
        finally:
            pool.close()
            server.close()
            await server.wait_closed()

    asyncio.run(go())


def test_pool_open_on_an_unreachable_server_opens_nothing() -> None:
    async def go() -> None:
        pool = Pool("http://127.0.0.1:9", connect_timeout=2.0)
        try:
            assert await pool.open(3) == 0
            assert await pool.open(0) == 0
            with pytest.raises(HTTPError) as e:
                await pool._connect()
            assert e.value.kind == "connect"
        finally:
            pool.close()

    asyncio.run(go())


def test_connections_ahead_per_mode_and_shard() -> None:
    assert _connections_ahead(LoadPoint(num_requests=100, concurrency=8), 0, 1) == 8
    assert _connections_ahead(LoadPoint(num_requests=3, concurrency=8, warmup_requests=1), 0, 1) == 4
    assert _connections_ahead(LoadPoint(num_requests=100, concurrency=9), 1, 2) == 4
    assert _connections_ahead(LoadPoint(num_requests=3, concurrency=9), 1, 2) == 1
    assert _connections_ahead(LoadPoint(duration_s=1.0, concurrency=5), 0, 1) == 5
    assert _connections_ahead(LoadPoint(num_requests=10, rate=5.0, max_concurrency=4), 0, 1) == 0


def test_done_constant_is_what_the_parser_returns() -> None:
    assert SSEParser().feed(b"data: [DONE]\n\n") == [DONE]
