"""The load generator against a real local SSE server process over real HTTP (no mocks)."""

from __future__ import annotations

import itertools
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from workloads import LoadPoint, RequestSpec, read_records, run_point
from workloads.testing import ServerProcess, process_group

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(ttft_ms=5, itl_ms=2) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _reset(server: ServerProcess) -> None:
    server.control(mode="ok", every=1, ttft_ms=5, itl_ms=2, tokens_per_chunk=1)


def test_closed_loop_c8_delivers_count_and_concurrency(server: ServerProcess) -> None:
    point = LoadPoint(num_requests=64, concurrency=8, warmup_requests=8)
    spec = RequestSpec(api="generate", input_len=32, output_len=16, seed=1)
    res = run_point(server.url, point, spec)
    m = res.metrics
    assert len(res.records) == 72 and sum(r.warmup for r in res.records) == 8
    assert (m["num_requests"], m["completed"], m["errors"]) == (64, 64, 0)
    assert 7.6 <= m["achieved_concurrency"] <= 8.0 and m["peak_concurrency"] == 8
    assert m["valid"] == 1 and res.invalid_reasons == []
    assert m["output_tokens"] == 64 * 16 and m["input_tokens"] == 64 * 32
    assert all(r.output_tokens == 16 and r.finish_reason == "length" for r in res.records)
    assert all(sum(r.chunk_tokens) == 16 and r.http_status == 200 for r in res.records)
    # 5 ms TTFT and 2 ms per token on the server, plus loopback and scheduling noise.
    assert 4.0 < m["ttft_p50_ms"] < 50 and 1.5 < m["itl_p50_ms"] < 20 and m["output_tok_s"] > 0


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_apis_closed_loop(server: ServerProcess, api: str) -> None:
    res = run_point(server.url, LoadPoint(num_requests=16, concurrency=4), RequestSpec(api=api, output_len=8))
    m = res.metrics
    assert (m["completed"], m["errors"], m["valid"]) == (16, 0, 1)
    # The include_usage chunk gives the total; chat's role and finish chunks carry no token.
    assert all(r.output_tokens == 8 and sum(r.chunk_tokens) == 8 for r in res.records)
    assert all(r.finish_reason == "length" for r in res.records)


def test_open_loop_constant_rate_is_achieved(server: ServerProcess) -> None:
    point = LoadPoint(num_requests=100, rate=50.0, arrival="constant", warmup_requests=2)
    res = run_point(server.url, point, RequestSpec(api="generate", output_len=8))
    m = res.metrics
    assert m["completed"] == 100 and m["valid"] == 1, res.invalid_reasons
    assert m["offered_rate"] == 50.0 and m["scheduled_rate"] == pytest.approx(50.0)
    assert m["achieved_rate"] == pytest.approx(50.0, rel=0.02)
    assert m["schedule_lag_p99_ms"] < 20


def test_open_loop_poisson_follows_its_schedule(server: ServerProcess) -> None:
    point = LoadPoint(num_requests=80, rate=80.0, arrival="poisson", seed=5)
    res = run_point(server.url, point, RequestSpec(api="completions", output_len=8))
    m = res.metrics
    assert m["completed"] == 80 and m["valid"] == 1, res.invalid_reasons
    assert m["achieved_rate"] == pytest.approx(m["scheduled_rate"], rel=0.01)
    offsets = point.send_offsets()
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
def test_misbehaviour_is_a_per_request_error(server: ServerProcess, mode: str, kind: str, api: str) -> None:
    server.control(mode=mode, every=3)  # requests 3, 6, 9, 12 misbehave
    point = LoadPoint(num_requests=12, concurrency=3)
    res = run_point(server.url, point, RequestSpec(api=api, output_len=6, model="m"), sock_read_timeout=0.5)
    m = res.metrics
    assert len(res.records) == 12  # the point went on
    assert (m["completed"], m["errors"], m[f"errors_{kind}"]) == (8, 4, 4)
    failed = [r for r in res.records if r.error]
    assert all(r.error_kind == kind and r.end_time is not None for r in failed)
    if kind.startswith("http_"):
        assert all(r.http_status == int(mode[-3:]) and "injected" in (r.error or "") for r in failed)
    assert m["valid"] == 1  # 4 of 12 failing is reported, but does not make the point invalid
    assert m["ttft_p50_ms"] > 0  # latencies come from the 8 good requests only


def test_unreachable_url_fails_every_request_without_raising() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_point(f"http://127.0.0.1:{port}", LoadPoint(num_requests=5, concurrency=2), RequestSpec())
    assert res.metrics["errors_connect"] == 5 and res.metrics["valid"] == 0
    assert res.invalid_reasons and "5 of 5 requests failed" in res.invalid_reasons[0]


def test_multi_token_chunks_per_token_vs_per_chunk_itl(server: ServerProcess) -> None:
    server.control(tokens_per_chunk=4, itl_ms=3)
    res = run_point(server.url, LoadPoint(num_requests=8, concurrency=2), RequestSpec(output_len=16))
    m = res.metrics
    # The server emits 4 tokens per event; two events landing in one network read form one chunk.
    assert all(sum(r.chunk_tokens) == 16 and all(k % 4 == 0 for k in r.chunk_tokens) for r in res.records)
    gaps: list[float] = []
    tokens_after_first = 0
    for r in res.records:
        times = [t for t, k in zip(r.chunk_times, r.chunk_tokens, strict=True) if k > 0]
        gaps += [(b - a) * 1000 for a, b in itertools.pairwise(times)]
        tokens_after_first += sum(k for k in r.chunk_tokens if k > 0) - next(k for k in r.chunk_tokens if k)
    # Per token: a gap g before k tokens is k samples of g/k, so the mean is total gap / tokens.
    assert m["itl_mean_ms"] == pytest.approx(sum(gaps) / tokens_after_first, rel=1e-9)
    assert m["itl_chunk_mean_ms"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-9)
    assert m["itl_chunk_p50_ms"] > 10  # 4 tokens x 3 ms per chunk

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


def test_records_are_written_incrementally(server: ServerProcess, tmp_path: Path) -> None:
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


def test_killed_run_keeps_finished_records(server: ServerProcess, tmp_path: Path) -> None:
    server.control(itl_ms=20)
    path = tmp_path / "records.jsonl"
    argv = [
        sys.executable,
        "-m",
        "workloads",
        "--url",
        server.url,
        "--concurrency",
        "2",
        "--requests",
        "200",
        "--output-len",
        "10",
        "--records",
        str(path),
    ]
    with process_group(argv, cwd=REPO):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not path.exists() or len(path.read_bytes().splitlines()) < 4):
            time.sleep(0.05)
    lines = path.read_bytes().splitlines()
    assert 4 <= len(lines) < 200
    for line in lines:
        rec = orjson.loads(line)  # every line is complete JSON
        assert rec["error"] is None and rec["output_tokens"] == 10


def test_open_loop_max_concurrency_cap_is_reported(server: ServerProcess) -> None:
    server.control(itl_ms=5)
    point = LoadPoint(num_requests=30, rate=100.0, arrival="constant", max_concurrency=2)
    res = run_point(server.url, point, RequestSpec(output_len=10))
    m = res.metrics
    assert m["completed"] == 30 and m["peak_concurrency"] == 2
    assert m["achieved_rate"] < 90 and m["valid"] == 0
    assert any("max_concurrency=2 was reached" in r for r in res.invalid_reasons)
