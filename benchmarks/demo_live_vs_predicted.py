"""The demo's four trials, live on the simulated engine and predicted in virtual time, point by point.

    .venv/bin/python benchmarks/demo_live_vs_predicted.py [--repeats 3] [--depths 8] [--json out.json]

The demo (``make demo``) is Kimi K2 PP8 on 8 PCIe GPUs, ``pp.async_depth`` 0/4/8/16, closed loop at
C = 1, 8 and 32 (256 tokens in, 32 out), each point as the demo's workload plans it: max(8, 3C)
requests after 1 warm-up one, the streams ramped in over the point's predicted request duration, the
point stopped once its throughput is known to ±3 %, and its numbers from the steady window. At its
default micro-batch cap, which micro-batch a request joins depends on when it reaches stage 0, so the
live result depends on when the client's sends arrive. This script measures that:

1. each trial live (``python -m simulator`` at time scale 1 pinned to CPU 0, the load generator pinned to
   CPU 1), ``--repeats`` times, and the gap between the first sends of each point as the load generator
   recorded them;
2. each trial predicted (``simulator.predict.predict_trial``, the live client's 20 µs send spacing);
3. the prediction's sensitivity: the same points predicted with first sends 0 (all at once) to 1 ms apart.

Printed: live/predicted ratio per point (1.00 = agreement), the median of the live runs against the
prediction, the live spread over repeats, and the sensitivity table. Every number is from the simulated
engine (none is a GPU measurement).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from orchestrator.points.ramp import ramped
from simulator.predict import VirtualTrial, load_config, predict_trial
from workloads import LoadPoint, RequestSpec, run_point

REPO = Path(__file__).resolve().parent.parent

DEPTHS = (0, 4, 8, 16)
CONCURRENCY = (1, 8, 32)
SPEC = RequestSpec(api="generate", input_len=256, output_len=32, seed=0)
GAPS_US = (0, 1, 20, 150, 300, 1000)
SERVER_CPU, CLIENT_CPU = 0, 1


def points(depth: int) -> list[LoadPoint]:
    """The demo's points for one trial, ramped as its load plan ramps them (``workload.ramp=auto``)."""
    engine = load_config(argv(depth))
    base = [LoadPoint(concurrency=c, num_requests=max(8, 3 * c), warmup_requests=1, ci_target=0.03)
            for c in CONCURRENCY]
    return [ramped(p, lambda q: VirtualTrial(engine).run_point(q, SPEC)) for p in base]


def argv(depth: int) -> list[str]:
    return ["--model-path", str(REPO / "models" / "kimi-k2"), "--served-model-name", "kimi-k2",
            "--pp-size", "8", "--pp-async-batch-depth", str(depth), "--skip-tokenizer-init",
            "--random-seed", "0", "--sim-hardware", "rtx-pro-6000-pcie-x8"]


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def live_trial(depth: int) -> tuple[list[float], list[float]]:
    """Output tok/s per point, and the median gap (µs) between each point's first measured sends."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "simulator", *argv(depth), "--port", str(port)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=lambda: _pin(SERVER_CPU))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the simulated engine did not start") from None
                time.sleep(0.1)
        tok_s, gaps = [], []
        for point in points(depth):
            result = run_point(url, point, SPEC)
            tok_s.append(result.metrics["output_tok_s"])
            sends = sorted(r.send_time for r in result.records if not r.warmup and r.send_time)
            first = sends[:point.concurrency or 1]
            gaps.append(1e6 * statistics.median(b - a for a, b in itertools.pairwise(first))
                        if len(first) > 1 else 0.0)
        return tok_s, gaps
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def predicted(depth: int, gap_s: float | None = None) -> list[float]:
    kwargs = {} if gap_s is None else {"send_spacing_s": gap_s}
    return [r.metrics["output_tok_s"] for r in predict_trial(argv(depth), points(depth), SPEC, **kwargs)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="live runs of each trial")
    ap.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS), help="the trials' async depths")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    _pin(CLIENT_CPU)
    labels = [f"c{c}" for c in CONCURRENCY]
    rows = []
    print("live (simulated engine) / predicted output tok/s, per point; every number is simulated")
    print(f"{'trial':<16}{'point':<7}{'predicted':>10}{'live runs':>26}{'ratio':>14}{'median':>8}"
          f"{'first-send gap':>16}")
    for depth in args.depths:
        pred = predicted(depth)
        runs = [live_trial(depth) for _ in range(args.repeats)]
        for i, label in enumerate(labels):
            live = [r[0][i] for r in runs]
            gaps = [r[1][i] for r in runs]
            ratios = [x / pred[i] for x in live]
            median = statistics.median(live) / pred[i]
            rows.append({"trial": f"pp.async_depth={depth}", "point": label, "predicted": pred[i],
                         "live": live, "ratios": ratios, "median_ratio": median, "first_send_gap_us": gaps})
            print(f"{'async_depth=' + str(depth):<16}{label:<7}{pred[i]:>10.1f}"
                  f"{', '.join(f'{x:.1f}' for x in live):>26}"
                  f"{min(ratios):>8.3f}-{max(ratios):.3f}{median:>8.3f}{statistics.median(gaps):>12.0f} µs")
    worst = max(abs(r - 1) for row in rows for r in row["ratios"])
    worst_median = max(abs(row["median_ratio"] - 1) for row in rows)
    print(f"largest live/predicted deviation: {100 * worst:.1f} % (of a live run), "
          f"{100 * worst_median:.1f} % (of the median of the live runs)")
    print("\nprediction's sensitivity to the gap between a point's first sends "
          f"(async_depth={args.depths[0]}):")
    sensitivity = {}
    for gap in GAPS_US:
        sensitivity[gap] = predicted(args.depths[0], gap * 1e-6)
        pairs = zip(labels, sensitivity[gap], strict=True)
        print(f"  {gap:>5} µs: " + ", ".join(f"{lab} {x:.1f}" for lab, x in pairs))
    if args.json:
        machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()}
        args.json.write_text(json.dumps({"machine": machine, "rows": rows, "worst_deviation": worst,
                                         "worst_median_deviation": worst_median,
                                         "sensitivity_tok_s": sensitivity}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
