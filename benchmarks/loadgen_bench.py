"""Load generator benchmarks against the loopback server (``python -m workloads.loopback``).

    .venv/bin/python benchmarks/loadgen_bench.py [--suite clients|reference] [--json out.json]

``--suite clients`` (the default, under 2 minutes): the HTTP client decision. The load generator's
own client (``fast``) and aiohttp with pre-opened, warmed connections (``aiohttp``) do the same
closed-loop jobs through the same harness (``benchmarks/loadgen_clients.py``, one process per run):

* ``requests``: 8-token streams, 1 ms to the first token and 1 ms apart, at concurrency 64 and 256
  (the server's timetable allows 8,000 and 32,000 req/s): requests/s where the client's core is
  the limit, and client CPU per request everywhere.
* ``streams``: 100-token streams, 10 ms apart, at concurrency 64 and 256 (6,400 and 25,600 events/s
  offered): CPU per event and how late each read is timestamped against the server's timetable.

``--reps`` repetitions (default 5), the two clients back to back, the first one alternating; per
repetition aiohttp is compared with fast (a ratio, or a difference for times in ms), then medians.
``fast`` is the reference measured in the same run. Exit code 0 while aiohttp does not match it
(the kept client is still the better one), 1 if aiohttp matches it on every criterion.

``--suite reference`` (``benchmarks/loadgen_vs_reference.py``): the client against a raw-asyncio
reference client of our own and SGLang ``bench_serving`` on 512 streams x 200 tokens at 10 ms,
then the open loop at 200 and 2,000 req/s. Options: ``--rounds``, ``--concurrency``,
``--requests``, ``--output-len``, ``--itl-ms``, ``--clients``, ``--skip-open-loop``.

The server runs pinned to the first CPU and every client to the second (``loadgen_common.py``).
Run on an otherwise idle machine: other load shows up in every client's numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from loadgen_common import REPO, cpus, loopback, pinned
from loadgen_vs_reference import suite_reference

# ---------------------------------------------------------------------------------------------
# --suite clients: the HTTP client decision

CLIENT_JOBS: dict[str, tuple[int, float, float, dict[int, int]]] = {
    # job: (output_len, ttft_ms, itl_ms, {concurrency: requests}); each run lasts 1-4 s
    "requests": (8, 1.0, 1.0, {64: 8000, 256: 12000}),
    "streams": (100, 10.0, 10.0, {64: 192, 256: 768}),
}
CLIENT_LEVELS = (64, 256)
CLIENT_KEYS = (
    "request_s",
    "output_tok_s",
    "cpu_us_per_request",
    "cpu_us_per_event",
    "cpu_share",
    "chunk_lag_p50_ms",
    "chunk_lag_p99_ms",
    "client_lag_p99_ms",
)
# What "aiohttp matches fast" means, per job and level: the per-repetition comparison of each metric
# (a ratio aiohttp / fast, or for times in ms a difference aiohttp - fast) within this bound.
MATCH = (
    ("request_s", "ratio >=", 0.95),
    ("cpu_us_per_request", "ratio <=", 1.10),
    ("chunk_lag_p99_ms", "delta <=", 1.0),
)


def _compare(k: str, fast: float, other: float) -> float:
    """aiohttp against fast on metric ``k``: a difference for times in ms, else a ratio."""
    if k.endswith("_ms"):
        return other - fast
    return other / fast if fast else float("nan")


def _fmt_compare(k: str, v: float) -> str:
    return f"{v:+.1f} ms" if k.endswith("_ms") else f"{v:.2f}x"


def run_client(url: str, client: str, c: int, job: str, cpu: int | None) -> dict[str, Any]:
    output_len, ttft_ms, itl_ms, requests = CLIENT_JOBS[job]
    cmd = [sys.executable, str(REPO / "benchmarks" / "loadgen_clients.py"), "--url", url, "--client", client]
    cmd += ["--concurrency", str(c), "--requests", str(requests[c]), "--output-len", str(output_len)]
    cmd += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
    out = subprocess.run(pinned(cmd, cpu), capture_output=True, text=True, timeout=300, check=True)
    return orjson.loads(out.stdout.strip().splitlines()[-1])


def suite_clients(a: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    server_cpu, client_cpu = cpus()
    print(
        f"loopback server on CPU {server_cpu}, clients on CPU {client_cpu}; {a.reps} repetitions", flush=True
    )
    runs: list[dict[str, Any]] = []
    for job, (_, ttft_ms, itl_ms, _) in CLIENT_JOBS.items():
        with loopback(ttft_ms, itl_ms, server_cpu) as url:
            for c in CLIENT_LEVELS:
                for rep in range(a.reps):
                    order = ("fast", "aiohttp") if rep % 2 == 0 else ("aiohttp", "fast")
                    got = {client: run_client(url, client, c, job, client_cpu) for client in order}
                    for client in order:
                        runs.append({"job": job, "concurrency": c, "rep": rep, **got[client]})
                    f, h = got["fast"], got["aiohttp"]
                    print(
                        f"{job:>8} c{c:<4} rep {rep + 1}: "
                        + "  ".join(
                            f"{n} {r['request_s']:7,.0f} req/s {r['cpu_us_per_request']:6,.0f} us/req "
                            f"lag p99 {r['chunk_lag_p99_ms']:5.1f} ms"
                            for n, r in (("fast", f), ("aiohttp", h))
                        )
                        + f"  errors {f['errors']:.0f}/{h['errors']:.0f}  connects mid-point "
                        + f"{f['connections_during_point']}/{h['connections_during_point']}",
                        flush=True,
                    )
    summary: list[dict[str, Any]] = []
    verdicts: list[tuple[str, bool]] = []
    for job in CLIENT_JOBS:
        for c in CLIENT_LEVELS:
            row: dict[str, Any] = {"job": job, "concurrency": c}
            by_client = {
                client: sorted(
                    (r for r in runs if (r["job"], r["concurrency"], r["client"]) == (job, c, client)),
                    key=lambda r: r["rep"],
                )
                for client in ("fast", "aiohttp")
            }
            for k in CLIENT_KEYS:
                for client, mine in by_client.items():
                    row[f"{client}_{k}"] = statistics.median(r[k] for r in mine)
                # Compared per repetition (both clients ran back to back), then the median.
                row[f"vs_{k}"] = statistics.median(
                    _compare(k, f[k], h[k])
                    for f, h in zip(by_client["fast"], by_client["aiohttp"], strict=True)
                )
            summary.append(row)
            for k, rule, bound in MATCH:
                v = row[f"vs_{k}"]
                ok = v >= bound if rule.endswith(">=") else v <= bound
                verdicts.append(
                    (f"{job} c{c}: {k} aiohttp vs fast {_fmt_compare(k, v)} ({rule} {bound:g})", ok)
                )
    print(
        "\nmedians over repetitions; 'aiohttp vs fast' = median over repetitions of aiohttp / fast "
        "(for ms: aiohttp - fast), both measured back to back:"
    )
    print(f"{'job':<9}{'c':>5}  {'metric':<20}{'fast':>11}{'aiohttp':>11}{'aiohttp vs fast':>17}")
    for row in summary:
        for k in CLIENT_KEYS:
            print(
                f"{row['job']:<9}{row['concurrency']:>5}  {k:<20}{row[f'fast_{k}']:>11,.1f}"
                f"{row[f'aiohttp_{k}']:>11,.1f}{_fmt_compare(k, row[f'vs_{k}']):>17}"
            )
    matches = all(ok for _, ok in verdicts)
    for what, ok in verdicts:
        print(f"{'yes' if ok else 'NO '}  {what}")
    print(
        "verdict: aiohttp with pre-opened connections "
        + ("matches the fast client on every criterion" if matches else "does NOT match the fast client")
    )
    # The kept client is `fast`: the run passes while aiohttp does not match it (a guard for the choice).
    return {"runs": runs, "summary": summary, "verdicts": verdicts}, not matches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=("clients", "reference"), default="clients")
    p.add_argument("--reps", type=int, default=5, help="clients suite: repetitions (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="reference suite: rounds (default 3)")
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--requests", type=int, default=2048)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=200)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--ttft-ms", type=float, default=10.0)
    p.add_argument("--bench-serving-python", default="/tmp/sglang-bench-venv/bin/python")
    p.add_argument("--tokenizer", default="/tmp/loopback-tokenizer")
    p.add_argument("--skip-open-loop", action="store_true")
    p.add_argument(
        "--clients",
        default="reference,parasweep,bench_serving",
        help="reference suite: a subset of reference,parasweep,bench_serving (reference always runs)",
    )
    p.add_argument("--json", type=Path, help="also write all results to this file")
    a = p.parse_args(argv)
    results, ok = suite_clients(a) if a.suite == "clients" else suite_reference(a, p)
    if a.json:
        with contextlib.suppress(OSError):
            a.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
