"""Many short trials in one sweep: does everything close, and does the driver's memory stay flat?

    .venv/bin/python benchmarks/sweep_load.py [--trials 50] [--gpus 8] [--json out.json]

Runs ``python run.py -m`` in a scratch directory: ``--trials`` short live trials on the simulated engine
(tiny-test model, one GPU each, ``workload.seed`` swept so each trial is distinct) on a local Ray with
``--gpus`` declared GPUs, so up to that many trials run side by side. While it runs, the driver's
resident memory (VmRSS of the ``run.py`` process) is sampled twice a second, together with how many
trials have ended (their ``progress.json``). Afterwards every trial run in the MLflow store is checked:
closed with a final status, and its artifacts present (records, config, diagnosis, server log).

Printed: wall time, trials per minute, the driver's RSS when the first 10 % of trials had ended and
when the last one ended, the slope of RSS against trials ended in between (a driver that kept
something per trial would grow linearly), and the peak including the end-of-sweep report. A
reference sweep of ``--trials / 5`` trials runs first in the same way, so its peak RSS is the
comparison for the long one (ratio printed). Every number here is from the simulated engine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def ended_trials(sweep_root: Path) -> int:
    n = 0
    for progress in sweep_root.glob("runs/multirun/*/*/*/progress.json"):
        try:
            if json.loads(progress.read_text()).get("status") in ("ok", "failed", "killed", "skipped"):
                n += 1
        except (OSError, ValueError):
            pass  # being written
    return n


def run_sweep(trials: int, gpus: int, workdir: Path) -> dict:
    args = [sys.executable, str(REPO / "run.py"), "-m", "model=tiny-test", "parallelism=tp1", "workload=tiny",
            "workload.concurrency=[2]", "engine.time_scale=20", "telemetry.gpu_hz=2",
            f"ray.num_gpus={gpus}", f"ray.num_cpus={gpus}", f"workload.seed=range(0,{trials})"]
    began = time.monotonic()
    proc = subprocess.Popen(args, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples: list[tuple[float, int, float]] = []  # (seconds, trials ended, RSS MB)
    while proc.poll() is None:
        rss = rss_mb(proc.pid)
        if rss is not None:
            samples.append((time.monotonic() - began, ended_trials(workdir), rss))
        time.sleep(0.5)
    output = proc.stdout.read() if proc.stdout else ""
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"the sweep exited with {proc.returncode}:\n{output[-3000:]}")
    return {"trials": trials, "wall_s": wall, "samples": samples, "check": check_store(workdir, trials)}


def check_store(workdir: Path, trials: int) -> dict:
    """Every trial run closed with a final status and its artifacts present."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("parasweep")
    runs = client.search_runs([exp.experiment_id], "tags.`parasweep.kind` = 'trial'", max_results=10000)
    missing: list[str] = []
    not_closed = [r.info.run_id for r in runs if r.info.status != "FINISHED"]
    for run in runs:
        names = {f.path for f in client.list_artifacts(run.info.run_id)}
        for folder in ("records", "config", "server"):
            names |= {f.path for f in client.list_artifacts(run.info.run_id, folder)}
        needed = ("records/requests.parquet", "config/resolved.yaml", "diagnosis.json", "server/server.log")
        for need in needed:
            if need not in names:
                missing.append(f"{run.info.run_name}: {need}")
    return {"runs": len(runs), "expected": trials, "not_closed": not_closed, "missing_artifacts": missing}


def growth(result: dict) -> dict:
    """The driver's RSS while trials run: at 10 % of them ended, when the last ended, and its slope
    against the number ended (least squares over that span). The end of the sweep (summary, plots, the
    HTML report) runs once, after the trials, so its peak is reported on its own."""
    import numpy as np

    samples, n = result["samples"], result["trials"]
    first = max(1, n // 10)
    trials_done = [s for s in samples if s[1] >= n]
    at_last = trials_done[0][2] if trials_done else samples[-1][2]
    span = [(done, rss) for _, done, rss in samples if first <= done < n] + [(n, at_last)]
    slope = float(np.polyfit([d for d, _ in span], [r for _, r in span], 1)[0]) if len(
        {d for d, _ in span}) > 1 else 0.0
    return {"rss_mb_at_10pct": span[0][1] if span else samples[0][2], "rss_mb_at_last_trial": at_last,
            "peak_rss_mb": max(s[2] for s in samples), "growth_kb_per_trial": 1024 * slope}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs declared to the local Ray")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results = {}
    for name, trials in (("reference", max(2, args.trials // 5)), ("long", args.trials)):
        with tempfile.TemporaryDirectory(prefix="parasweep-load-") as tmp:
            result = run_sweep(trials, args.gpus, Path(tmp))
        g = growth(result)
        results[name] = {**result, **g}
        check = result["check"]
        print(f"{name}: {trials} trials on {args.gpus} declared GPUs in {result['wall_s']:.0f} s "
              f"({60 * trials / result['wall_s']:.1f} trials/min); runs {check['runs']}/{trials}, "
              f"not closed {len(check['not_closed'])}, missing artifacts {len(check['missing_artifacts'])}")
        print(f"  driver RSS: {g['rss_mb_at_10pct']:.0f} MB after 10 % of trials, "
              f"{g['rss_mb_at_last_trial']:.0f} MB when the last ended ({g['growth_kb_per_trial']:+.0f} kB "
              f"per trial, fitted), peak {g['peak_rss_mb']:.0f} MB (the end-of-sweep report included)")
    ratio = results["long"]["peak_rss_mb"] / results["reference"]["peak_rss_mb"]
    print(f"peak driver RSS, {args.trials} trials / {args.trials // 5} trials: {ratio:.2f}")
    if args.json:
        for r in results.values():
            r.pop("samples")
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), **results, "peak_ratio": ratio}, indent=1))
    bad = any(r["check"]["not_closed"] or r["check"]["missing_artifacts"] or r["check"]["runs"] != r["trials"]
              for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
