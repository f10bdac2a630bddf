"""``python -m workloads`` as a user runs it: real processes, real HTTP.

Only what the command guarantees whatever the machine's load is asserted: exit codes, the JSON
contract (keys and types), counts, records, one-line errors. Whether a point is *valid* depends on
how busy the machine was (the client's own lag check), so it is only checked to be consistent
here; the check itself is unit-tested with constructed records (tests/test_workloads_metrics.py).
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from servers import FakeServer, fake_server

from vocab.metric_keys import CONTRACT_METRICS
from vocab.records import ERROR_KINDS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONTRACT_KEYS = CONTRACT_METRICS


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workloads", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with fake_server(ttft_ms=2, itl_ms=1) as srv:
        yield srv


def test_json_output_has_contract_keys(server: FakeServer, tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    p = cli(
        *("--url", server.url, "--api", "chat", "--concurrency", "4", "--requests", "12"),
        *("--input-len", "16", "--output-len", "8", "--warmup", "2", "--records", str(records), "--json"),
    )
    assert p.returncode == 0, p.stderr
    out = orjson.loads(p.stdout)
    for key in CONTRACT_KEYS:
        # A number, or null for a latency without samples (never a string, never missing).
        assert key in out and (out[key] is None or isinstance(out[key], int | float)), key
    assert all(f"errors_{kind}" in out for kind in ERROR_KINDS)
    # The fake server answers every request: all of them completed, with every token counted (the
    # window's share of them, warm-up requests' tokens delivered in it included, is what its throughput
    # is computed from).
    counts = (out["num_requests"], out["completed"], out["errors"], out["output_tokens_total"])
    assert counts == (12, 12, 0, 96)
    assert 0 < out["output_tokens"] <= (12 + 2) * 8 and out["output_tok_s"] == pytest.approx(
        out["output_tokens"] / out["window_s"])
    assert all(math.isfinite(out[k]) and out[k] > 0 for k in ("output_tok_s", "request_s", "ttft_p50_ms"))
    # The verdict and its reasons agree, whatever the machine's load made the verdict.
    assert out["valid"] in (0, 1) and isinstance(out["invalid_reasons"], list)
    assert all(isinstance(r, str) for r in out["invalid_reasons"])
    assert (out["valid"] == 1) == (out["invalid_reasons"] == [])
    assert len(records.read_bytes().splitlines()) == 14  # warmup requests are recorded too


def test_table_output_and_open_loop(server: FakeServer) -> None:
    p = cli(
        "--url", server.url, "--rate", "40", "--arrival", "constant", "--requests", "20", "--output-len", "4"
    )
    assert p.returncode == 0, p.stderr
    assert "r40" in p.stdout and "ttft" in p.stdout and "achieved_rate" in p.stdout
    assert "20/20 completed" in p.stdout
    assert ("valid: the client kept up" in p.stdout) != ("INVALID" in p.stdout)  # exactly one verdict


def test_a_ramped_point_stops_once_its_throughput_is_known() -> None:
    # Its own server with 10 ms between tokens: the sleeps set the throughput. The target is loose (30 %)
    # so that no machine's scheduling jitter, however busy, can keep the interval from closing: what is
    # under test is that the rule stops the point and reports what it judged, not how steady this
    # machine is (the rule's arithmetic has its own tests on fixed records: tests/test_window.py).
    with fake_server(ttft_ms=20, itl_ms=10) as server:
        p = cli(*("--url", server.url, "--concurrency", "4", "--requests", "1000", "--output-len", "16"),
                *("--ramp-s", "0.2", "--ci-target", "0.3", "--json"))
        assert p.returncode == 0, p.stderr
        out = orjson.loads(p.stdout)
        assert out["num_requests"] < 1000  # stopped by the rule, not the bound
        assert out["window_steady"] == 1 and out["window_s"] > 0 and out["ramp_s"] > 0
        # the rule judged the settled part; the whole window, to its drain, can be a little wider
        assert 0 <= out["output_tok_s_ci95_rel"] < 0.3 * 2
    bad = cli("--url", server.url, "--concurrency", "4", "--ci-target", "1.5")
    assert bad.returncode == 2 and "ci_target must be a fraction between 0 and 1" in bad.stderr


def test_non_llm_server_is_one_line_and_exit_1() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO / "workloads",
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split(" port ")[1].split()[0])
        p = cli("--url", f"http://127.0.0.1:{port}", "--api", "completions", "--rate", "5")
    finally:
        proc.kill()
        proc.wait()
    assert p.returncode == 1 and p.stdout == "" and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "does not look like an SGLang or OpenAI-compatible server" in lines[0] and "404" in lines[0]
