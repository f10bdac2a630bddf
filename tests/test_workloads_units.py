"""Load generator pieces that need no server: payloads, SSE parsing, token accounting, metrics."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest

from workloads import (
    LoadPoint,
    RecordWriter,
    RequestRecord,
    RequestSpec,
    read_records,
    records_to_dataframe,
    summarize,
    validity_reasons,
)
from workloads.payloads import build_body, build_request
from workloads.sse import DONE, SSEParser
from workloads.streams import GenerateStream, OpenAIStream, StreamError

# ---------------------------------------------------------------------------------------------
# payloads


def test_generate_body_has_exact_random_ids_and_sampling_params() -> None:
    spec = RequestSpec(api="generate", input_len=37, output_len=9, seed=3, vocab_size=500)
    body, n_in, n_out = build_body(spec, 0)
    assert (n_in, n_out) == (37, 9)
    assert len(body["input_ids"]) == 37
    assert all(0 <= t < 500 for t in body["input_ids"])
    assert body["sampling_params"] == {"max_new_tokens": 9, "ignore_eos": True, "temperature": 0}
    assert body["stream"] is True
    assert "model" not in body


def test_requests_are_reproducible_per_seed_and_index() -> None:
    spec = RequestSpec(api="generate", input_len=64, seed=7)
    a = [build_request(spec, i).body for i in range(5)]
    b = [build_request(spec, i).body for i in range(5)]
    assert a == b
    assert len(set(a)) == 5  # requests differ from each other
    assert build_request(spec, 3).body == a[3]  # independent of what was generated before
    assert build_request(RequestSpec(api="generate", input_len=64, seed=8), 0).body != a[0]


def test_openai_bodies() -> None:
    comp, _, _ = build_body(RequestSpec(api="completions", input_len=10, output_len=4, model="m"), 1)
    assert isinstance(comp["prompt"], list) and len(comp["prompt"]) == 10
    assert comp["max_tokens"] == 4 and comp["ignore_eos"] is True and comp["stream"] is True
    assert comp["stream_options"] == {"include_usage": True}
    assert comp["model"] == "m"
    chat, _, _ = build_body(RequestSpec(api="chat", input_len=50, output_len=4, continuous_usage=True), 1)
    assert chat["max_completion_tokens"] == 4 and chat["ignore_eos"] is True
    assert len(chat["messages"][0]["content"].split()) == 50
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "model" not in chat


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        RequestSpec(api="embeddings")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RequestSpec(input_len=0)


# ---------------------------------------------------------------------------------------------
# load points


def test_labels_and_validation() -> None:
    assert LoadPoint(num_requests=1, concurrency=8).label == "c8"
    assert LoadPoint(num_requests=1, rate=2.5).label == "r2.5"
    assert LoadPoint(num_requests=1, rate=200).label == "r200"
    assert LoadPoint(num_requests=1, rate=200.0).label == "r200"
    for bad in (
        {"concurrency": 1, "rate": 1.0},
        {},
        {"concurrency": 0},
        {"rate": -1.0},
        {"rate": math.inf},
        {"rate": 1.0, "arrival": "burst"},
    ):
        with pytest.raises(ValueError):
            LoadPoint(num_requests=1, **bad)  # type: ignore[arg-type]


def test_send_offsets_are_absolute_and_reproducible() -> None:
    const = LoadPoint(num_requests=8, rate=4.0, arrival="constant", warmup_requests=2).send_offsets()
    assert const.tolist() == [i / 4.0 for i in range(10)]
    p1 = LoadPoint(num_requests=2000, rate=50.0, seed=1).send_offsets()
    p2 = LoadPoint(num_requests=2000, rate=50.0, seed=1).send_offsets()
    assert np.array_equal(p1, p2) and p1[0] == 0.0 and np.all(np.diff(p1) >= 0)
    assert 1999 / p1[-1] == pytest.approx(50.0, rel=0.08)


# ---------------------------------------------------------------------------------------------
# SSE parsing and token accounting


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
# metrics from a hand-built fixture (dyadic times, so every value below is exact)

B = 1024.0


def _fixture() -> list[RequestRecord]:
    warm = RequestRecord(
        "c2",
        0,
        warmup=True,
        send_time=B - 1.0,
        first_token_time=B - 0.5,
        end_time=B + 0.25,
        chunk_times=[B - 0.5],
        chunk_tokens=[1],
        output_tokens=1,
    )
    r1 = RequestRecord(
        "c2",
        1,
        send_time=B,
        first_token_time=B + 0.125,
        end_time=B + 1.0,
        chunk_times=[B + 0.125, B + 0.375, B + 0.75, B + 0.875],
        chunk_tokens=[2, 1, 3, 0],
        input_tokens=10,
        output_tokens=6,
    )
    failed = RequestRecord(
        "c2",
        2,
        send_time=B + 0.25,
        end_time=B + 0.5,
        error="HTTP 500: x",
        error_kind="http_5xx",
        http_status=500,
    )
    r2 = RequestRecord(
        "c2",
        3,
        send_time=B + 0.5,
        first_token_time=B + 0.75,
        end_time=B + 1.0,
        chunk_times=[B + 0.75, B + 1.0],
        chunk_tokens=[1, 1],
        input_tokens=10,
        output_tokens=2,
    )
    return [warm, r1, failed, r2]


def test_itl_tpot_ttft_e2e_match_hand_computed_values() -> None:
    m = summarize(_fixture(), LoadPoint(num_requests=3, concurrency=2, warmup_requests=1), lag_ms=[1.0] * 10)
    # TTFT: 125 and 250 ms (the warmup request's 500 ms is excluded).
    assert (m["ttft_mean_ms"], m["ttft_p50_ms"], m["ttft_max_ms"]) == (187.5, 187.5, 250.0)
    # Per-token ITL: r1 gaps 250 ms (1 token) and 375 ms (3 tokens -> 3 x 125); r2 one gap of 250.
    # The 2 tokens of r1's first chunk give no ITL sample; the 0-token chunk is ignored.
    assert m["itl_mean_ms"] == (250 + 125 * 3 + 250) / 5 == 175.0
    assert (m["itl_p50_ms"], m["itl_p90_ms"], m["itl_max_ms"]) == (125.0, 250.0, 250.0)
    # Per-chunk ITL: 250, 375, 250.
    assert (m["itl_chunk_p50_ms"], m["itl_chunk_max_ms"]) == (250.0, 375.0)
    assert m["itl_chunk_mean_ms"] == pytest.approx(875 / 3, rel=1e-15)
    # TPOT: (1000 - 125) / (6 - 1) = 175 and (500 - 250) / 1 = 250.
    assert (m["tpot_mean_ms"], m["tpot_p50_ms"], m["tpot_max_ms"]) == (212.5, 212.5, 250.0)
    assert (m["e2e_mean_ms"], m["e2e_max_ms"]) == (750.0, 1000.0)
    # Throughput over first measured send (B) -> last measured end (B + 1).
    assert (m["duration_s"], m["output_tok_s"], m["input_tok_s"], m["request_s"]) == (1.0, 8.0, 20.0, 2.0)
    assert m["total_tok_s"] == 28.0
    assert (m["completed"], m["errors"], m["errors_http_5xx"], m["errors_timeout"]) == (2, 1, 1, 0)
    # In flight over [B, B + 0.5]: warmup 0.25 s + r1 0.5 s + failed 0.25 s = 1.0 s -> 2.0.
    assert m["achieved_concurrency"] == 2.0
    assert m["peak_concurrency"] == 2.0
    assert m["client_lag_max_ms"] == 1.0
    assert m["valid"] == 1.0


def test_contract_metric_names_exist() -> None:
    m = summarize(_fixture(), LoadPoint(num_requests=3, concurrency=2, warmup_requests=1))
    for key in (
        "output_tok_s",
        "request_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "tpot_p50_ms",
        "e2e_p50_ms",
        "achieved_concurrency",
        "errors",
        "valid",
    ):
        assert key in m
    assert all(isinstance(v, float) for v in m.values())


def test_nothing_completed_gives_nan_latencies_and_invalid() -> None:
    recs = [
        RequestRecord("c1", i, send_time=B + i, end_time=B + i + 0.5, error="x", error_kind="connect")
        for i in range(4)
    ]
    point = LoadPoint(num_requests=4, concurrency=1)
    m = summarize(recs, point)
    for name in ("ttft", "itl", "itl_chunk", "tpot", "e2e"):
        assert math.isnan(m[f"{name}_p50_ms"]) and math.isnan(m[f"{name}_mean_ms"])
    assert (m["completed"], m["errors"], m["errors_connect"], m["output_tok_s"]) == (0, 4, 4, 0.0)
    assert m["valid"] == 0.0
    assert any("4 of 4 requests failed (mostly connect)" in r for r in validity_reasons(m, point))


def test_validity_flags_low_concurrency_lag_and_rate() -> None:
    recs = _fixture()
    m = summarize(recs, LoadPoint(num_requests=3, concurrency=4, warmup_requests=1), lag_ms=[30.0] * 100)
    reasons = validity_reasons(m, LoadPoint(num_requests=3, concurrency=4, warmup_requests=1))
    assert m["valid"] == 0.0 and len(reasons) == 2
    assert "below 95 % of concurrency 4" in reasons[0] and "lag p99 30.0 ms" in reasons[1]
    # A higher lag threshold accepts the same lag.
    m = summarize(
        recs, LoadPoint(num_requests=3, concurrency=2, warmup_requests=1), lag_ms=[30.0], lag_threshold_ms=50
    )
    assert m["valid"] == 1.0

    # Open loop: 11 sends scheduled 0.1 s apart; sent on time -> valid, sent 2 % slow -> invalid.
    point = LoadPoint(num_requests=11, rate=10.0, arrival="constant")

    def open_records(stretch: float) -> list[RequestRecord]:
        return [
            RequestRecord(
                "r10",
                i,
                scheduled_time=B + i / 10,
                send_time=B + stretch * i / 10,
                end_time=B + stretch * i / 10 + 0.05,
            )
            for i in range(11)
        ]

    ok = summarize(open_records(1.0), point)
    assert ok["achieved_rate"] == pytest.approx(10.0) and ok["scheduled_rate"] == pytest.approx(10.0)
    assert ok["offered_rate"] == 10.0 and ok["valid"] == 1.0
    slow = summarize(open_records(1.02), point)
    assert slow["valid"] == 0.0
    assert "scheduled" in validity_reasons(slow, point)[0]
    assert slow["schedule_lag_max_ms"] == pytest.approx(20.0)


# ---------------------------------------------------------------------------------------------
# records


def test_records_jsonl_roundtrip_torn_line_and_dataframe(tmp_path) -> None:
    path = tmp_path / "sub" / "records.jsonl"
    with RecordWriter(path) as w:
        for r in _fixture():
            w.write(r)
    with path.open("ab") as fh:
        fh.write(b'{"point": "c2", "ind')  # a write torn by a crash
    back = list(read_records(path))
    assert back == _fixture()
    df = records_to_dataframe(back)
    assert len(df) == 4 and df.loc[1, "chunk_tokens"] == [2, 1, 3, 0]
    df.to_parquet(tmp_path / "records.parquet")


def test_uniformly_late_sends_are_invalid_even_at_the_right_rate() -> None:
    point = LoadPoint(num_requests=11, rate=10.0, arrival="constant")
    recs = [
        RequestRecord(
            "r10", i, scheduled_time=B + i / 10, send_time=B + i / 10 + 0.03, end_time=B + i / 10 + 0.1
        )
        for i in range(11)
    ]
    m = summarize(recs, point)
    assert m["achieved_rate"] == pytest.approx(10.0) and m["valid"] == 0.0
    assert validity_reasons(m, point)[0].startswith("sends were late: p99 30.0 ms")
