"""Load generator features beyond the basics: the simulated engine, duration points, length
distributions, prompt files, goodput, worker processes, the fast loopback server and calibrate."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from vocab.load import LengthDist
from workloads import SLO, LoadPoint, RequestRecord, RequestSpec, read_records, run_point, summarize
from workloads.payloads import build_body
from workloads.testing import ServerProcess, process_group

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# the simulated engine


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "simulator",
        "--model-path",
        "models/tiny-test",
        "--served-model-name",
        "tiny-test",
        "--pp-size",
        "2",
        "--enable-metrics",
        "--sim-hardware",
        "rtx-pro-6000-pcie-x8",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    url = f"http://127.0.0.1:{port}"
    with process_group(argv, cwd=REPO) as proc:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("simulator did not start")
            time.sleep(0.1)
        yield url


@pytest.mark.parametrize("api", ["generate", "completions", "chat"])
def test_simulated_engine_all_apis(simulator: str, api: str) -> None:
    point = LoadPoint(num_requests=12, concurrency=4, warmup_requests=2)
    # The simulator shares this box's cores: a generous lag bound keeps the test about the APIs.
    res = run_point(
        simulator, point, RequestSpec(api=api, input_len=32, output_len=8, seed=3), lag_threshold_ms=250
    )
    m = res.metrics
    assert (m["completed"], m["errors"]) == (12, 0), [r.error for r in res.records if r.error]
    assert all(r.output_tokens == 8 and r.finish_reason == "length" for r in res.records)
    assert m["output_tokens"] == 96 and m["ttft_p50_ms"] > 0 and m["tpot_p50_ms"] > 0
    assert m["valid"] == 1, res.invalid_reasons
    if api != "chat":  # exact prompt lengths from token ids; chat counts the template too
        assert all(r.input_tokens == 32 for r in res.records)


def test_simulated_engine_open_loop_by_duration(simulator: str) -> None:
    point = LoadPoint(rate=40.0, arrival="constant", duration_s=0.5)
    res = run_point(
        simulator, point, RequestSpec(api="generate", input_len=16, output_len=4), lag_threshold_ms=250
    )
    m = res.metrics
    assert point.measured_requests == 20 and m["num_requests"] == 20 and m["errors"] == 0
    assert m["valid"] == 1, res.invalid_reasons


# ---------------------------------------------------------------------------------------------
# the protocol test server and the fast loopback server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(ttft_ms=2, itl_ms=1) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _reset(request: pytest.FixtureRequest) -> None:
    if "server" in request.fixturenames:
        request.getfixturevalue("server").control(mode="ok", every=1, ttft_ms=2, itl_ms=1, tokens_per_chunk=1)


def test_closed_loop_by_duration(server: ServerProcess) -> None:
    point = LoadPoint(concurrency=4, duration_s=0.6, warmup_requests=4)
    t0 = time.monotonic()
    res = run_point(server.url, point, RequestSpec(output_len=10), lag_threshold_ms=250)
    elapsed = time.monotonic() - t0
    m = res.metrics
    measured = [r for r in res.records if not r.warmup]
    sends = sorted(r.send_time for r in measured)  # type: ignore[type-var]
    assert sends[-1] - sends[0] < 0.6 + 0.05  # no send after the window
    assert m["num_requests"] == len(measured) > 20 and m["errors"] == 0
    assert elapsed < 5 and m["valid"] == 1, res.invalid_reasons
    capped = run_point(
        server.url, LoadPoint(concurrency=2, duration_s=30, num_requests=6), RequestSpec(output_len=4)
    )
    assert capped.metrics["num_requests"] == 6  # the count caps a long duration


def test_open_loop_duration_schedule_is_fixed_up_front() -> None:
    p = LoadPoint(rate=100.0, arrival="poisson", duration_s=2.0, warmup_requests=5, seed=9)
    offs = p.send_offsets()
    assert offs[-1] - offs[5] < 2.0 and len(offs) == p.total_requests
    assert abs(p.measured_requests - 200) < 60  # type: ignore[operator]
    again = LoadPoint(rate=100.0, arrival="poisson", duration_s=2.0, warmup_requests=5, seed=9).send_offsets()
    assert np.array_equal(offs, again)
    # The same seed gives the same arrivals whether the point is bounded by count or duration.
    counted = LoadPoint(rate=100.0, arrival="poisson", num_requests=50, warmup_requests=5, seed=9)
    assert np.allclose(counted.send_offsets(), offs[:55])


@pytest.mark.parametrize("http", ["fast", "aiohttp"])
@pytest.mark.parametrize(
    ("mode", "kind"),
    [("cut", "disconnected"), ("malformed", "malformed"), ("http500", "http_5xx"), ("hang", "timeout")],
)
def test_both_http_clients_classify_errors(server: ServerProcess, http: str, mode: str, kind: str) -> None:
    server.control(mode=mode, every=2)
    res = run_point(
        server.url,
        LoadPoint(num_requests=6, concurrency=2),
        RequestSpec(output_len=6),
        sock_read_timeout=0.5,
        http=http,
    )
    assert (res.metrics["completed"], res.metrics[f"errors_{kind}"]) == (3, 3)


def test_loopback_server_all_apis_and_connection_reuse() -> None:
    with ServerProcess(module="workloads.loopback", ttft_ms=1, itl_ms=1) as lb:
        for api in ("generate", "completions", "chat"):
            res = run_point(
                lb.url, LoadPoint(num_requests=40, concurrency=4), RequestSpec(api=api, output_len=5)
            )
            m = res.metrics
            assert (m["completed"], m["output_tokens"]) == (40, 200), [r.error for r in res.records][:3]
            assert all(sum(r.chunk_tokens) == 5 for r in res.records)


# ---------------------------------------------------------------------------------------------
# requests: distributions and prompt files


def test_length_distributions_are_seeded_and_centred() -> None:
    for text in ("uniform:0.5", "normal:0.2", "exponential", "lognormal:0.5"):
        spec = RequestSpec(input_len=200, output_len=50, input_dist=text, output_dist=text, seed=4)
        lens = [build_body(spec, i)[1] for i in range(2000)]
        assert lens == [build_body(spec, i)[1] for i in range(2000)]  # reproducible
        assert min(lens) >= 1 and len(set(lens)) > 10
        assert abs(np.mean(lens) / 200 - 1) < 0.08, text
    uni = [LengthDist.parse("uniform:0.5", 100).sample(np.random.default_rng(i)) for i in range(500)]
    assert min(uni) >= 50 and max(uni) <= 150
    body, n_in, n_out = build_body(
        RequestSpec(input_len=64, input_dist="uniform:0.5", output_dist="exponential"), 7
    )
    assert len(body["input_ids"]) == n_in and body["sampling_params"]["max_new_tokens"] == n_out
    for bad in ("uniform", "uniform:2", "pareto:1", "fixed:3"):
        with pytest.raises(ValueError):
            RequestSpec(input_dist=bad)


def test_prompt_file(tmp_path: Path, server: ServerProcess) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "one two three", "output_len": 3},
        {"messages": [{"role": "user", "content": "hello there"}]},
        {"text": "four five six seven"},
    ]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    spec = RequestSpec(api="chat", output_len=5, prompt_file=str(path))
    bodies = [build_body(spec, i) for i in range(4)]
    assert bodies[0][0]["messages"] == [{"role": "user", "content": "one two three"}] and bodies[0][2] == 3
    assert bodies[1][0]["messages"] == rows[1]["messages"] and bodies[1][2] == 5
    assert bodies[3][0] == bodies[0][0]  # wraps around
    gen = build_body(RequestSpec(api="generate", prompt_file=str(path)), 2)[0]
    assert gen["text"] == "four five six seven"
    shuffled = RequestSpec(api="completions", prompt_file=str(path), shuffle_prompts=True, seed=1)
    first_pass = sorted(build_body(shuffled, i)[0]["prompt"] for i in range(3))
    assert first_pass == sorted(["one two three", "hello there", "four five six seven"])
    res = run_point(server.url, LoadPoint(num_requests=6, concurrency=2), spec)
    assert res.metrics["completed"] == 6 and [r.output_tokens for r in res.records[:2]] == [3, 5]
    (tmp_path / "ids.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    with pytest.raises(ValueError, match="chat"):
        RequestSpec(api="chat", prompt_file=str(tmp_path / "ids.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        RequestSpec(prompt_file=str(tmp_path / "bad.jsonl"))


# ---------------------------------------------------------------------------------------------
# goodput


def test_goodput_against_ttft_and_tpot_slos() -> None:
    b = 1000.0

    def rec(i: int, ttft: float, e2e: float, n: int, error: str | None = None) -> RequestRecord:
        return RequestRecord(
            point="c2",
            index=i,
            send_time=b,
            first_token_time=b + ttft,
            end_time=b + e2e,
            chunk_times=[b + ttft, b + e2e],
            chunk_tokens=[1, n - 1],
            output_tokens=n,
            error=error,
            error_kind="http_5xx" if error else None,
        )

    records = [
        rec(0, 0.1, 1.1, 11),  # TTFT 100 ms, TPOT 100 ms: good
        rec(1, 0.3, 1.3, 11),  # TTFT 300 ms: misses the TTFT bound
        rec(2, 0.1, 2.1, 11),  # TPOT 200 ms: misses the TPOT bound
        rec(3, 0.1, 0.1, 1),  # one token: no TPOT, TTFT fine: good
        rec(4, 0.1, 1.1, 11, error="HTTP 500"),  # failed: never good
    ]
    m = summarize(records, LoadPoint(num_requests=5, concurrency=2), slo=SLO(ttft_ms=200, tpot_ms=150))
    assert m["duration_s"] == pytest.approx(2.1)
    assert m["slo_attainment"] == pytest.approx(2 / 5)
    assert m["goodput_req_s"] == pytest.approx(2 / 2.1)
    assert m["goodput_tok_s"] == pytest.approx(12 / 2.1)
    assert "goodput_req_s" not in summarize(records, LoadPoint(num_requests=5, concurrency=2))
    with pytest.raises(ValueError):
        SLO()


# ---------------------------------------------------------------------------------------------
# worker processes


def test_workers_split_the_point_and_parent_merges(server: ServerProcess, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    seen: list[int] = []
    res = run_point(
        server.url,
        LoadPoint(num_requests=40, concurrency=6, warmup_requests=4),
        RequestSpec(output_len=6),
        workers=2,
        lag_threshold_ms=250,
        records_path=path,
        on_progress=lambda done, total: seen.append(done),
    )
    m = res.metrics
    assert [r.index for r in res.records] == list(range(44))
    assert (m["completed"], m["errors"], m["num_requests"]) == (40, 0, 40)
    assert 5.0 <= m["achieved_concurrency"] <= 6.0 and m["valid"] == 1, res.invalid_reasons
    assert seen == list(range(1, 41))
    assert sorted(r.index for r in read_records(path)) == list(range(44))
    # Open loop over two workers: one shared schedule.
    res = run_point(
        server.url,
        LoadPoint(num_requests=60, rate=100.0, arrival="constant"),
        RequestSpec(output_len=4),
        workers=2,
        lag_threshold_ms=250,
    )
    assert res.metrics["achieved_rate"] == pytest.approx(100.0, rel=0.01) and res.metrics["valid"] == 1


# ---------------------------------------------------------------------------------------------
# the command line


def _workloads_json(*args: str, timeout: float) -> dict[str, Any]:
    """``python -m workloads ARGS --json``: it must exit 0; returns the JSON it prints."""
    p = subprocess.run(
        [sys.executable, "-m", "workloads", *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stderr
    return orjson.loads(p.stdout)


def test_cli_duration_dist_slo_and_calibrate(server: ServerProcess) -> None:
    out = _workloads_json(
        *("--url", server.url, "--concurrency", "3", "--duration", "0.4"),
        *("--output-len", "6", "--output-dist", "uniform:0.5"),
        *("--slo-ttft-ms", "1000", "--slo-tpot-ms", "1000"),
        timeout=60,
    )
    assert out["slo_attainment"] == 1.0 and out["goodput_req_s"] == pytest.approx(out["request_s"])
    assert out["num_requests"] > 10 and out["valid"] == 1
    cal = _workloads_json(
        *("calibrate", "--concurrency-levels", "8,16", "--rates", "50"),
        *("--output-len", "40", "--itl-ms", "5", "--ttft-ms", "5"),
        timeout=120,
    )
    assert [s["kind"] for s in cal["steps"]] == ["streams", "streams", "rate"]
    assert cal["max_streams"] == 16 and cal["max_rate"] == 50, cal["steps"]
