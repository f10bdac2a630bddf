"""Prediction speed with measured step costs against the roofline, in the same run.

Predicts whole trials in virtual time (the demo's Kimi K2 PP8 on the PCIe node at async depths 0 and 8,
Llama-3.1-70B TP4 on H200, Qwen3-30B-A3B EP8 on H100; closed-loop points 1, 8, 32) with each step-cost
source, alternating, and prints the wall time per trial and the ratio measured / roofline. Loading the
kernel tables happens once per process (cached) and is timed apart.

    .venv/bin/python benchmarks/step_cost_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from alternating import alternating_medians

from simulator.predict import load_config, predict_trial
from vocab.load import LoadPoint, RequestSpec

REPO = Path(__file__).resolve().parent.parent

TRIALS = {
    "kimi-k2 pp8 depth 0": ["--model-path", "models/kimi-k2", "--sim-hardware", "rtx-pro-6000-pcie-x8",
                            "--pp-size", "8"],
    "kimi-k2 pp8 depth 8": ["--model-path", "models/kimi-k2", "--sim-hardware", "rtx-pro-6000-pcie-x8",
                            "--pp-size", "8", "--pp-async-batch-depth", "8"],
    "llama-3.1-70b tp4": ["--model-path", "models/llama-3.1-70b", "--sim-hardware", "h200-nvlink-x8",
                          "--tp-size", "4"],
    "qwen3-30b-a3b ep8": ["--model-path", "models/qwen3-30b-a3b", "--sim-hardware", "h100-sxm-x8",
                          "--tp-size", "8", "--ep-size", "8"],
}
POINTS = [LoadPoint(num_requests=4 * c, concurrency=c, warmup_requests=2) for c in (1, 8, 32)]
SPEC = RequestSpec(api="generate", input_len=256, output_len=64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    t0 = time.perf_counter()
    for argv in TRIALS.values():
        load_config([*argv, "--sim-step-costs", "measured"])
    print(f"loading the kernel tables, building the measured sources once: {time.perf_counter() - t0:.2f} s")
    print(f"{'trial':<22} {'roofline s':>11} {'measured s':>11} {'measured / roofline':>20}")
    ratios = []
    for name, argv in TRIALS.items():
        medians = alternating_medians(
            {mode: lambda mode=mode, argv=argv: predict_trial([*argv, "--sim-step-costs", mode], POINTS, SPEC)
             for mode in ("roofline", "measured")}, args.repeats)
        roof, meas = medians["roofline"], medians["measured"]
        ratios.append(meas / roof)
        print(f"{name:<22} {roof:>11.3f} {meas:>11.3f} {meas / roof:>20.2f}")
    print(f"median ratio measured / roofline: {statistics.median(ratios):.2f} (goal: at most 2.0)")


if __name__ == "__main__":
    main()
