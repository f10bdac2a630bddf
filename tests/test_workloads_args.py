"""``python -m workloads`` argument handling, in-process: bad flags, an unreachable URL, calibrate's flags."""

from __future__ import annotations

import socket

import pytest

from workloads.calibrate_cli import build_parser as calibrate_parser
from workloads.cli import build_parser, main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "argument --concurrency: expected a positive integer"),
        (["--concurrency", "2", "--rate", "3"], "not allowed with argument"),
        (["--rate", "fast"], "argument --rate: expected a positive number"),
        (["--concurrency", "2", "--api", "embed"], "argument --api: invalid choice"),
        (["--concurrency", "2", "--input-dist", "pareto:1"], "error:"),
        (["--concurrency", "2", "--slo-ttft-ms", "-1"], "argument --slo-ttft-ms: expected a positive number"),
        (["--concurrency", "2", "--http", "aiohttp"], "unrecognized arguments: --http"),
    ],
)
def test_bad_flags_give_argparse_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--url", "http://127.0.0.1:1", *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_unreachable_url_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["--url", url, "--concurrency", "2"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"error: cannot connect to {url}: ")


def test_defaults_and_calibrate_ladders() -> None:
    a = build_parser().parse_args(["--url", "u", "--concurrency", "3"])
    assert (a.api, a.requests, a.input_len, a.output_len, a.warmup, a.workers) == (
        "generate",
        None,
        128,
        128,
        0,
        1,
    )
    assert (a.read_timeout, a.lag_threshold_ms, a.arrival) == (300.0, 20.0, "poisson")
    c = calibrate_parser().parse_args(["--concurrency-levels", "8,16", "--rates", ""])
    assert c.concurrency_levels == [8, 16] and c.rates == []
    with pytest.raises(SystemExit):
        calibrate_parser().parse_args(["--concurrency-levels", ""])
