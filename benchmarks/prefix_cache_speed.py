"""Prediction speed with the prefix cache on against off, in the same run.

Predicts the demo's trials in virtual time (Kimi K2 PP8 on the PCIe node at async depths 0, 4, 8 and
16; the demo workload: closed-loop points 1, 8, 32 with 3 × C requests of 256 tokens in, 32 out) with the
engine's radix cache on (the default) and off (``--disable-radix-cache``: no matching, no tree), the two
alternating, and prints the wall time per trial and the ratio. Random prompts share nothing, so the
cache costs its bookkeeping only: matching each prompt, inserting it, evicting. A shared-prefix
workload is timed too (8 groups × 16 prompts of a 2,000-token system prompt), where the cache changes
what is computed as well as what it costs to decide.

    .venv/bin/python benchmarks/prefix_cache_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from simulator.predict import predict_trial
from vocab.load import LoadPoint, RequestSpec, SharedPrefix, Source

KIMI = ["--model-path", "models/kimi-k2", "--sim-hardware", "rtx-pro-6000-pcie-x8", "--pp-size", "8"]
DEMO_POINTS = [LoadPoint(num_requests=3 * c, concurrency=c) for c in (1, 8, 32)]
DEMO = RequestSpec(api="generate", input_len=256, output_len=32, vocab_size=163840)
GROUPS = RequestSpec(api="generate", vocab_size=163840, source=Source("shared-prefix", shared_prefix=(
    SharedPrefix(groups=8, prompts_per_group=16, system_len=2000, question_len=128, output_len=32))))
CASES = {f"demo depth {d}": ([*KIMI, "--pp-async-batch-depth", str(d)], DEMO_POINTS, DEMO)
         for d in (0, 4, 8, 16)}
CASES["shared prefixes depth 8"] = ([*KIMI, "--pp-async-batch-depth", "8"],
                                    [LoadPoint(num_requests=128, concurrency=32)], GROUPS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    predict_trial(KIMI, DEMO_POINTS[:1], DEMO)  # load the model, tables and modules once, untimed
    print(f"{'trial':<26} {'cache off s':>11} {'cache on s':>11} {'on / off':>9}")
    ratios = []
    for name, (argv, points, spec) in CASES.items():
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.repeats):
            for mode in ("off", "on"):  # alternating: machine noise hits both alike
                flags = ["--disable-radix-cache"] if mode == "off" else []
                t = time.perf_counter()
                predict_trial([*argv, *flags], points, spec)
                times[mode].append(time.perf_counter() - t)
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        if name.startswith("demo"):
            ratios.append(on / off)
        print(f"{name:<26} {off:>11.3f} {on:>11.3f} {on / off:>9.2f}")
    ratio = statistics.median(ratios)
    print(f"median ratio on / off over the demo's trials: {ratio:.2f} (goal: at most 1.5)")


if __name__ == "__main__":
    main()
