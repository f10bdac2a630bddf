"""``loadgen_bench.py --suite reference``: the client against a raw-asyncio reference and bench_serving.

A closed-loop job (default 512 streams, 2,048 requests of 128 random input ids and 200 output
tokens at 10 ms: 51,200 tok/s offered) runs with each client in turn, in interleaved rounds
(reference, parasweep, bench_serving, reference, ...), and each client is compared with the
reference measured in the same round:

* **reference** (``benchmarks/loadgen_reference.py``): the least a correct client can do;
* **parasweep**: ``python -m workloads ... --json`` with default settings;
* **bench_serving**: SGLang's ``python -m sglang.benchmark.serving``, when its venv exists
  (see docs/benchmarks.md), else skipped and said so.

Then parasweep's open loop at 200 and 2,000 req/s, constant and Poisson, and the Azure trace slice
replayed on its own timestamps at about 100 req/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from loadgen_common import REPO, cpus, loopback, pinned, print_verdicts


def _closed_loop_args(url: str, a: argparse.Namespace) -> list[str]:
    """The closed-loop job's flags, spelled the same by the reference client and ``python -m workloads``."""
    return [
        *("--url", url, "--concurrency", str(a.concurrency), "--requests", str(a.requests)),
        *("--input-len", str(a.input_len), "--output-len", str(a.output_len)),
    ]


def _headline(d: dict[str, float]) -> dict[str, float]:
    """The figures every client reports, from a client's JSON that uses parasweep's metric names."""
    return {k: d[k] for k in ("output_tok_s", "ttft_p99_ms", "ttft_p50_ms", "completed")}


def run_reference(url: str, a: argparse.Namespace, cpu: int | None) -> dict[str, float]:
    cmd = [sys.executable, str(REPO / "benchmarks" / "loadgen_reference.py"), *_closed_loop_args(url, a)]
    out = subprocess.run(pinned(cmd, cpu), capture_output=True, text=True, timeout=600, check=True)
    return _headline(orjson.loads(out.stdout.strip().splitlines()[-1]))


def run_parasweep(url: str, a: argparse.Namespace, cpu: int | None) -> dict[str, float]:
    cmd = [sys.executable, "-m", "workloads", *_closed_loop_args(url, a), "--json"]
    out = subprocess.run(pinned(cmd, cpu), capture_output=True, text=True, timeout=600, cwd=REPO)
    d = orjson.loads(out.stdout)
    return {**_headline(d), "valid": d["valid"], "client_lag_p99_ms": d["client_lag_p99_ms"]}


def run_bench_serving(url: str, a: argparse.Namespace, cpu: int | None) -> dict[str, float] | str:
    py = Path(a.bench_serving_python)
    if not py.exists():
        return f"skipped: {py} not found (see docs/benchmarks.md for the install)"
    if not Path(a.tokenizer).exists():
        return f"skipped: tokenizer {a.tokenizer} not found (benchmarks/loadgen_tokenizer.py builds it)"
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "bs.jsonl"
        cmd = [
            str(py),
            "-m",
            "sglang.benchmark.serving",
            "--backend",
            "sglang",
            "--base-url",
            url,
            "--dataset-name",
            "random-ids",
            "--random-input-len",
            str(a.input_len),
            "--random-output-len",
            str(a.output_len),
            "--random-range-ratio",
            "1",
            "--num-prompts",
            str(a.requests),
            "--max-concurrency",
            str(a.concurrency),
            "--request-rate",
            "inf",
            "--tokenizer",
            a.tokenizer,
            "--warmup-requests",
            "1",
            "--disable-tqdm",
            "--output-file",
            str(result),
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        out = subprocess.run(pinned(cmd, cpu), capture_output=True, text=True, timeout=900, env=env, cwd=tmp)
        if out.returncode != 0 or not result.exists():
            return "failed: " + (out.stderr.strip().splitlines() or ["no output"])[-1]
        d = json.loads(result.read_text().strip().splitlines()[-1])  # it writes NaN, not null
    return {
        "output_tok_s": d["output_throughput"],
        "ttft_p99_ms": d["p99_ttft_ms"],
        "ttft_p50_ms": d["median_ttft_ms"],
        "completed": d["completed"],
    }


def open_loop_checks(url: str, cpu: int | None) -> list[dict[str, object]]:
    rows = []
    for rate, n in ((200.0, 2000), (2000.0, 10000)):
        for arrival in ("constant", "poisson"):
            cmd = [
                sys.executable,
                "-m",
                "workloads",
                "--url",
                url,
                "--rate",
                str(rate),
                "--arrival",
                arrival,
                "--requests",
                str(n),
                "--input-len",
                "32",
                "--output-len",
                "4",
                "--json",
            ]
            out = subprocess.run(pinned(cmd, cpu), capture_output=True, text=True, timeout=600, cwd=REPO)
            rows.append(_open_loop_row(out, rate, arrival))
    # the Azure trace slice (1,000 requests over 216 s) on its own timestamps, sped up to about 100 req/s:
    # bursts and lulls as recorded, prompts of ~1,000 ids and answers of the recorded lengths (~250
    # tokens: ~20,000 tok/s of streams on the client's one core while it keeps the schedule)
    cmd = [sys.executable, "-m", "workloads", "--url", url, "--arrival", "trace", "--source", "azure",
           "--trace-speed", "21.6", "--json"]
    out = subprocess.run(pinned(cmd, cpu), capture_output=True, text=True, timeout=600, cwd=REPO)
    rows.append(_open_loop_row(out, 100.0, "trace (azure)"))
    return rows


def _open_loop_row(out: subprocess.CompletedProcess[str], rate: float, arrival: str) -> dict[str, object]:
    if out.returncode != 0:
        raise SystemExit(f"open loop r{rate:g} {arrival}: {out.stderr.strip()}")
    d = orjson.loads(out.stdout)
    target = d["offered_rate"] if arrival == "constant" else d["scheduled_rate"]
    return {
        "rate": rate,
        "arrival": arrival,
        "scheduled_rate": d["scheduled_rate"],
        "achieved_rate": d["achieved_rate"],
        "error_pct": (d["achieved_rate"] / target - 1) * 100,
        "schedule_lag_p99_ms": d["schedule_lag_p99_ms"],
        "valid": d["valid"],
        "invalid_reasons": d["invalid_reasons"],
    }



def suite_reference(a: argparse.Namespace, p: argparse.ArgumentParser) -> tuple[dict[str, Any], bool]:
    """parasweep vs the raw-asyncio reference vs bench_serving, then the open-loop checks."""
    server_cpu, client_cpu = cpus()
    offered = a.concurrency * 1000.0 / a.itl_ms
    print(
        f"loopback server on CPU {server_cpu}, clients on CPU {client_cpu}; c={a.concurrency}, "
        f"{a.requests} requests x {a.output_len} tokens, {a.itl_ms:g} ms/token: {offered:,.0f} tok/s offered",
        flush=True,
    )
    every = {"reference": run_reference, "parasweep": run_parasweep, "bench_serving": run_bench_serving}
    wanted = {c.strip() for c in a.clients.split(",") if c.strip()} | {"reference"}
    unknown = wanted - every.keys()
    if unknown:
        p.error(f"unknown client(s): {', '.join(sorted(unknown))}")
    clients = {name: fn for name, fn in every.items() if name in wanted}
    rounds: list[dict[str, object]] = []
    with loopback(a.ttft_ms, a.itl_ms, server_cpu) as url:
        for r in range(a.rounds):
            row: dict[str, object] = {}
            for name, fn in clients.items():
                row[name] = fn(url, a, client_cpu)
            ref = row["reference"]
            assert isinstance(ref, dict)
            line = [f"round {r + 1}:"]
            for name in clients:
                res = row[name]
                if isinstance(res, dict):
                    res["tok_s_ratio"] = res["output_tok_s"] / ref["output_tok_s"]
                    res["ttft_p99_delta_ms"] = res["ttft_p99_ms"] - ref["ttft_p99_ms"]
                    line.append(
                        f"{name} {res['output_tok_s']:,.0f} tok/s ({res['tok_s_ratio']:.3f}x), "
                        f"TTFT p99 {res['ttft_p99_ms']:.1f} ms ({res['ttft_p99_delta_ms']:+.1f});"
                    )
                else:
                    line.append(f"{name} {res};")
            print(" ".join(line), flush=True)
            rounds.append(row)
        checks = [] if a.skip_open_loop else open_loop_checks(url, client_cpu)

    summary: dict[str, dict[str, float]] = {}
    for name in clients:
        got = [row[name] for row in rounds if isinstance(row[name], dict)]
        if not got:
            continue
        summary[name] = {
            k: statistics.median(g[k] for g in got)  # type: ignore[index]
            for k in ("output_tok_s", "ttft_p99_ms", "tok_s_ratio", "ttft_p99_delta_ms")
        }
    print("\nmedians over rounds (ratios are per round, against the reference of the same round):")
    print(f"{'client':<14}{'output tok/s':>14}{'vs reference':>14}{'TTFT p99 ms':>13}{'vs reference':>14}")
    for name, s in summary.items():
        print(
            f"{name:<14}{s['output_tok_s']:>14,.0f}{s['tok_s_ratio']:>13.3f}x{s['ttft_p99_ms']:>13.1f}"
            f"{s['ttft_p99_delta_ms']:>+13.1f}"
        )
    verdicts = []
    if "parasweep" in summary:
        ps = summary["parasweep"]
        verdicts.append(("throughput >= 0.98 x reference", ps["tok_s_ratio"] >= 0.98))
        verdicts.append(("TTFT p99 <= reference + 20 ms", ps["ttft_p99_delta_ms"] <= 20.0))
        if "bench_serving" in summary:
            bs_ratios = [
                row["parasweep"]["output_tok_s"] / row["bench_serving"]["output_tok_s"]  # type: ignore[index]
                for row in rounds
                if isinstance(row["bench_serving"], dict)
            ]
            ratio = statistics.median(bs_ratios)
            summary["parasweep"]["vs_bench_serving"] = ratio
            print(f"parasweep / bench_serving throughput (median of rounds): {ratio:.3f}x")
            verdicts.append(("throughput >= 1.1 x bench_serving", ratio >= 1.1))
    for row in checks:
        print(
            f"open loop r{row['rate']:g} {row['arrival']}: achieved {row['achieved_rate']:.1f} req/s vs "
            f"{row['scheduled_rate']:.1f} scheduled ({row['error_pct']:+.2f} %), send lag p99 "
            f"{row['schedule_lag_p99_ms']:.1f} ms, valid={row['valid']:.0f} {row['invalid_reasons'] or ''}"
        )
        within = abs(float(row["error_pct"])) <= 1.0  # type: ignore[arg-type]
        verdicts.append(
            (
                f"open loop r{row['rate']:g} {row['arrival']} within 1 % or marked invalid",
                within or row["valid"] == 0,
            )
        )
    return {"rounds": rounds, "summary": summary, "open_loop": checks}, print_verdicts(verdicts)
