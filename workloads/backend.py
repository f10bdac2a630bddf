"""One streamed request on the HTTP client (:mod:`workloads.fasthttp`), and the ``/v1/models`` probe.

:func:`send_request` is the load generator's only send path: the response is fed, read by read,
to an :class:`SSESink`, which splits it into SSE events, has the API's stream state parse and
validate every event, and records one ``(time, tokens)`` pair per read into the request's
:class:`~vocab.records.RequestRecord`. Failures are classified into the record's ``error_kind``;
they never raise.
"""

from __future__ import annotations

import asyncio

import orjson

from vocab.records import RequestRecord

from . import clock
from .fasthttp import HTTPError, Pool, Sink
from .payloads import PreparedRequest
from .sse import DONE, SSEParser
from .streams import StreamError, StreamState, make_stream

# An SSE event larger than this without a blank line is not an LLM stream (or is broken).
MAX_PENDING_BYTES = 64 * 1024 * 1024
# Bytes of an error response kept for the one-line snippet in the record.
SNIPPET_BYTES = 4096
# A /v1/models answer larger than this is not a model list.
MAX_PROBE_BYTES = 1024 * 1024


def normalize_url(url: str) -> str:
    """Base URL without trailing slash or ``/v1`` (endpoints add their own paths)."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[:-3]
    return url


def _one_line(raw: bytes, limit: int = 300) -> str:
    text = " ".join(raw[:SNIPPET_BYTES].decode("utf-8", "replace").split())
    return text[:limit] + ("…" if len(text) > limit else "")


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
        return StreamError(self.bad[0], self.bad[1] + _one_line(self.snippet))

    def on_data(self, data: bytes, t: float) -> None:
        if self.bad is not None:
            self.snippet += data
            if len(self.snippet) >= SNIPPET_BYTES:
                raise self._fail_bad()
            return
        parser = self.parser
        events = parser.feed(data)
        if not events:
            if parser.pending > MAX_PENDING_BYTES:
                raise StreamError("malformed", "no SSE event boundary in the first 64 MiB")
            return
        if account_events(events, self.state, t, self.rec):
            self.finished = True

    def on_end(self, t: float) -> None:
        if self.bad is not None:
            raise self._fail_bad()
        if account_events(self.parser.flush(), self.state, t, self.rec):
            self.finished = True
            return
        if self.state.finish_reason is None:
            raise StreamError(
                "disconnected", f"stream ended before [DONE] after {self.state.output_tokens} tokens"
            )
        # A stream that ends cleanly with a finish_reason but no [DONE] is accepted (lenient).
        self.rec.end_time = t


async def send_request(pool: Pool, req: PreparedRequest, api: str, rec: RequestRecord) -> None:
    """Send ``req``, stream the answer and fill ``rec`` in place. Never raises (except cancellation)."""
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
        rec.server_queue_s = state.server_queue_s
        rec.cached_tokens = state.cached_tokens
        rec.pd_parts_s = state.pd_parts_s


def account_events(events: list[bytes], state: StreamState, t: float, rec: RequestRecord) -> bool:
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


class _BodySink(Sink):
    """Keeps the status and the body of a small, non-streamed response."""

    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()

    def on_head(self, status: int, headers: dict[str, str], t: float) -> None:
        self.status = status

    def on_data(self, data: bytes, t: float) -> None:
        self.body += data
        if len(self.body) > MAX_PROBE_BYTES:
            raise HTTPError("malformed", f"response larger than {MAX_PROBE_BYTES} bytes")


async def _get(base_url: str, path: str, timeout_s: float) -> tuple[int, bytes]:
    """``GET base_url + path`` on a connection of its own: (status, body). Raises HTTPError, TimeoutError."""
    pool = Pool(base_url, connect_timeout=timeout_s, read_timeout=timeout_s)
    sink = _BodySink()
    try:
        async with asyncio.timeout(timeout_s):
            await pool.request(pool.get_bytes(path), sink)
    finally:
        pool.close()
    return sink.status, bytes(sink.body)


def _model_id(raw: bytes) -> str | None:
    """The first model id of an OpenAI model list; KeyError, IndexError, TypeError or a JSON error if none."""
    model = orjson.loads(raw)["data"][0]["id"]
    return model if isinstance(model, str) else None


async def fetch_model(base_url: str, timeout_s: float = 10.0) -> str | None:
    """The served model id from ``GET /v1/models``, or None if the server cannot say."""
    try:
        status, raw = await _get(base_url, "/v1/models", timeout_s)
        return _model_id(raw) if status == 200 else None
    except (TimeoutError, HTTPError, orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None


class ServerCheckError(Exception):
    """The URL is unreachable or does not serve an SGLang / OpenAI-compatible API."""


def sim_clock(info: object) -> tuple[float, float] | None:
    """``(seconds per wall second, origin)`` of a simulated engine played faster or slower than real
    time, from its ``/server_info`` (``sim_time_scale``, ``sim_wall_origin``), to time it on its own
    clock (:func:`workloads.clock.engine_clock`); None for any other server, or one at real time."""
    scale = info.get("sim_time_scale") if isinstance(info, dict) else None
    origin = info.get("sim_wall_origin") if isinstance(info, dict) else None
    if isinstance(scale, int | float) and isinstance(origin, int | float) and scale > 0 and scale != 1:
        return float(scale), float(origin)
    return None


async def simulated_engine_clock(base_url: str, timeout_s: float = 10.0) -> tuple[float, float] | None:
    """:func:`sim_clock` of the server at ``base_url`` (None when it has no ``/server_info``)."""
    try:
        status, raw = await _get(base_url, "/server_info", timeout_s)
        return sim_clock(orjson.loads(raw)) if status == 200 else None
    except (HTTPError, TimeoutError, orjson.JSONDecodeError):
        return None


async def probe_server(base_url: str, timeout_s: float = 10.0) -> str | None:
    """Check ``GET /v1/models`` answers like SGLang / an OpenAI server; return the model id.

    Raises :class:`ServerCheckError` with a one-line reason otherwise.
    """
    not_llm = f"{base_url} does not look like an SGLang or OpenAI-compatible server: GET /v1/models"
    try:
        status, raw = await _get(base_url, "/v1/models", timeout_s)
    except HTTPError as e:
        if e.kind == "connect":
            raise ServerCheckError(e.message) from None
        raise ServerCheckError(f"{base_url} did not answer GET /v1/models: {e.message}") from None
    except TimeoutError:
        raise ServerCheckError(f"{base_url} did not answer GET /v1/models within {timeout_s:g} s") from None
    if status != 200:
        raise ServerCheckError(f"{not_llm} -> HTTP {status}")
    try:
        return _model_id(raw)
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise ServerCheckError(f"{not_llm} did not return an OpenAI model list") from None
