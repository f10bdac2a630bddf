"""Prediction speed of layouts without attention DP, this checkout against a reference checkout (the
commit before attention DP was modelled), and what an attention-DP layout costs beside its TP one.

    git worktree add /tmp/parasweep-ref <commit>
    .venv/bin/python benchmarks/attention_dp_speed.py --reference /tmp/parasweep-ref [--repeats 5]

Each trial (closed-loop points 1, 8, 32 and 128 of 1,000 + 1,000 tokens, predicted in virtual time) runs
in a fresh process of either checkout, the two taking turns, and the time of ``predict_trial`` alone
(imports and the kernel tables' first read excluded) is taken; the medians' ratio this / reference is
printed per trial. Results: docs/benchmarks.md, "Attention DP".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DSV3 = ["--model-path", "models/deepseek-v3", "--sim-hardware", "h200-nvlink-x8", "--tp-size", "8",
        "--mem-fraction-static", "0.85"]
TRIALS = {
    "kimi-k2 pp8 pcie (measured)": ["--model-path", "models/kimi-k2", "--sim-hardware",
                                    "rtx-pro-6000-pcie-x8", "--pp-size", "8"],
    "llama-3.1-70b tp4 h200 (roofline)": ["--model-path", "models/llama-3.1-70b", "--sim-hardware",
                                          "h200-nvlink-x8", "--tp-size", "4", "--sim-step-costs", "roofline"],
    "deepseek-v3 tp8 h200 (measured)": DSV3,
}
ATTENTION_DP = {"deepseek-v3 tp8 attention DP 8": [*DSV3, "--attn-dp-size", "8"],
                "deepseek-v3 tp8 attention DP 8 deepep": [*DSV3, "--attn-dp-size", "8", "--moe-a2a-backend",
                                                          "deepep"]}

# what a fresh process runs: one trial, its time printed as JSON (the tables read once before the clock)
WORKER = """
import json, sys, time
from simulator.predict import load_config, predict_trial
from vocab.load import LoadPoint, RequestSpec
argv = json.loads(sys.argv[1])
load_config(argv)
points = [LoadPoint(concurrency=c, num_requests=max(16, 3 * c), ramp_s=5.0) for c in (1, 8, 32, 128)]
start = time.perf_counter()
predict_trial(argv, points, RequestSpec(input_len=1000, output_len=1000))
print(json.dumps(time.perf_counter() - start))
"""


def timed(tree: Path, argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", WORKER, json.dumps(argv)], cwd=REPO, env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="a checkout of the reference commit")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'trial':40} {'this s':>8} {'ref s':>8} {'ratio':>6}")
    for name, argv in TRIALS.items():
        mine, ref = [], []
        for _ in range(args.repeats):  # taking turns, so the machine's noise hits both alike
            mine.append(timed(REPO, argv))
            ref.append(timed(args.reference, argv))
        a, b = statistics.median(mine), statistics.median(ref)
        print(f"{name:40} {a:8.2f} {b:8.2f} {a / b:6.2f}")
    base = statistics.median(timed(REPO, DSV3) for _ in range(args.repeats))
    for name, argv in ATTENTION_DP.items():
        t = statistics.median(timed(REPO, argv) for _ in range(args.repeats))
        print(f"{name:40} {t:8.2f} {'':>8} {t / base:6.2f}  (against deepseek-v3 tp8, this checkout)")


if __name__ == "__main__":
    main()
