"""How fast a search answers: candidates judged per minute over whole spaces of 256 to 1,024 candidates,
for Kimi K2 on the PCIe node, Llama-3.1-70B on an H100 node and Llama-3.1-8B on an H200 node, on
``--workers`` processes.

Each space is searched as ``python run.py search=...`` would: every candidate validated (rejected ones
cost almost nothing), bounded by the cost model's ceiling, and predicted to its highest load within the
SLOs unless its ceiling is below the best five predicted so far ("cannot win"). The reference, in the
same run: the same code without the pruning (every valid candidate predicted) on a seeded random
sample of ``--sample`` candidates, extrapolated to a minute. The ratio is the pruned search's rate over
the reference's. (That the pruning never changes the best five is a test's job: tests/test_search.py.)

    .venv/bin/python benchmarks/search_speed.py [--sample 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import random
import time

from orchestrator.config.schema import ParasweepConf
from orchestrator.search.evaluate import OK, OVER_SLO, PRUNED, REJECTED, check_settings
from orchestrator.search.judge import evaluate_all
from orchestrator.search.runner import search_base
from orchestrator.search.space import candidates, parse_space
from vocab.hardware import load_hardware


@dataclasses.dataclass(frozen=True)
class Space:
    model: str
    hardware: str
    input_len: int
    output_len: int
    space: list[str]
    slo: dict[str, float]
    max_concurrency: int


TAIL = {"ttft_p99_ms": 2000.0, "itl_p99_ms": 200.0}
SPACES = {
    "kimi-k2 on 8 PCIe GPUs": Space("kimi-k2", "rtx-pro-6000-pcie-x8", 256, 32, [
        "tp.size=choice(1,2,4,8)", "pp.size=choice(1,2,4,8)", "pp.async_depth=range(0,4)",
        "pp.micro_batch_size=null,1,2,4,8,16,32,64", "server.cuda_graph=true,false"], TAIL, 128),
    "llama-3.1-70b on 8 H100s": Space("llama-3.1-70b", "h100-sxm-x8", 1024, 256, [
        "tp.size=choice(1,2,4,8)", "pp.size=choice(1,2,4,8)", "dp.size=1,2", "pp.async_depth=range(0,4)",
        "server.cuda_graph=true,false", "pp.micro_batch_size=null,1,4,8"], TAIL, 128),
    # as a new user would try it: every split of 8 H200s, two micro-batch caps, two async depths, and
    # mean bounds (the decode-heavy workload's lengths, search=llama-70b-h100's cap of 256 per replica)
    "llama-3.1-8b on 8 H200s": Space("llama-3.1-8b", "h200-nvlink-x8", 1024, 256, [
        "tp.size=choice(1,2,4,8)", "pp.size=choice(1,2,4,8)", "dp.size=choice(1,2,4,8)",
        "pp.micro_batch_size=null,4", "pp.async_depth=0,8"], {"ttft_mean_ms": 1000.0, "tpot_mean_ms": 30.0},
        256),
}


def base(space: Space) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = space.model, f"models/{space.model}"
    cfg.hardware = load_hardware(space.hardware)
    cfg.workload = dataclasses.replace(cfg.workload, concurrency=[1], input_len=space.input_len,
                                       output_len=space.output_len)
    cfg.search.name, cfg.search.space, cfg.search.slo = "bench", space.space, space.slo
    cfg.search.max_concurrency = space.max_concurrency
    return cfg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", type=int, default=32, help="candidates of each space the reference judges")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(f"{'space':<28}{'size':>6}{'rejected':>10}{'cannot win':>12}{'predicted':>11}{'points/pred':>13}"
          f"{'seconds':>9}{'/min':>7}{'reference /min':>16}{'ratio':>7}")
    for name, space in SPACES.items():
        cfg = search_base(base(space))
        settings = check_settings(cfg)
        every = list(candidates(parse_space(space.space)))
        start = time.perf_counter()
        outcomes = evaluate_all(cfg, every, settings, args.workers, show_progress=False)
        seconds = time.perf_counter() - start
        sample = random.Random(args.seed).sample(every, min(args.sample, len(every)))
        start = time.perf_counter()
        evaluate_all(cfg, sample, settings, args.workers, keep=len(sample), show_progress=False)
        reference = 60.0 * len(sample) / (time.perf_counter() - start)
        counts = collections.Counter(o.status for o in outcomes)
        points = sum(o.predictions for o in outcomes) / max(1, counts[OK] + counts[OVER_SLO])
        rate = 60.0 * len(every) / seconds
        print(f"{name:<28}{len(every):>6}{counts[REJECTED]:>10}{counts[PRUNED]:>12}"
              f"{counts[OK] + counts[OVER_SLO]:>11}{points:>13.1f}{seconds:>9.1f}{rate:>7.0f}"
              f"{reference:>16.0f}{rate / reference:>7.2f}")


if __name__ == "__main__":
    main()
