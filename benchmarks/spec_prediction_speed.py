"""Prediction speed with speculative decoding on against off, in the same run.

Predicts whole trials in virtual time (Llama-3.1-8B on one H100 with EAGLE-3 as SGLang picks it and as a
one-step chain, DeepSeek-V3 TP8 on H200 with its MTP layer, Kimi K2 TP8 on the PCIe node with EAGLE-3;
closed-loop points 1, 8, 32) with and without speculation, alternating, and prints the wall time per
trial and the ratio on / off. The goal: at most 1.5 (a draft-verify-extend iteration prices three
forwards where a plain step prices one, but emits several tokens a request).

    .venv/bin/python benchmarks/spec_prediction_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics

from alternating import alternating_medians

from simulator.predict import load_config, predict_trial
from vocab.load import LoadPoint, RequestSpec

LLAMA = ["--model-path", "models/llama-3.1-8b", "--sim-hardware", "h100-sxm-x8"]
EAGLE3_LLAMA = ["--speculative-algorithm", "EAGLE3",
                "--speculative-draft-model-path", "models/eagle3-llama-3.1-8b"]
TRIALS = {
    "llama-3.1-8b eagle3": (LLAMA, EAGLE3_LLAMA),
    "llama-3.1-8b chain1": (LLAMA, [*EAGLE3_LLAMA, "--speculative-num-steps", "1", "--speculative-eagle-topk",
                                    "1", "--speculative-num-draft-tokens", "2"]),
    "deepseek-v3 tp8 mtp": (["--model-path", "models/deepseek-v3", "--sim-hardware", "h200-nvlink-x8",
                             "--tp-size", "8"], ["--speculative-algorithm", "NEXTN"]),
    "kimi-k2 tp8 eagle3": (["--model-path", "models/kimi-k2", "--sim-hardware", "rtx-pro-6000-pcie-x8",
                            "--tp-size", "8"],
                           ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                            "models/eagle3-kimi-k2"]),
}
POINTS = [LoadPoint(num_requests=4 * c, concurrency=c, warmup_requests=2) for c in (1, 8, 32)]
SPEC = RequestSpec(api="generate", input_len=256, output_len=64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    for base, spec in TRIALS.values():  # kernel tables loaded once per process, not timed
        load_config([*base, *spec])
    print(f"{'trial':<22} {'off s':>8} {'on s':>8} {'on / off':>9}")
    ratios = []
    for name, (base, spec) in TRIALS.items():
        # off: the same running-request cap speculation sets, so both admit the same batches
        argv = {"off": [*base, "--max-running-requests", "48"], "on": [*base, *spec]}
        runs = {mode: lambda mode=mode, argv=argv: predict_trial(argv[mode], POINTS, SPEC) for mode in argv}
        medians = alternating_medians(runs, args.repeats)
        off, on = medians["off"], medians["on"]
        ratios.append(on / off)
        print(f"{name:<22} {off:>8.3f} {on:>8.3f} {on / off:>9.2f}")
    print(f"median ratio on / off: {statistics.median(ratios):.2f} (goal: at most 1.5)")


if __name__ == "__main__":
    main()
