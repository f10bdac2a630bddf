"""Scheduling benchmark: 12 simulated trials with world sizes 8,4,4,2,2,2,2,1,1,1,1,1 on
8 declared GPUs, one sweep through the real entry point (local Ray, simulated engine, sqlite MLflow).

Reports the makespan against its lower bound max(longest trial, total GPU-seconds / 8), both measured
in the same run, and the per-trial scheduling overhead: a trial's time from submission to result
minus its engine start and its load (Ray placement, worker start, config, MLflow logging, artifacts).

Then the same measured durations replayed for a cluster (a replay with the launcher's own policy, not a
run on several nodes): a sweep of twice these trials on two nodes of 8 GPUs, the planned order with
the GPUs counted node by node (what the launcher does) against one planned as if the 16 GPUs were one
pool (what counting a total alone would plan), each replayed on the two nodes; and with two trials
across both nodes added (whole nodes each), the planned order against widest first.

    .venv/bin/python benchmarks/ray_scheduling.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.launcher.queue import best_order, list_schedule

ROOT = Path(__file__).resolve().parents[1]
TRIALS = [f"t{i:02d}" for i in range(1, 13)]
GPUS = 8


def best_list_schedule(widths: list[int], durations: list[float], samples: int = 20000) -> float:
    """How well any list order could have done with hindsight of the measured durations: the
    reference the achieved makespan is judged against, next to the (not always attainable) bound."""
    order = best_order(widths, durations, GPUS, samples=samples, seed=1)
    return list_schedule(order, widths, durations, GPUS)


def cluster_replay(widths: list[int], durations: list[float]) -> None:
    """Twice the sweep's trials on two nodes of 8 GPUs: planned per node against planned as one pool."""
    widths, durations = widths * 2, durations * 2
    nodes = [GPUS, GPUS]
    per_node = list_schedule(best_order(widths, durations, nodes, seed=1), widths, durations, nodes)
    pooled = list_schedule(best_order(widths, durations, 2 * GPUS, seed=1), widths, durations, nodes)
    lower = max(max(durations), sum(w * d for w, d in zip(widths, durations, strict=True)) / (2 * GPUS))
    print(f"cluster replay, 24 trials on 2 nodes x {GPUS} GPUs: planned per node {per_node:.2f} s "
          f"({per_node / lower:.3f} x lower bound {lower:.2f} s); planned as one pool of {2 * GPUS} "
          f"{pooled:.2f} s ({pooled / lower:.3f} x); pool / per node = {pooled / per_node:.3f}")


def across_nodes_replay(widths: list[int], durations: list[float]) -> None:
    """The same 24 trials and two trials across both nodes (16 GPUs, 1.5 x the longest trial each) on
    two nodes of 8: the order planned with each trial's span against widest first, both replayed."""
    wide = 1.5 * max(durations)
    widths, durations = [*widths * 2, 2 * GPUS, 2 * GPUS], [*durations * 2, wide, wide]
    spans = [1] * (len(widths) - 2) + [2, 2]
    nodes = [GPUS, GPUS]
    planned = list_schedule(best_order(widths, durations, nodes, seed=1, spans=spans), widths, durations,
                            nodes, spans)
    widest = sorted(range(len(widths)), key=lambda j: (-widths[j], -durations[j], j))
    widest_first = list_schedule(widest, widths, durations, nodes, spans)
    lower = max(max(durations), sum(w * d for w, d in zip(widths, durations, strict=True)) / (2 * GPUS))
    print(f"across-nodes replay, 24 trials + 2 of 16 GPUs on 2 nodes x {GPUS} GPUs: planned "
          f"{planned:.2f} s ({planned / lower:.3f} x lower bound {lower:.2f} s); widest first "
          f"{widest_first:.2f} s ({widest_first / lower:.3f} x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where runs/ goes (default: a temp dir)")
    parser.add_argument("--output-len", type=int, default=128)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="parasweep-sched-"))
    cmd = [sys.executable, str(ROOT / "run.py"), "--config-dir", str(ROOT / "benchmarks" / "conf"), "-m",
           "+bench_trial=" + ",".join(TRIALS), "model=llama-3.1-8b", f"ray.num_gpus={GPUS}",
           "workload.concurrency=[4]", "workload.requests_per_point=8", "workload.warmup_requests=0",
           "workload.input_len=128", f"workload.output_len={args.output_len}", "resume=false"]
    started = time.time()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, check=False)
    wall = time.time() - started
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        return 1
    (schedule_path,) = sorted((workdir / "runs" / "multirun").glob("*/*/schedule.json"))[-1:]
    rows = json.loads(schedule_path.read_text())

    durations = {r["index"]: r["finished"] - r["submitted"] for r in rows}
    makespan = max(r["finished"] for r in rows) - min(r["submitted"] for r in rows)
    gpu_seconds = sum(r["gpus"] * durations[r["index"]] for r in rows)
    lower = max(max(durations.values()), gpu_seconds / GPUS)
    overhead = []
    for r in rows:
        t = r["timings"]
        engine = t["engine_ready"] - t["engine_launch"]
        load = t["load_end"] - t["load_start"]
        overhead.append(durations[r["index"]] - engine - load)

    print(f"{'trial':>5} {'gpus':>4} {'submitted':>9} {'ended':>7} {'duration':>8} {'overhead':>8}")
    t0 = min(r["submitted"] for r in rows)
    for r, o in zip(rows, overhead, strict=True):
        print(f"{r['index']:>5} {r['gpus']:>4} {r['submitted'] - t0:>8.2f}s {r['finished'] - t0:>6.2f}s "
              f"{durations[r['index']]:>7.2f}s {o:>7.2f}s")
    print(f"makespan {makespan:.2f} s; lower bound {lower:.2f} s (longest trial "
          f"{max(durations.values()):.2f} s, GPU-seconds/{GPUS} {gpu_seconds / GPUS:.2f} s)")
    print(f"makespan / lower bound = {makespan / lower:.3f}   (goal <= 1.10)")
    widths = [r["gpus"] for r in rows]
    measured = [durations[r["index"]] for r in rows]
    best = best_list_schedule(widths, measured)
    print(f"best list schedule of the same measured durations (20,000 random orders + heuristics): "
          f"{best:.2f} s = {best / lower:.3f} x lower bound; achieved / best = {makespan / best:.3f}")
    cluster_replay(widths, measured)
    across_nodes_replay(widths, measured)
    print(f"scheduling overhead per trial: mean {statistics.mean(overhead):.2f} s, "
          f"max {max(overhead):.2f} s   (goal < 1 s)")
    print(f"whole command {wall:.1f} s (includes Ray start and the MLflow store)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
