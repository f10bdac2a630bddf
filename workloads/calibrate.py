"""``python -m workloads calibrate``: measure the client's own ceiling against a no-op server.

It starts :mod:`workloads.loopback` (a streaming server that does no work) in its own process,
pinned to one CPU while the client keeps the others when the machine has more than one, then
climbs two ladders with the real client:

* **streams**: closed loop at rising concurrency, each stream ``output_len`` tokens ``itl_ms``
  apart. The server offers ``C * 1000 / itl_ms`` tokens/s; the client keeps up while it receives
  (almost) all of them, adds little to TTFT and its event loop does not lag.
* **rates**: open loop, constant arrivals at rising rates, short streams.

A step passes when the point is valid (the client's own self-check) and, for streams, the
client received at least 97 % of the tokens/s the server offered. The ceiling is the last passing
step of each ladder; run trials below it. Everything is measured, nothing is assumed.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from vocab.load import LoadPoint, RequestSpec

from .runner import run_point

THROUGHPUT_PASS = 0.97


@dataclass
class Step:
    kind: str  # "streams" | "rate"
    target: float  # concurrency or req/s
    offered_tok_s: float
    output_tok_s: float
    achieved: float  # achieved concurrency or rate
    ttft_p99_ms: float
    client_overhead_ttft_p99_ms: float  # measured TTFT p99 minus the server's fixed TTFT
    client_lag_p99_ms: float
    valid: bool
    passed: bool
    reasons: list[str]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _pin_split() -> tuple[list[int] | None, set[int] | None]:
    """(server CPUs, client CPUs): the last allowed CPU for the server, the rest for us."""
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return [cpus[-1]], set(cpus[:-1])


@contextlib.contextmanager
def _loopback(startup_timeout_s: float = 20.0, **settings: Any) -> Iterator[str]:
    """``python -m workloads.loopback`` in a session of its own; yields its URL, kills it on exit."""
    argv = [sys.executable, "-m", "workloads.loopback", "--port", "0"]
    for key, value in settings.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], startup_timeout_s)
        line = proc.stdout.readline().decode() if ready else ""
        if not line.startswith("PORT "):
            raise RuntimeError(f"the loopback server did not start (got {line!r})")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()


def calibrate(
    *,
    concurrency_levels: list[int],
    rates: list[float],
    output_len: int = 100,
    itl_ms: float = 10.0,
    ttft_ms: float = 10.0,
    api: str = "generate",
    workers: int = 1,
    requests_per_stream: int = 2,
    seconds_per_rate: float = 2.0,
    pin: bool = True,
    on_step: Any = None,
) -> dict[str, Any]:
    server_cpus, client_cpus = _pin_split() if pin else (None, None)
    settings: dict[str, Any] = {"itl_ms": itl_ms, "ttft_ms": ttft_ms}
    if server_cpus:
        settings["cpu"] = server_cpus[0]
    old_affinity = os.sched_getaffinity(0) if client_cpus else None
    steps: list[Step] = []
    with _loopback(**settings) as url:
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        try:
            spec = RequestSpec(api=api, input_len=16, output_len=output_len, model="loopback")  # type: ignore[arg-type]
            for c in concurrency_levels:
                point = LoadPoint(num_requests=requests_per_stream * c, concurrency=c, warmup_requests=0)
                res = run_point(url, point, spec, workers=workers)
                m = res.metrics
                per_stream = output_len / ((ttft_ms + (output_len - 1) * itl_ms) / 1000.0)
                offered = c * per_stream
                ok_tput = m["output_tok_s"] >= THROUGHPUT_PASS * offered
                step = Step(
                    "streams",
                    c,
                    offered,
                    m["output_tok_s"],
                    m["achieved_concurrency"],
                    m["ttft_p99_ms"],
                    m["ttft_p99_ms"] - ttft_ms,
                    m["client_lag_p99_ms"],
                    res.valid,
                    res.valid and ok_tput,
                    list(res.invalid_reasons),
                )
                if not ok_tput:
                    step.reasons.append(f"received {m['output_tok_s']:.0f} of {offered:.0f} tok/s offered")
                steps.append(step)
                if on_step:
                    on_step(step)
                if not step.passed:
                    break
            short = RequestSpec(api=api, input_len=16, output_len=4, model="loopback")  # type: ignore[arg-type]
            for r in rates:
                n = max(50, int(r * seconds_per_rate))
                point = LoadPoint(num_requests=n, rate=r, arrival="constant")
                res = run_point(url, point, short, workers=workers)
                m = res.metrics
                step = Step(
                    "rate",
                    r,
                    0.0,
                    m["output_tok_s"],
                    m["achieved_rate"],
                    m["ttft_p99_ms"],
                    m["ttft_p99_ms"] - ttft_ms,
                    m["client_lag_p99_ms"],
                    res.valid,
                    res.valid,
                    list(res.invalid_reasons),
                )
                steps.append(step)
                if on_step:
                    on_step(step)
                if not step.passed:
                    break
        finally:
            if old_affinity:
                os.sched_setaffinity(0, old_affinity)

    def best(kind: str) -> Step | None:
        passed = [s for s in steps if s.kind == kind and s.passed]
        return max(passed, key=lambda s: s.target) if passed else None

    bs, br = best("streams"), best("rate")
    return {
        "server_cpus": server_cpus,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "workers": workers,
        "itl_ms": itl_ms,
        "ttft_ms": ttft_ms,
        "output_len": output_len,
        "steps": [s.as_dict() for s in steps],
        "max_streams": bs.target if bs else math.nan,
        "max_output_tok_s": bs.output_tok_s if bs else math.nan,
        "max_rate": br.target if br else math.nan,
    }
