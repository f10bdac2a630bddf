"""The HTTP client: one aiohttp session per load point, one streamed POST per request.

Settings follow shared/reference/ecosystem.md §6: the default connector (limit=100) would
silently queue requests inside aiohttp and inflate TTFT, the default 5-minute total timeout would
kill long streams, and a small read buffer lets a busy client throttle the socket (fake ITL).
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import orjson

from vocab.records import RequestRecord

from . import clock
from .fasthttp import HTTPError, Pool, Sink
from .payloads import PreparedRequest
from .sse import DONE, SSEParser
from .streams import StreamError, StreamState, make_stream

READ_BUFSIZE = 4 * 1024 * 1024
# An SSE event larger than this without a blank line is not an LLM stream (or is broken).
MAX_PENDING_BYTES = 64 * 1024 * 1024
# After [DONE] we read the (normally already arrived) end of the chunked body so the keep-alive
# connection can be reused; a server that holds the body open after [DONE] is not waited on longer.
DRAIN_TIMEOUT_S = 1.0
HEADERS = {
    "Content-Type": "application/json",
    # auto_decompress=False only stops aiohttp decoding; also ask the server not to compress.
    "Accept-Encoding": "identity",
    "Accept": "text/event-stream",
}


def make_session(
    sock_read_timeout: float = 300.0, sock_connect_timeout: float = 10.0
) -> aiohttp.ClientSession:
    """A session whose limits never bind: concurrency is the scheduler's job, not the connector's.

    Must be called inside the running event loop that will use it.
    """
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=60)
    # total=None: a long generation is not an error; sock_read bounds the gap between two reads.
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=sock_connect_timeout, sock_read=sock_read_timeout
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        read_bufsize=READ_BUFSIZE,
        auto_decompress=False,
        headers=HEADERS,
    )


def normalize_url(url: str) -> str:
    """Base URL without trailing slash or ``/v1`` (endpoints add their own paths)."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[:-3]
    return url


async def _body_snippet(resp: aiohttp.ClientResponse, limit: int = 300) -> str:
    try:
        raw = await asyncio.wait_for(resp.content.read(4096), timeout=2.0)
    except (TimeoutError, aiohttp.ClientError):
        return ""
    text = " ".join(raw.decode("utf-8", "replace").split())
    return text[:limit] + ("…" if len(text) > limit else "")


async def _drain(resp: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(asyncio.TimeoutError, aiohttp.ClientError):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            while await resp.content.readany():
                pass


async def send_request(
    session: aiohttp.ClientSession, base_url: str, req: PreparedRequest, api: str, rec: RequestRecord
) -> None:
    """Send ``req``, stream the answer and fill ``rec`` in place. Never raises (except cancellation)."""
    state = make_stream(api)
    parser = SSEParser()
    done = False
    now = clock.now
    rec.send_time = now()
    try:
        async with session.post(base_url + req.path, data=req.body) as resp:
            rec.first_byte_time = now()
            rec.http_status = resp.status
            if resp.status >= 400:
                kind = "http_5xx" if resp.status >= 500 else "http_4xx"
                raise StreamError(kind, f"HTTP {resp.status}: {await _body_snippet(resp)}")
            ctype = resp.headers.get("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                raise StreamError(
                    "malformed",
                    f"expected an SSE stream (text/event-stream), got {ctype or 'no content type'}: "
                    f"{await _body_snippet(resp)}",
                )
            async for data in resp.content.iter_any():
                t = now()  # the arrival time of this read; everything parsed from it shares it
                events = parser.feed(data)
                if not events:
                    if parser.pending > MAX_PENDING_BYTES:
                        raise StreamError("malformed", "no SSE event boundary in the first 64 MiB")
                    continue
                done = _consume(events, state, t, rec)
                if done:
                    break
            else:
                t = now()
                done = _consume(parser.flush(), state, t, rec)
            if done:
                await _drain(resp)
            elif state.finish_reason is None:
                raise StreamError(
                    "disconnected", f"stream ended before [DONE] after {state.output_tokens} tokens"
                )
            # A stream that ends cleanly with a finish_reason but no [DONE] is accepted (lenient).
    except StreamError as e:
        rec.error_kind, rec.error = e.kind, e.message
    except aiohttp.ConnectionTimeoutError as e:
        rec.error_kind, rec.error = "connect", f"connect timeout: {e}"
    except TimeoutError as e:  # includes aiohttp's SocketTimeoutError (sock_read)
        rec.error_kind = "timeout"
        rec.error = f"read timeout after {len(rec.chunk_times)} chunks: {e or 'no data'}"
    except aiohttp.ClientConnectorError as e:
        rec.error_kind, rec.error = "connect", f"cannot connect: {e}"
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
        # ServerDisconnectedError, ClientOSError (reset), "Response payload is not completed".
        rec.error_kind, rec.error = "disconnected", f"{type(e).__name__}: {e}"
    except aiohttp.ClientError as e:
        rec.error_kind, rec.error = "disconnected", f"{type(e).__name__}: {e}"
    except Exception as e:  # a bug in the client must not end the point; it is reported per request
        rec.error_kind, rec.error = "client", f"{type(e).__name__}: {e}"
    finally:
        if rec.end_time is None:
            rec.end_time = now()
        rec.output_tokens = state.output_tokens
        if state.prompt_tokens is not None:
            rec.input_tokens = state.prompt_tokens
        rec.finish_reason = state.finish_reason


class SSESink(Sink):
    """Turns one streamed response into a :class:`RequestRecord`, inside ``data_received``."""

    __slots__ = ("bad", "finished", "parser", "rec", "snippet", "state")

    def __init__(self, rec: RequestRecord, api: str) -> None:
        self.rec = rec
        self.state = make_stream(api)
        self.parser = SSEParser()
        self.finished = False
        self.bad: tuple[str, str] | None = None
        self.snippet = b""

    def on_head(self, status: int, headers: dict[str, str], t: float) -> None:
        rec = self.rec
        rec.first_byte_time = t
        rec.http_status = status
        if status >= 400:
            self.bad = ("http_5xx" if status >= 500 else "http_4xx", f"HTTP {status}: ")
            return
        ctype = headers.get("content-type", "")
        if not ctype.startswith("text/event-stream"):
            self.bad = (
                "malformed",
                f"expected an SSE stream (text/event-stream), got {ctype or 'no content type'}: ",
            )

    def _fail_bad(self) -> StreamError:
        assert self.bad is not None
        text = " ".join(self.snippet[:4096].decode("utf-8", "replace").split())
        text = text[:300] + ("…" if len(text) > 300 else "")
        return StreamError(self.bad[0], self.bad[1] + text)

    def on_data(self, data: bytes, t: float) -> None:
        if self.bad is not None:
            self.snippet += data
            if len(self.snippet) >= 4096:
                raise self._fail_bad()
            return
        parser = self.parser
        events = parser.feed(data)
        if not events:
            if parser.pending > MAX_PENDING_BYTES:
                raise StreamError("malformed", "no SSE event boundary in the first 64 MiB")
            return
        if _consume(events, self.state, t, self.rec):
            self.finished = True

    def on_end(self, t: float) -> None:
        if self.bad is not None:
            raise self._fail_bad()
        if _consume(self.parser.flush(), self.state, t, self.rec):
            self.finished = True
            return
        if self.state.finish_reason is None:
            raise StreamError(
                "disconnected", f"stream ended before [DONE] after {self.state.output_tokens} tokens"
            )
        # A stream that ends cleanly with a finish_reason but no [DONE] is accepted (lenient).
        self.rec.end_time = t


async def send_request_fast(pool: Pool, req: PreparedRequest, api: str, rec: RequestRecord) -> None:
    """:func:`send_request` on parasweep's own HTTP client (:mod:`workloads.fasthttp`)."""
    sink = SSESink(rec, api)
    payload = pool.request_bytes(req.path, req.body)
    now = clock.now
    rec.send_time = now()
    try:
        await pool.request(payload, sink)
    except (StreamError, HTTPError) as e:
        rec.error_kind, rec.error = e.kind, e.message
    except Exception as e:  # a bug in the client must not end the point; it is reported per request
        rec.error_kind, rec.error = "client", f"{type(e).__name__}: {e}"
    finally:
        if rec.end_time is None:
            rec.end_time = now()
        state = sink.state
        rec.output_tokens = state.output_tokens
        if state.prompt_tokens is not None:
            rec.input_tokens = state.prompt_tokens
        rec.finish_reason = state.finish_reason


def _consume(events: list[bytes], state: StreamState, t: float, rec: RequestRecord) -> bool:
    """Account the events of one read at time ``t``; True when the stream said [DONE].

    Every event is parsed and validated (``state.on_event``); only the bookkeeping is per read.
    """
    on_event = state.on_event
    tokens = 0
    parsed = 0
    done = False
    for payload in events:
        if payload == DONE:
            done = True
            break
        tokens += on_event(payload)
        parsed += 1
    if parsed:
        rec.chunk_times.append(t)
        rec.chunk_tokens.append(tokens)
        if tokens and rec.first_token_time is None:
            rec.first_token_time = t
    if done:
        rec.end_time = t
    return done


async def fetch_model(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0) -> str | None:
    """The served model id from ``GET /v1/models``, or None if the server cannot say."""
    try:
        async with asyncio.timeout(timeout_s), session.get(base_url + "/v1/models") as resp:
            if resp.status != 200:
                return None
            data = orjson.loads(await resp.read())
        model = data["data"][0]["id"]
        return model if isinstance(model, str) else None
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None


class ServerCheckError(Exception):
    """The URL is unreachable or does not serve an SGLang / OpenAI-compatible API."""


async def probe_server(base_url: str, timeout_s: float = 10.0) -> str | None:
    """Check ``GET /v1/models`` answers like SGLang / an OpenAI server; return the model id.

    Raises :class:`ServerCheckError` with a one-line reason otherwise.
    """
    async with make_session(sock_read_timeout=timeout_s, sock_connect_timeout=timeout_s) as session:
        try:
            async with asyncio.timeout(timeout_s), session.get(base_url + "/v1/models") as resp:
                status = resp.status
                raw = await resp.read()
        except aiohttp.ClientConnectorError as e:
            raise ServerCheckError(f"cannot connect to {base_url}: {e.os_error.strerror or e}") from None
        except (TimeoutError, aiohttp.ClientError) as e:
            msg = f"{base_url} did not answer GET /v1/models: {type(e).__name__} {e}"
            raise ServerCheckError(msg) from None
    if status != 200:
        raise ServerCheckError(
            f"{base_url} does not look like an SGLang or OpenAI-compatible server: "
            f"GET /v1/models -> HTTP {status}"
        )
    try:
        data = orjson.loads(raw)
        model = data["data"][0]["id"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise ServerCheckError(
            f"{base_url} does not look like an SGLang or OpenAI-compatible server: "
            "GET /v1/models did not return an OpenAI model list"
        ) from None
    return model if isinstance(model, str) else None
