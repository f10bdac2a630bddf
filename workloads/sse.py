"""A minimal incremental Server-Sent-Events parser.

We parse SSE ourselves (instead of ``async for line in resp.content``) because network reads
arrive in arbitrary pieces: one read can hold several events (the server or the kernel
coalesced them) or a fraction of one. Feeding raw reads here keeps the read loop simple and lets
the caller timestamp each read exactly once, right after the await that produced it.

Only ``data:`` fields matter for LLM streams; ``event:``, ``id:``, ``retry:`` and comments
(``:``) are ignored. Multi-line data is joined with ``\\n`` as the SSE spec says.
"""

from __future__ import annotations

DONE = b"[DONE]"


class SSEParser:
    """Feed bytes, get back the ``data`` payload of every event completed by them."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        # Normalise CRLF once per read; a lone trailing CR may be half of a CRLF, keep it for later.
        if b"\r" in buf:
            tail = b""
            if buf.endswith(b"\r"):
                buf, tail = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n") + tail
        out: list[bytes] = []
        start = 0
        n = len(buf)
        find = buf.find
        while True:
            # Fast path: one "data: " line then the blank line (what every LLM server sends). The
            # first "\n" of the event is found with memchr; if a second "\n" follows at once, it
            # is the event's end and the event has no other line.
            nl = find(b"\n", start)
            if nl < 0:
                break
            if nl + 1 < n and buf[nl + 1] == 10 and buf.startswith(b"data: ", start):
                out.append(buf[start + 6 : nl])
                start = nl + 2
                continue
            end = find(b"\n\n", start)
            if end < 0:
                break
            payload = _event_data(buf[start:end])
            if payload is not None:
                out.append(payload)
            start = end + 2
        self._buf = buf[start:] if start < n else b""
        return out

    def flush(self) -> list[bytes]:
        """Data of a final event that was not terminated by a blank line (lenient on EOF)."""
        rest, self._buf = self._buf.rstrip(b"\r\n"), b""
        if not rest:
            return []
        payload = _event_data(rest)
        return [] if payload is None else [payload]

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet form a complete event."""
        return len(self._buf)


def _event_data(block: bytes) -> bytes | None:
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    if not data:
        return None
    return data[0] if len(data) == 1 else b"\n".join(data)
