"""The load generator against the misbehaving fake server (``tests/fakeserver.py``, its own process)
over real HTTP, no mocks.

Asserted is what the code guarantees on any machine: counts, token accounting, error kinds,
records, the schedule it was given, and that the verdict agrees with its reasons. Whether a point
is *valid* also depends on how busy the machine was (the client's own lag check), so that is
unit-tested with constructed records instead (tests/test_workloads_metrics.py).
"""

from __future__ import annotations

import itertools
import math
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from servers import FakeServer, fake_server

from vocab.records import PointResult
from workloads import LoadPoint, RequestSpec, read_records, run_point
from workloads.window import sent_in, steady_window

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with fake_server(ttft_ms=5, itl_ms=2) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _reset(server: FakeServer) -> None:
    server.control(mode="ok", every=1, ttft_ms=5, itl_ms=2, tokens_per_chunk=1)


def _verdict_agrees(res: PointResult) -> bool:
    return (res.metrics["valid"] == 1.0) == (res.invalid_reasons == []) == res.valid


def _no_failure_reason(res: PointResult) -> bool:
    return not any("requests failed" in r or "no measured request" in r for r in res.invalid_reasons)


def test_closed_loop_c8_delivers_count_and_concurrency(server: FakeServer) -> None:
    point = LoadPoint(num_requests=64, concurrency=8, warmup_requests=8)
    spec = RequestSpec(api="generate", input_len=32, output_len=16, seed=1)
    res = run_point(server.url, point, spec)
    m = res.metrics
    assert len(res.records) == 72 and sum(r.warmup for r in res.records) == 8
    assert (m["num_requests"], m["completed"], m["errors"]) == (64, 64, 0)
    # Eight workers never have more than eight requests in flight.
    assert 0 < m["achieved_concurrency"] <= 8.0 and 1 <= m["peak_concurrency"] <= 8
    assert m["offered_concurrency"] == 8 and _verdict_agrees(res) and _no_failure_reason(res)
    # every token of the measured requests arrived; the window's share is what its rates count
    assert m["output_tokens_total"] == 64 * 16 and 0 < m["output_tokens"] <= (64 + 8) * 16
    assert 0 < m["input_tokens"] <= (64 + 8) * 32
    assert all(r.output_tokens == 16 and r.finish_reason == "length" for r in res.records)
    assert all(sum(r.chunk_tokens) == 16 and r.http_status == 200 for r in res.records)
    for r in res.records:  # every timestamp in order: send, head, first token, ..., end
        assert r.send_time < r.first_byte_time <= r.first_token_time == r.chunk_times[0]  # type: ignore[operator]
        assert r.chunk_times == sorted(r.chunk_times) and r.chunk_times[-1] <= r.end_time  # type: ignore[operator]
    # No ITL sample at all is possible (a busy client can get a whole stream in one read): NaN, never 0.
    assert m["ttft_p50_ms"] > 0 and m["output_tok_s"] > 0
    assert math.isnan(m["itl_p50_ms"]) or m["itl_p50_ms"] >= 0


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_apis_closed_loop(server: FakeServer, api: str) -> None:
    res = run_point(server.url, LoadPoint(num_requests=16, concurrency=4), RequestSpec(api=api, output_len=8))
    m = res.metrics
    assert (m["completed"], m["errors"]) == (16, 0) and _verdict_agrees(res) and _no_failure_reason(res)
    # The include_usage chunk gives the total; chat's role and finish chunks carry no token.
    assert all(r.output_tokens == 8 and sum(r.chunk_tokens) == 8 for r in res.records)
    assert all(r.finish_reason == "length" for r in res.records)


def _scheduled_offsets(res: PointResult) -> list[float]:
    recs = sorted(res.records, key=lambda r: r.index)
    return [r.scheduled_time - recs[0].scheduled_time for r in recs]  # type: ignore[operator]


def test_open_loop_follows_the_constant_schedule(server: FakeServer) -> None:
    point = LoadPoint(num_requests=100, rate=50.0, arrival="constant", warmup_requests=2)
    res = run_point(server.url, point, RequestSpec(api="generate", output_len=8))
    m = res.metrics
    assert m["completed"] == 100 and _verdict_agrees(res) and _no_failure_reason(res)
    assert m["offered_rate"] == 50.0 and m["scheduled_rate"] == pytest.approx(50.0)
    # Every request carries the time the schedule gave it: 20 ms apart from one start.
    assert _scheduled_offsets(res) == pytest.approx([i / 50.0 for i in range(102)], abs=1e-6)
    assert math.isfinite(m["achieved_rate"]) and math.isfinite(m["schedule_lag_p99_ms"])


def test_open_loop_poisson_follows_its_schedule(server: FakeServer) -> None:
    point = LoadPoint(num_requests=80, rate=80.0, arrival="poisson", seed=5)
    res = run_point(server.url, point, RequestSpec(api="completions", output_len=8))
    m = res.metrics
    assert m["completed"] == 80 and _verdict_agrees(res) and _no_failure_reason(res)
    offsets = point.send_offsets()
    assert _scheduled_offsets(res) == pytest.approx(list(offsets - offsets[0]), abs=1e-6)
    assert m["scheduled_rate"] == pytest.approx(79 / (offsets[-1] - offsets[0]))


@pytest.mark.parametrize(
    ("mode", "kind", "api"),
    [
        ("http500", "http_5xx", "generate"),
        ("http400", "http_4xx", "completions"),
        ("malformed", "malformed", "generate"),
        ("notsse", "malformed", "chat"),
        ("error_event", "server_error", "chat"),
        ("cut", "disconnected", "generate"),
        ("hang", "timeout", "completions"),
    ],
)
def test_misbehaviour_is_a_per_request_error(server: FakeServer, mode: str, kind: str, api: str) -> None:
    server.control(mode=mode, every=3)  # requests 3, 6, 9, 12 misbehave
    point = LoadPoint(num_requests=12, concurrency=3)
    res = run_point(server.url, point, RequestSpec(api=api, output_len=6, model="m"), sock_read_timeout=1.0)
    m = res.metrics
    assert len(res.records) == 12  # the point went on
    assert (m["completed"], m["errors"], m[f"errors_{kind}"]) == (8, 4, 4)
    failed = [r for r in res.records if r.error]
    assert all(r.error_kind == kind and r.end_time is not None for r in failed)
    if kind.startswith("http_"):
        assert all(r.http_status == int(mode[-3:]) and "injected" in (r.error or "") for r in failed)
    # 4 of 12 failing is reported per request, but is no reason to call the point invalid.
    assert _no_failure_reason(res) and _verdict_agrees(res)
    assert m["ttft_p50_ms"] > 0  # latencies come from the 8 good requests only


def test_unreachable_url_fails_every_request_without_raising() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_point(f"http://127.0.0.1:{port}", LoadPoint(num_requests=5, concurrency=2), RequestSpec())
    assert res.metrics["errors_connect"] == 5 and res.metrics["valid"] == 0
    assert res.invalid_reasons and "5 of 5 requests failed" in res.invalid_reasons[0]


def test_multi_token_chunks_per_token_vs_per_chunk_itl(server: FakeServer) -> None:
    server.control(tokens_per_chunk=4, itl_ms=3)
    res = run_point(server.url, LoadPoint(num_requests=8, concurrency=2), RequestSpec(output_len=16))
    m = res.metrics
    # The server emits 4 tokens per event; two events landing in one network read form one chunk.
    assert all(sum(r.chunk_tokens) == 16 and all(k % 4 == 0 for k in r.chunk_tokens) for r in res.records)
    gaps: list[float] = []
    tokens_after_first = 0
    window = steady_window(res.records, res.point)
    assert window is not None
    for r in sent_in(res.records, window):  # the latencies describe the requests sent in the window
        times = [t for t, k in zip(r.chunk_times, r.chunk_tokens, strict=True) if k > 0]
        gaps += [(b - a) * 1000 for a, b in itertools.pairwise(times)]
        tokens_after_first += sum(k for k in r.chunk_tokens if k > 0) - next(k for k in r.chunk_tokens if k)
    # Per token: a gap g before k tokens is k samples of g/k, so the mean is total gap / tokens.
    if gaps:
        assert m["itl_mean_ms"] == pytest.approx(sum(gaps) / tokens_after_first, rel=1e-9)
        assert m["itl_chunk_mean_ms"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-9)
    else:  # every stream arrived in one read (a very busy client): no ITL sample, so NaN
        assert math.isnan(m["itl_mean_ms"]) and math.isnan(m["itl_chunk_mean_ms"])

    # OpenAI without continuous usage: one count per content event, total from the usage chunk.
    plain = run_point(server.url, LoadPoint(num_requests=4, concurrency=2), RequestSpec("completions", 8, 16))
    assert all(sum(r.chunk_tokens) == 4 and r.output_tokens == 16 for r in plain.records)
    exact = run_point(
        server.url,
        LoadPoint(num_requests=4, concurrency=2),
        RequestSpec("chat", 8, 16, continuous_usage=True),
    )
    # Continuous usage: exact per-chunk counts even though the server coalesces 4 tokens per event.
    assert all(sum(r.chunk_tokens) == 16 and r.output_tokens == 16 for r in exact.records)
    assert all(all(k % 4 == 0 for k in r.chunk_tokens) for r in exact.records)


def test_records_are_written_incrementally(server: FakeServer, tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    seen: list[tuple[int, int, int]] = []

    def progress(done: int, total: int) -> None:
        seen.append((done, total, len(path.read_bytes().splitlines())))

    res = run_point(
        server.url,
        LoadPoint(num_requests=10, concurrency=1),
        RequestSpec(output_len=4),
        records_path=path,
        on_progress=progress,
    )
    # With one request in flight, the file holds exactly the requests finished so far.
    assert seen == [(i, 10, i) for i in range(1, 11)]
    assert list(read_records(path)) == res.records


def test_killed_run_keeps_finished_records(server: FakeServer, tmp_path: Path) -> None:
    server.control(itl_ms=20)  # 200 ms a request, 2 at a time: 1000 requests would take 100 s
    path = tmp_path / "records.jsonl"
    argv = [sys.executable, "-m", "workloads", "--url", server.url, "--concurrency", "2"]
    argv += ["--requests", "1000", "--output-len", "10", "--records", str(path)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Wait for 4 finished requests (the deadline only guards against a hang), then kill -9.
        deadline = time.monotonic() + 120
        while (not path.exists() or len(path.read_bytes().splitlines()) < 4) and proc.poll() is None:
            assert time.monotonic() < deadline, "no 4 records written"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    lines = path.read_bytes().splitlines()
    assert 4 <= len(lines) < 1000
    for line in lines:
        rec = orjson.loads(line)  # every line is complete JSON
        assert rec["error"] is None and rec["output_tokens"] == 10


def test_open_loop_max_concurrency_cap_is_reported(server: FakeServer) -> None:
    server.control(itl_ms=5)
    point = LoadPoint(num_requests=30, rate=100.0, arrival="constant", max_concurrency=2)
    res = run_point(server.url, point, RequestSpec(output_len=10))
    m = res.metrics
    assert m["completed"] == 30 and m["peak_concurrency"] == 2
    # Two at a time, each at least 50 ms on the server: at most 40 req/s of the 100 scheduled.
    assert m["achieved_rate"] < 90 and m["valid"] == 0
    assert any("max_concurrency=2 was reached" in r for r in res.invalid_reasons)
