"""Every shipped experiment preset run as a prediction (``predict=true``): how long it takes against a
reference checkout (the same presets, the same machine, back to back), and how sure its points are.

    git worktree add /tmp/parasweep-ref <commit>        # the reference: e.g. the commit before a change
    .venv/bin/python benchmarks/predicted_points.py --reference /tmp/parasweep-ref [--preset pd-vs-agg]

For each preset: the wall time of ``run.py -m experiment=<preset> predict=true`` with this checkout and
with the reference (ratio = this / reference), and over this checkout's trials, the widest throughput
interval (``output_tok_s_ci95_rel``) among the points that reached their targets and the points that
stopped at their virtual-time budget instead (``budget_hit``). Each run writes to its own scratch
directory and MLflow store. Results: docs/benchmarks.md, "Predicted points".
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def presets() -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def is_search(preset: str) -> bool:
    """A search preset runs as one ``run.py`` (its candidates are its sweep), not with ``-m``."""
    text = (REPO / "conf" / "experiment" / f"{preset}.yaml").read_text()
    return any(line.startswith("  - override /search:") for line in text.splitlines())


def run(tree: Path, preset: str, scratch: Path, extra: list[str]) -> tuple[float, int]:
    """Wall seconds of one predicted sweep of ``preset`` with the checkout ``tree``, and its exit code."""
    scratch.mkdir(parents=True, exist_ok=True)
    # a search predicts only (search.measure_top=0): the few it would then measure run in real time on
    # the simulated engine, minutes that depend on which candidates won, not on the prediction
    mode = ["search.measure_top=0"] if is_search(preset) else ["-m"]
    argv = [sys.executable, str(tree / "run.py"), *mode, f"experiment={preset}", "predict=true",
            f"tracking.uri=sqlite:///{scratch / 'mlflow.db'}", f"hydra.sweep.dir={scratch / 'multirun'}",
            f"hydra.run.dir={scratch / 'run'}", *extra]
    start = time.perf_counter()
    with open(scratch / "out.txt", "w") as out:
        code = subprocess.run(argv, cwd=scratch, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    return time.perf_counter() - start, code


def sureness(scratch: Path) -> tuple[float, list[str]]:
    """The widest tok/s interval among points that reached their targets, and the points that hit their
    budget (``<trial>:<point>``), over the predicted trials of the sweep in ``scratch`` (a search's
    candidates are not runs, and the few it measures are measured, on the simulated engine)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{scratch / 'mlflow.db'}")
    widest, hits = 0.0, []
    for exp in client.search_experiments():
        for r in client.search_runs([exp.experiment_id]):
            if r.data.tags.get("parasweep.kind") != "prediction":  # a search's measured trials are not
                continue
            m = r.data.metrics
            for key, value in m.items():
                if not key.endswith("/output_tok_s_ci95_rel") or key.count("/") != 1:
                    continue
                label = key.split("/")[0]
                if m.get(f"{label}/budget_hit") == 1.0:
                    hits.append(f"{r.data.tags.get('parasweep.trial_num', '?')}:{label}")
                elif math.isfinite(value):
                    widest = max(widest, value)
    return widest, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="a checkout to time against")
    parser.add_argument("--this", type=Path, default=REPO,
                        help="the checkout to time (default: this one; a copy lets you edit meanwhile)")
    parser.add_argument("--preset", action="append", help="only these presets (default: every one)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for this checkout's runs only (workload.predicted.budget_s=60)")
    args = parser.parse_args()
    chosen = args.preset or presets()
    with tempfile.TemporaryDirectory(prefix="predicted-points-") as tmp:
        print(f"{'preset':32} {'this s':>7} {'ref s':>7} {'ratio':>6} {'widest tok/s':>12}  budget hit")
        for preset in chosen:
            ref_s, ref_code = run(args.reference.resolve(), preset, Path(tmp) / preset / "ref", [])
            this_s, code = run(args.this.resolve(), preset, Path(tmp) / preset / "this", args.set)
            if code != 0 or ref_code != 0:
                print(f"{preset:32} exit {code} (reference {ref_code}): see {Path(tmp) / preset}/*/out.txt")
                continue
            widest, hits = sureness(Path(tmp) / preset / "this")
            print(f"{preset:32} {this_s:7.1f} {ref_s:7.1f} {this_s / ref_s:6.2f} {widest * 100:11.1f}%  "
                  f"{len(hits)}{': ' + ', '.join(hits) if hits else ''}", flush=True)


if __name__ == "__main__":
    main()
