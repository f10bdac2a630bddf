"""parasweep's own HTTP/1.1 streaming client on ``asyncio.Protocol``: the load generator's only client.

Why not aiohttp: aiohttp hands every HTTP chunk (one SSE event, for SGLang) through several
Python-level calls and wakes the reading task once per network read. Measured against the loopback
server with the same harness, that costs 1.7-2.6 times the CPU per request of this client, and the
timestamps it takes are later by the time the task waits to be woken (docs/benchmarks.md, "HTTP
client"). Here the response is parsed *push-style* inside ``data_received``: each network read is
timestamped once, de-chunked, split into SSE events and accounted without waking any task; the
request's coroutine only wakes once, when the response ends. Reading is never paused, so there is no
read buffer that can fill up and hold the server's sends back (which would show up as inter-token
latency the server did not cause).

Scope: HTTP/1.1 with keep-alive, ``Content-Length`` or chunked responses (or read-until-close),
optional TLS, ``POST`` of a JSON body (the requests) and ``GET`` (the ``/v1/models`` probe). One
request per connection at a time; idle connections are pooled without limit (concurrency is the
scheduler's job). A request on a reused connection that the server had already closed (0 bytes of
response) is retried once on a new connection.

One module, not two: the connection protocol and the pool hand connections, futures and sinks to
each other on every request (release, forget, abort, the read-timeout watchdog), so splitting them
would only turn those calls into cross-module private access.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from urllib.parse import urlsplit

from . import clock

_CRLF2 = b"\r\n\r\n"


class HTTPError(Exception):
    """A transport-level failure with its error kind (``connect``, ``disconnected``, ``timeout``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Sink:
    """Receives one response. Callbacks run inside ``data_received``; they must be fast.

    A callback may raise an exception carrying ``kind`` and ``message`` (e.g. ``StreamError``) to
    abort the request: the connection is then closed and the request fails with that error.
    ``finished`` set by the sink means "the request is complete" (e.g. ``data: [DONE]``) even if
    the HTTP body has not ended yet; the connection then drains the rest on its own.
    """

    finished: bool = False

    def on_head(self, status: int, headers: dict[str, str], t: float) -> None: ...

    def on_data(self, data: bytes, t: float) -> None: ...

    def on_end(self, t: float) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection: parses the responses to the requests sent on it (one at a time)."""

    __slots__ = (
        "buf",
        "chunked",
        "closed",
        "draining_since",
        "future",
        "got_bytes",
        "in_body",
        "keep_alive",
        "last_read",
        "left",
        "pool",
        "reused",
        "sink",
        "transport",
        "until_close",
    )

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.sink: Sink | None = None
        self.future: asyncio.Future[None] | None = None
        self.buf = b""
        self.reused = False
        self.draining_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.in_body = False
        self.chunked = False
        self.left = -1  # chunked: bytes left in this chunk incl. its CRLF (-1: at a size line)
        self.until_close = False
        self.keep_alive = True
        self.got_bytes = False
        self.last_read = clock.now()

    # -- asyncio callbacks ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        self.pool._forget(self)
        sink = self.sink
        if sink is None:
            return
        t = clock.now()
        if self.in_body and self.until_close and exc is None:
            self._end(t)  # read-until-close body: EOF is its end
            return
        if sink.finished:
            self._complete(None)
            return
        if not self.got_bytes and self.reused:
            self._complete(HTTPError("stale", "reused connection was closed by the server"))
            return
        what = f"{type(exc).__name__}: {exc}" if exc else "server closed the connection"
        self._complete(HTTPError("disconnected", f"connection lost mid-response ({what})"))

    def data_received(self, data: bytes) -> None:
        t = clock.now()
        self.last_read = t
        self.got_bytes = True
        sink = self.sink
        if sink is None:
            # Only the CRLF that ends a chunked body may trail a finished response.
            if data.strip(b"\r\n") or len(data) > 2:
                self._abort()
            return
        try:
            self._feed(self.buf + data if self.buf else data, sink, t)
        except Exception as e:  # the sink rejected the stream, or the HTTP framing is broken
            self._complete(e)
            self._abort()

    # -- parsing -------------------------------------------------------------------------------
    def _feed(self, buf: bytes, sink: Sink, t: float) -> None:
        if not self.in_body:
            end = buf.find(_CRLF2)
            if end < 0:
                if len(buf) > 65536:
                    raise HTTPError("malformed", "response headers longer than 64 KiB")
                self.buf = buf
                return
            head = buf[:end].decode("latin-1").split("\r\n")
            buf = buf[end + 4 :]
            parts = head[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise HTTPError("malformed", f"not an HTTP response: {head[0][:100]!r}")
            status = int(parts[1])
            headers: dict[str, str] = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self.in_body = True
            self.keep_alive = headers.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self.chunked = True
            elif "content-length" in headers:
                self.left = int(headers["content-length"])
            else:
                self.until_close = True
                self.keep_alive = False
            sink.on_head(status, headers, t)
            if self.sink is None:
                return  # the sink completed the request on the head alone
            if not self.chunked and not self.until_close and self.left == 0:
                self.buf = b""
                self._end(t)
                return
        if self.until_close:
            self.buf = b""
            if buf and not sink.finished:
                sink.on_data(buf, t)
                if sink.finished:
                    self._complete_with(None)
            return
        if not self.chunked:
            take = buf[: self.left]
            self.left -= len(take)
            self.buf = b""
            if take and not sink.finished:
                sink.on_data(take, t)
                if sink.finished:
                    self._complete_with(None)
            if self.left <= 0:
                self._end(t)
            return
        # chunked transfer encoding (the hot path: one SSE event per chunk, for SGLang)
        pieces: list[bytes] = []
        pos = 0
        n = len(buf)
        left = self.left
        ended = False
        find = buf.find
        while pos < n:
            if left < 0:
                eol = find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 1024:
                        raise HTTPError("malformed", "bad chunk size line")
                    break
                try:
                    size = int(buf[pos:eol], 16)
                except ValueError:
                    size_text = buf[pos:eol].split(b";", 1)[0].strip()
                    try:
                        size = int(size_text, 16)
                    except ValueError:
                        raise HTTPError("malformed", f"bad chunk size {size_text[:20]!r}") from None
                if size == 0:
                    # Trailers are not used by LLM servers; a late final CRLF is ignored.
                    ended = True
                    pos = n
                    break
                pos = eol + 2
                stop = pos + size
                if stop + 2 <= n:  # the whole chunk is here (the common case)
                    pieces.append(buf[pos:stop])
                    pos = stop + 2
                    continue
                left = size + 2
            # a chunk split across reads: take what is here
            data_left = left - 2
            if data_left > 0:
                take = data_left if data_left < n - pos else n - pos
                pieces.append(buf[pos : pos + take])
                pos += take
                left -= take
            if left <= 2:  # only the chunk's CRLF is left
                crlf = left if left < n - pos else n - pos
                pos += crlf
                left -= crlf
                if left == 0:
                    left = -1
        self.left = left
        self.buf = b"" if ended or pos >= n else buf[pos:]
        if pieces and not sink.finished:
            sink.on_data(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)
            if sink.finished:
                self._complete_with(None)  # the request is done; the framing drains on its own
        if ended:
            self._end(t)

    def _end(self, t: float) -> None:
        sink = self.sink
        self.sink = None
        if sink is not None and not sink.finished:
            try:
                sink.on_end(t)
            except Exception as e:
                self._complete_with(e)
                self._done_with_conn()
                return
        self._complete_with(None)
        self._done_with_conn()

    def _done_with_conn(self) -> None:
        if self.keep_alive and not self.closed:
            self._reset()
            self.buf = b""
            self.pool._release(self)
        else:
            self._abort()

    # -- completion ----------------------------------------------------------------------------
    def _complete(self, exc: BaseException | None) -> None:
        self.sink = None
        self._complete_with(exc)

    def _complete_with(self, exc: BaseException | None) -> None:
        fut = self.future
        if fut is not None and not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def start(self, payload: bytes, sink: Sink, future: asyncio.Future[None]) -> None:
        self._reset()
        self.buf = b""
        self.sink = sink
        self.future = future
        assert self.transport is not None
        self.transport.write(payload)


class Pool:
    """Keep-alive connections to one origin; no limit (the scheduler bounds concurrency)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
        read_timeout_setting: str = "sock_read_timeout",
        headers: dict[str, str] | None = None,
    ) -> None:
        u = urlsplit(base_url)
        self.host = u.hostname or "127.0.0.1"
        self.ssl: ssl_module.SSLContext | None = (
            ssl_module.create_default_context() if u.scheme == "https" else None
        )
        self.port = u.port or (443 if self.ssl else 80)
        self.prefix = u.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        # the setting that lengthens the read timeout, named in a stalled request's error
        self.read_timeout_setting = read_timeout_setting
        self.origin = f"{u.scheme or 'http'}://{self.host}:{self.port}"
        self.connections_opened = 0  # over the pool's life (a benchmark checks none open mid-point)
        host_header = self.host if u.port is None else f"{self.host}:{self.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        common = (
            f"Host: {host_header}\r\nAccept-Encoding: identity\r\nUser-Agent: parasweep-workloads\r\n{extra}"
        )
        self._post_head = f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{common}".encode(
            "latin-1"
        )
        self._get_head = f"Accept: application/json\r\n{common}".encode("latin-1")
        self._idle: list[Connection] = []
        self._busy: set[Connection] = set()
        self._draining: set[Connection] = set()
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def request_bytes(self, path: str, body: bytes) -> bytes:
        """A streamed ``POST`` of the JSON ``body`` to ``path``, ready for :meth:`request`."""
        return (
            b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n"
            % ((self.prefix + path).encode("latin-1"), self._post_head, len(body))
            + body
        )

    def get_bytes(self, path: str) -> bytes:
        """A ``GET`` of ``path``, ready for :meth:`request`."""
        return b"GET %s HTTP/1.1\r\n%s\r\n" % ((self.prefix + path).encode("latin-1"), self._get_head)

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._arm_watchdog()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            msg = f"cannot connect to {self.origin}: connect timeout after {self.connect_timeout:g} s"
            raise HTTPError("connect", msg) from None
        except OSError as e:
            raise HTTPError("connect", f"cannot connect to {self.origin}: {e.strerror or e}") from None
        self.connections_opened += 1
        return conn

    async def open(self, n: int) -> int:
        """Open ``n`` idle keep-alive connections ahead of the load; returns how many opened.

        A closed-loop point opens one per worker before its clock starts, so the first wave of
        requests does not pay (and report in TTFT) hundreds of simultaneous TCP handshakes. A
        connection that fails to open is skipped: its request will connect (and fail) itself. A
        pre-opened connection is taken like any idle one, so one the server closed meanwhile is
        retried on a new connection.
        """
        if n <= 0:
            return 0
        got = await asyncio.gather(*(self._connect() for _ in range(n)), return_exceptions=True)
        opened = 0
        for conn in got:
            if isinstance(conn, Connection):
                self._idle.append(conn)
                opened += 1
            elif isinstance(conn, BaseException) and not isinstance(conn, HTTPError):
                raise conn
        return opened

    async def request(self, payload: bytes, sink: Sink) -> None:
        """Send ``payload`` (from :meth:`request_bytes`) and feed the response to ``sink``.

        Returns when the response ended (or the sink declared the request finished); raises
        :class:`HTTPError` or the sink's own exception on failure.
        """
        for attempt in range(2):
            conn = None
            while self._idle:
                c = self._idle.pop()
                if not c.closed:
                    conn = c
                    break
            if conn is None:
                conn = await self._connect()
            else:
                conn.reused = True  # a server may close an idle connection: retried once below
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            self._busy.add(conn)
            conn.start(payload, sink, fut)
            try:
                await fut
            except HTTPError as e:
                if e.kind == "stale" and attempt == 0:
                    continue
                if e.kind == "stale":
                    raise HTTPError("disconnected", e.message) from None
                raise
            except asyncio.CancelledError:
                conn._abort()
                raise
            finally:
                if conn.sink is not None and conn.future is fut and fut.done():
                    # Finished early ([DONE]): the connection keeps reading until the body ends.
                    self._draining.add(conn)
                    conn.draining_since = clock.now()
            return

    # -- bookkeeping ---------------------------------------------------------------------------
    def _release(self, conn: Connection) -> None:
        self._busy.discard(conn)
        self._draining.discard(conn)
        conn.reused = False
        self._idle.append(conn)

    def _forget(self, conn: Connection) -> None:
        self._busy.discard(conn)
        self._draining.discard(conn)

    def _arm_watchdog(self) -> None:
        assert self._loop is not None
        period = min(1.0, max(0.05, self.read_timeout / 4))
        self._watchdog = self._loop.call_later(period, self._check)

    def _check(self) -> None:
        """Read timeouts without a timer per read: one scan of busy connections per period."""
        now = clock.now()
        for conn in list(self._busy):
            if conn.sink is not None and not conn.sink.finished and now - conn.last_read > self.read_timeout:
                msg = f"stalled: no data for {self.read_timeout:g} s ({self.read_timeout_setting})"
                conn._complete(HTTPError("timeout", msg))
                conn._abort()
        for conn in list(self._draining):
            if now - conn.draining_since > 1.0:  # a server holding the body open after [DONE]
                conn._abort()
                self._draining.discard(conn)
        self._arm_watchdog()

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for conn in [*self._idle, *self._busy, *self._draining]:
            conn._abort()
        self._idle.clear()
        self._busy.clear()
        self._draining.clear()
