"""The HTTP client's hot path: SSE parsing (and its fast path), per-API token accounting, per-read
accounting, errors mid-read, how many connections a point opens ahead. In-process, on a fake
transport: no socket, no server."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from vocab.load import LoadPoint
from vocab.records import RequestRecord
from workloads.backend import SSESink
from workloads.fasthttp import Connection, Pool
from workloads.shard import connections_ahead
from workloads.sse import DONE, SSEParser
from workloads.streams import GenerateStream, OpenAIStream, StreamError

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
    """The SSE rules written plainly: blank-line separated blocks; an event is the values of its
    ``data:`` lines (one leading space dropped) joined by \\n; a block without one is no event."""
    text = stream.replace(b"\r\n", b"\n")
    blocks = text.split(b"\n\n")[:-1]  # the part after the last blank line is not an event yet
    out = []
    for block in blocks:
        data = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if data:
            out.append(b"\n".join(data))
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
# SSE parsing and token accounting per API


def test_sse_parser_handles_splits_coalescing_crlf_and_comments() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"a":') == []
    assert p.feed(b' 1}\n\ndata: {"b": 2}\n\ndata: [DO') == [b'{"a": 1}', b'{"b": 2}']
    assert p.feed(b"NE]\n\n") == [DONE]
    p = SSEParser()
    assert p.feed(b": keep-alive\r\n\r\nevent: x\r\ndata: one\r") == []
    assert p.feed(b"\ndata: two\r\n\r\n") == [b"one\ntwo"]
    assert p.feed(b"data:tight") == [] and p.flush() == [b"tight"]


def _gen_event(ct: int, finish: bool = False) -> bytes:
    meta = {
        "completion_tokens": ct,
        "prompt_tokens": 5,
        "finish_reason": {"type": "length"} if finish else None,
    }
    return orjson.dumps({"text": "x" * ct, "meta_info": meta})


def test_generate_stream_counts_cumulative_differences() -> None:
    s = GenerateStream()
    assert [s.on_event(_gen_event(c)) for c in (1, 3, 4)] == [1, 2, 1]
    assert s.on_event(_gen_event(7, finish=True)) == 3
    assert (s.output_tokens, s.prompt_tokens, s.finish_reason) == (7, 5, "length")
    with pytest.raises(StreamError) as e:
        s.on_event(b'{"text": "no meta"}')
    assert e.value.kind == "malformed"
    with pytest.raises(StreamError) as e:
        s.on_event(b'{"error": {"message": "boom"}}')
    assert e.value.kind == "server_error" and "boom" in e.value.message
    with pytest.raises(StreamError) as e:
        s.on_event(b"{nope")
    assert e.value.kind == "malformed"


def test_openai_streams_count_content_chunks_and_take_usage_total() -> None:
    s = OpenAIStream(chat=False)
    assert s.on_event(b'{"choices":[{"index":0,"text":" a","finish_reason":null}],"usage":null}') == 1
    assert s.on_event(b'{"choices":[{"index":0,"text":" bc","finish_reason":"length"}],"usage":null}') == 1
    assert s.on_event(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}') == 0
    assert (s.output_tokens, s.prompt_tokens, s.finish_reason) == (5, 3, "length")

    c = OpenAIStream(chat=True)
    assert c.on_event(b'{"choices":[{"delta":{"role":"assistant","content":""}}]}') == 0
    assert c.on_event(b'{"choices":[{"delta":{"content":"hi"}}]}') == 1
    assert c.on_event(b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}') == 1
    assert c.on_event(b'{"choices":[{"delta":{},"finish_reason":"length"}]}') == 0
    assert (c.output_tokens, c.finish_reason) == (2, "length")  # no usage chunk: counted chunks

    u = OpenAIStream(chat=True)  # continuous usage: exact tokens per chunk
    assert u.on_event(b'{"choices":[{"delta":{"content":"ab"}}],"usage":{"completion_tokens":4}}') == 4
    assert u.on_event(b'{"choices":[{"delta":{"content":"c"}}],"usage":{"completion_tokens":6}}') == 2
    with pytest.raises(StreamError) as e:
        u.on_event(b'{"object":"error","message":"overloaded"}')
    assert e.value.kind == "server_error"


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
        conn = Connection(Pool("http://127.0.0.1:9"))
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
# connections opened ahead of a point


def test_connections_ahead_per_mode_and_shard() -> None:
    assert connections_ahead(LoadPoint(num_requests=100, concurrency=8), 0, 1) == 8
    assert connections_ahead(LoadPoint(num_requests=3, concurrency=8, warmup_requests=1), 0, 1) == 4
    assert connections_ahead(LoadPoint(num_requests=100, concurrency=9), 1, 2) == 4
    assert connections_ahead(LoadPoint(num_requests=3, concurrency=9), 1, 2) == 1
    assert connections_ahead(LoadPoint(duration_s=1.0, concurrency=5), 0, 1) == 5
    assert connections_ahead(LoadPoint(num_requests=10, rate=5.0, max_concurrency=4), 0, 1) == 0


def test_done_constant_is_what_the_parser_returns() -> None:
    assert SSEParser().feed(b"data: [DONE]\n\n") == [DONE]


def test_generate_stream_keeps_the_servers_queue_time() -> None:
    # the meta_info of SGLang 0.5.23's /generate with --enable-metrics: the scheduler's time stats
    # (observability/req_time_stats.py, convert_to_output_meta_info) ride on every chunk
    meta = {"id": "r1", "finish_reason": None, "prompt_tokens": 2048, "weight_version": "default",
            "num_retractions": 0, "completion_tokens": 1, "cached_tokens": 0,
            "forward_entry_time": 1764626400.25, "prefill_finished_time": 1764626400.5, "queue_time": 0.25}
    s = GenerateStream()
    assert s.server_queue_s is None
    assert s.on_event(orjson.dumps({"text": "x", "meta_info": meta})) == 1
    assert s.server_queue_s == 0.25
    # a retracted request queues again: the server's sum grows and the latest report wins
    later = {**meta, "completion_tokens": 2, "queue_time": 0.75, "finish_reason": {"type": "length"}}
    assert s.on_event(orjson.dumps({"text": "xx", "meta_info": later})) == 1
    assert s.server_queue_s == 0.75
    # without metrics the field is absent, and so is the record's
    plain = GenerateStream()
    plain.on_event(_gen_event(1))
    assert plain.server_queue_s is None
