"""How fast a search judges candidates: candidates fully predicted per minute (validated, then the
highest load within the SLOs found and scored), on spaces of 1,024 candidates for Kimi K2 on the PCIe
node and Llama-3.1-70B on an H100 node.

A seeded random sample of each space is judged with the search's own code twice in the same run: on
one process (the reference) and on ``--workers`` processes; the rates are extrapolated to a minute and
printed with their ratio, and with the number of load points each candidate needed. Rejected
candidates (layouts the node cannot hold) cost almost nothing and are counted apart; ``judged /min``
is the rate of candidates that were predicted (not rejected) on the worker processes.

    .venv/bin/python benchmarks/search_speed.py [--sample 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

from orchestrator.config.schema import ParasweepConf
from orchestrator.search.evaluate import REJECTED, check_settings
from orchestrator.search.runner import evaluate_all
from orchestrator.search.space import candidates, parse_space
from vocab.hardware import load_hardware

SPACES = {
    "kimi-k2 on 8 PCIe GPUs": ("kimi-k2", "rtx-pro-6000-pcie-x8", 256, 32, [
        "tp.size=choice(1,2,4,8)", "pp.size=choice(1,2,4,8)", "pp.async_depth=range(0,4)",
        "pp.micro_batch_size=null,1,2,4,8,16,32,64", "server.cuda_graph=true,false"]),
    "llama-3.1-70b on 8 H100s": ("llama-3.1-70b", "h100-sxm-x8", 1024, 256, [
        "tp.size=choice(1,2,4,8)", "pp.size=choice(1,2,4,8)", "dp.size=1,2", "pp.async_depth=range(0,4)",
        "server.cuda_graph=true,false", "pp.micro_batch_size=null,1,4,8"]),
}
SLO = {"ttft_p99_ms": 2000.0, "itl_p99_ms": 200.0}


def base(model: str, hardware: str, input_len: int, output_len: int, space: list[str]) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = model, f"models/{model}"
    cfg.hardware = load_hardware(hardware)
    cfg.workload = dataclasses.replace(cfg.workload, concurrency=[1], input_len=input_len,
                                       output_len=output_len)
    cfg.search.name, cfg.search.space, cfg.search.slo, cfg.search.max_concurrency = "bench", space, SLO, 128
    return cfg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", type=int, default=32, help="candidates judged per space and run")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(f"{'space':<28}{'size':>6}{'judged':>8}{'rejected':>10}{'points/cand':>13}"
          f"{'1 proc /min':>13}{f'{args.workers} procs /min':>15}{'ratio':>7}{'judged /min':>13}")
    for name, (model, hardware, n_in, n_out, space) in SPACES.items():
        cfg = base(model, hardware, n_in, n_out, space)
        settings = check_settings(cfg)
        every = list(candidates(parse_space(space)))
        sample = random.Random(args.seed).sample(every, min(args.sample, len(every)))
        rates = []
        for workers in (1, args.workers):
            start = time.perf_counter()
            outcomes = evaluate_all(cfg, sample, settings, workers, show_progress=False)
            rates.append(60.0 * len(sample) / (time.perf_counter() - start))
        judged = [o for o in outcomes if o.status != REJECTED]
        points = sum(o.predictions for o in judged) / max(1, len(judged))
        print(f"{name:<28}{len(every):>6}{len(judged):>8}{len(sample) - len(judged):>10}{points:>13.1f}"
              f"{rates[0]:>13.0f}{rates[1]:>15.0f}{rates[1] / rates[0]:>7.2f}"
              f"{rates[1] * len(judged) / len(sample):>13.0f}")


if __name__ == "__main__":
    main()
