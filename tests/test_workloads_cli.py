"""``python -m workloads`` as a user runs it: real processes, real HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from workloads.testing import ServerProcess

REPO = Path(__file__).resolve().parents[1]
CONTRACT_KEYS = (
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
)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workloads", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(ttft_ms=2, itl_ms=1) as srv:
        yield srv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_json_output_has_contract_keys(server: ServerProcess, tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    p = cli(
        "--url",
        server.url,
        "--api",
        "chat",
        "--concurrency",
        "4",
        "--requests",
        "12",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--warmup",
        "2",
        "--records",
        str(records),
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = orjson.loads(p.stdout)
    for key in CONTRACT_KEYS:
        assert key in out
    assert out["valid"] == 1 and out["invalid_reasons"] == [] and out["completed"] == 12
    assert len(records.read_bytes().splitlines()) == 14  # warmup requests are recorded too


def test_table_output_and_open_loop(server: ServerProcess) -> None:
    p = cli(
        "--url", server.url, "--rate", "40", "--arrival", "constant", "--requests", "20", "--output-len", "4"
    )
    assert p.returncode == 0, p.stderr
    assert "r40" in p.stdout and "ttft" in p.stdout and "achieved_rate" in p.stdout and "valid" in p.stdout


def _one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 1
    assert "Traceback" not in p.stderr and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_unreachable_url_is_one_line_and_exit_1() -> None:
    line = _one_line_error(cli("--url", f"http://127.0.0.1:{_free_port()}", "--concurrency", "2"))
    assert line.startswith("error: cannot connect to http://127.0.0.1:")


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
        line = _one_line_error(
            cli("--url", f"http://127.0.0.1:{port}", "--api", "completions", "--rate", "5")
        )
        assert "does not look like an SGLang or OpenAI-compatible server" in line and "404" in line
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "argument --concurrency: expected a positive integer"),
        (["--concurrency", "2", "--rate", "3"], "not allowed with argument"),
        (["--rate", "fast"], "argument --rate: expected a positive number"),
        (["--concurrency", "2", "--api", "embed"], "argument --api: invalid choice"),
    ],
)
def test_bad_flags_give_argparse_error(args: list[str], message: str) -> None:
    p = cli("--url", "http://127.0.0.1:1", *args)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr
