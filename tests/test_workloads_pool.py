"""The connection pool over real sockets: connections opened ahead of a point are the ones its
requests use, a connection the server dropped is replaced, and an unreachable server fails each
request as ``connect``. Against a tiny in-process asyncio server that counts its connections."""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest

from vocab.load import RequestSpec
from vocab.records import RequestRecord
from workloads.backend import send_request
from workloads.fasthttp import Pool
from workloads.payloads import build_request

pytestmark = pytest.mark.slow

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _sse_chunk(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _generate_event(ct: int) -> bytes:
    finish = {"type": "length"} if ct == 3 else None
    return orjson.dumps({"text": " t" * ct, "meta_info": {"completion_tokens": ct, "finish_reason": finish}})


class _CountingServer:
    """Answers every POST with a 3-token /generate stream; counts the connections it accepted."""

    def __init__(self) -> None:
        self.accepted = 0
        self.transports: list[asyncio.Transport] = []

    def factory(self) -> asyncio.Protocol:
        server = self

        class Conn(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                server.accepted += 1
                server.transports.append(transport)  # type: ignore[arg-type]
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
                body = b"".join(_sse_chunk(_generate_event(i)) for i in (1, 2, 3))
                self.transport.write(HEAD + body + _sse_chunk(b"[DONE]") + b"0\r\n\r\n")  # type: ignore[attr-defined]

        return Conn()


def test_pool_open_preconnects_and_requests_reuse_those_connections() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        srv = _CountingServer()
        server = await loop.create_server(srv.factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(f"http://127.0.0.1:{port}")
        try:
            assert await pool.open(4) == 4
            assert srv.accepted == 4 == pool.connections_opened
            req = build_request(RequestSpec(output_len=3), 0)
            recs = [RequestRecord(point="c4", index=i) for i in range(8)]
            for batch in (recs[:4], recs[4:]):
                await asyncio.gather(*(send_request(pool, req, "generate", r) for r in batch))
            assert all(r.ok and r.output_tokens == 3 for r in recs), [r.error for r in recs]
            assert srv.accepted == 4  # no connection beyond the pre-opened ones
            # The server drops its idle connections: whether or not the pool has seen the close
            # yet, each next request ends up on a new connection (a stale one is retried once).
            for transport in srv.transports:
                transport.close()
            again = [RequestRecord(point="c4", index=i) for i in range(2)]
            await asyncio.gather(*(send_request(pool, req, "generate", r) for r in again))
            assert all(r.ok for r in again), [r.error for r in again]
            assert srv.accepted == 6
        finally:
            pool.close()
            server.close()
            await server.wait_closed()

    asyncio.run(go())


def test_pool_open_on_an_unreachable_server_opens_nothing() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> RequestRecord:
        pool = Pool(f"http://127.0.0.1:{port}", connect_timeout=5.0)
        try:
            assert await pool.open(3) == 0
            assert await pool.open(0) == 0
            rec = RequestRecord(point="c1", index=0)
            await send_request(pool, build_request(RequestSpec(output_len=3), 0), "generate", rec)
            return rec
        finally:
            pool.close()

    rec = asyncio.run(go())
    assert rec.error_kind == "connect" and (rec.error or "").startswith(
        f"cannot connect to http://127.0.0.1:{port}"
    )
