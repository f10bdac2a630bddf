"""Load generator features end to end, against real server processes: the simulated engine,
duration points, the loopback server, prompt files, worker processes, and the command line's
duration, distribution, SLO and calibrate flags.

As everywhere in the slow tier, only what the code guarantees on any machine is asserted; the
point's validity depends on how busy the machine is and is unit-tested with constructed records
(tests/test_workloads_metrics.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from servers import FakeServer, fake_server, loopback_server, started

from orchestrator.process.server import free_port
from vocab.records import PointResult
from workloads import LoadPoint, RequestSpec, read_records, run_point

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _consistent(res: PointResult) -> bool:
    """The verdict agrees with its reasons, and no reason is about failed requests."""
    agree = (res.metrics["valid"] == 1.0) == (res.invalid_reasons == [])
    return agree and not any("requests failed" in r for r in res.invalid_reasons)


# ---------------------------------------------------------------------------------------------
# the simulated engine


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "simulator", "--model-path", str(REPO / "models" / "tiny-test")]
    argv += ["--served-model-name", "tiny-test", "--pp-size", "2", "--enable-metrics"]
    argv += ["--sim-hardware", "rtx-pro-6000-pcie-x8", "--host", "127.0.0.1", "--port", str(port)]
    with started(argv, port) as url:
        yield url


@pytest.mark.parametrize("api", ["generate", "completions", "chat"])
def test_simulated_engine_all_apis(simulator: str, api: str) -> None:
    point = LoadPoint(num_requests=12, concurrency=4, warmup_requests=2)
    res = run_point(simulator, point, RequestSpec(api=api, input_len=32, output_len=8, seed=3))
    m = res.metrics
    assert (m["completed"], m["errors"]) == (12, 0), [r.error for r in res.records if r.error]
    assert all(r.output_tokens == 8 and r.finish_reason == "length" for r in res.records)
    # TPOT can be 0: a busy client may read a whole stream at once.
    assert m["output_tokens_total"] == 96 and m["ttft_p50_ms"] > 0 and m["tpot_p50_ms"] >= 0
    assert _consistent(res), res.invalid_reasons
    if api != "chat":  # exact prompt lengths from token ids; chat counts the template too
        assert all(r.input_tokens == 32 for r in res.records)


def test_simulated_engine_open_loop_by_duration(simulator: str) -> None:
    point = LoadPoint(rate=40.0, arrival="constant", duration_s=0.5)
    res = run_point(simulator, point, RequestSpec(api="generate", input_len=16, output_len=4))
    m = res.metrics
    # Open loop by duration: the schedule fixes the count up front (40 req/s for 0.5 s).
    assert point.measured_requests == 20 and m["num_requests"] == 20 and m["errors"] == 0
    assert _consistent(res), res.invalid_reasons


# ---------------------------------------------------------------------------------------------
# the protocol test server and the fast loopback server


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with fake_server(ttft_ms=2, itl_ms=1) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _reset(request: pytest.FixtureRequest) -> None:
    if "server" in request.fixturenames:
        request.getfixturevalue("server").control(mode="ok", every=1, ttft_ms=2, itl_ms=1, tokens_per_chunk=1)


def test_closed_loop_by_duration(server: FakeServer) -> None:
    point = LoadPoint(concurrency=4, duration_s=0.6, warmup_requests=4)
    res = run_point(server.url, point, RequestSpec(output_len=10))
    m = res.metrics
    measured = [r for r in res.records if not r.warmup]
    assert point.measured_requests is None  # known only afterwards
    assert m["num_requests"] == len(measured) >= 1 and m["errors"] == 0 and _consistent(res)
    assert [r.index for r in res.records] == list(range(len(res.records)))  # no index skipped
    capped = run_point(
        server.url, LoadPoint(concurrency=2, duration_s=30, num_requests=6), RequestSpec(output_len=4)
    )
    assert capped.metrics["num_requests"] == 6  # the count caps a long duration


def test_loopback_server_all_apis_and_connection_reuse() -> None:
    with loopback_server(ttft_ms=1, itl_ms=1) as url:
        for api in ("generate", "completions", "chat"):
            res = run_point(
                url, LoadPoint(num_requests=40, concurrency=4), RequestSpec(api=api, output_len=5)
            )
            m = res.metrics
            assert (m["completed"], m["output_tokens_total"]) == (40, 200), [r.error for r in res.records][:3]
            assert all(sum(r.chunk_tokens) == 5 for r in res.records)


# ---------------------------------------------------------------------------------------------
# prompt files


def test_prompt_file_drives_a_point(tmp_path: Path, server: FakeServer) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "one two three", "output_len": 3}, {"messages": [{"role": "user", "content": "hi"}]}]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    spec = RequestSpec(api="chat", output_len=5, prompt_file=str(path))
    res = run_point(server.url, LoadPoint(num_requests=6, concurrency=2), spec)
    # A row's output_len overrides the spec's; the rows repeat in order.
    assert res.metrics["completed"] == 6 and [r.output_tokens for r in res.records] == [3, 5] * 3


# ---------------------------------------------------------------------------------------------
# worker processes


def test_workers_split_the_point_and_parent_merges(server: FakeServer, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    seen: list[int] = []
    res = run_point(
        server.url,
        LoadPoint(num_requests=40, concurrency=6, warmup_requests=4),
        RequestSpec(output_len=6),
        workers=2,
        records_path=path,
        on_progress=lambda done, total: seen.append(done),
    )
    m = res.metrics
    assert [r.index for r in res.records] == list(range(44))
    assert (m["completed"], m["errors"], m["num_requests"]) == (40, 0, 40)
    assert 0 < m["achieved_concurrency"] <= 6.0 and m["peak_concurrency"] <= 6 and _consistent(res)
    assert seen == list(range(1, 41))
    assert sorted(r.index for r in read_records(path)) == list(range(44))
    # Open loop over two workers: one shared schedule, 10 ms apart from one common start.
    res = run_point(
        server.url,
        LoadPoint(num_requests=60, rate=100.0, arrival="constant"),
        RequestSpec(output_len=4),
        workers=2,
    )
    scheduled = sorted(r.scheduled_time for r in res.records)  # type: ignore[type-var]
    assert res.metrics["completed"] == 60 and _consistent(res)
    assert np.allclose(np.diff(scheduled), 0.01, atol=1e-5)


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


def test_cli_duration_dist_slo_and_calibrate(server: FakeServer) -> None:
    out = _workloads_json(
        *("--url", server.url, "--concurrency", "3", "--duration", "0.4"),
        *("--output-len", "6", "--output-dist", "uniform:0.5"),
        *("--slo-ttft-ms", "1000", "--slo-tpot-ms", "1000"),
        timeout=60,
    )
    assert out["num_requests"] >= 1 and out["errors"] == 0
    assert 0.0 <= out["slo_attainment"] <= 1.0 and 0.0 <= out["goodput_req_s"] <= out["request_s"]
    assert (out["valid"] == 1) == (out["invalid_reasons"] == [])
    cal = _workloads_json(
        *("calibrate", "--concurrency-levels", "8,16", "--rates", "50"),
        *("--output-len", "40", "--itl-ms", "5", "--ttft-ms", "5"),
        timeout=120,
    )
    # Each ladder climbs until its first failing step; the ceiling is its last passing step.
    for kind, ladder, best in (("streams", [8, 16], "max_streams"), ("rate", [50], "max_rate")):
        steps = [s for s in cal["steps"] if s["kind"] == kind]
        assert [s["target"] for s in steps] == ladder[: len(steps)] and steps
        assert all(s["passed"] for s in steps[:-1])
        assert steps[-1]["passed"] or steps[-1]["reasons"]  # a failing step says why
        passed = [s["target"] for s in steps if s["passed"]]
        assert cal[best] == (max(passed) if passed else None)  # NaN is null in JSON
