"""What the diagnosis's search costs: the demo's trial (Kimi K2, PP8 on the PCIe box, c1/c8/c32,
32-token outputs, measured step costs) diagnosed in virtual time, its findings' changes searched
(their own knobs and every layout of the 8 GPUs) on one worker and on one per CPU, with a cold cache
and with the cache its sweep's earlier trials left; then the end of a four-trial sweep ("run this
instead"), cold and after the trials. Every time is printed beside a reference measured in the same
run: one prediction of the trial's own config at c32 (the unit the search is made of).

    .venv/bin/python benchmarks/advice_search.py
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

from analysis.diagnose import diagnose
from orchestrator.config.schema import ParasweepConf
from orchestrator.prediction.at_load import Load, default_workers, predict_change
from orchestrator.search.instead import SweepTrial, run_instead
from orchestrator.trial.advice import check_findings
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan
from orchestrator.trial.session import VirtualSession
from orchestrator.trial.summary import trial_facts
from vocab.findings import Finding
from vocab.hardware import load_hardware

DEPTHS = (0, 4, 8, 16)


def demo_trial(depth: int) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "kimi-k2", "models/kimi-k2"
    cfg.hardware = load_hardware("rtx-pro-6000-pcie-x8")
    cfg.pp.size, cfg.pp.async_depth = 8, depth
    cfg.workload.concurrency = [1, 8, 32]
    cfg.workload.input_len, cfg.workload.output_len = 256, 32
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 3, 0
    cfg.simulator.step_costs = "measured"
    return cfg


def findings_of(cfg: ParasweepConf, scratch: Path) -> tuple[list[Finding], list]:
    plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(0, "bench", scratch / "trial", ()))
    with VirtualSession(plan) as session:
        results = [session.run_point(p, plan.spec, scratch / "records.jsonl", lambda done, total: None)
                   for p in plan.points]
    facts = trial_facts(cfg, session.resolved, results, {}, session.gpu.source, "sim-predict")
    return diagnose(facts), plan.points


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
                            ).parse_args()
    os.chdir(Path(__file__).resolve().parent.parent)
    cpus = default_workers()
    with tempfile.TemporaryDirectory(prefix="parasweep-bench-") as tmp:
        scratch = Path(tmp)
        base = demo_trial(0)
        findings, points = findings_of(base, scratch)
        predict_change(base, {}, [Load.closed(32)])  # tables loaded: every row below starts warm
        unit = timed(lambda: predict_change(base, {}, [Load.closed(32)]))
        print(f"reference: one prediction of the trial's own config at c32: {unit:.2f} s "
              f"({len(findings)} findings; {cpus} CPU(s))")
        print("| what | workers | cache | seconds | in reference predictions |")
        print("|---|---|---|---|---|")

        def row(what: str, workers: int, cache: str, seconds: float) -> None:
            print(f"| {what} | {workers} | {cache} | {seconds:.1f} | {seconds / unit:.0f} |", flush=True)

        for workers in sorted({1, cpus}):
            fresh = scratch / f"cold-{workers}"
            row("one trial's findings searched", workers, "cold",
                timed(lambda w=workers, d=fresh: check_findings(findings, base, points, d, w)))
            row("the same again", workers, "warm",
                timed(lambda w=workers, d=fresh: check_findings(findings, base, points, d, w)))
        cache = scratch / "sweep"
        trials = []
        for depth in DEPTHS:
            cfg = demo_trial(depth)
            found, pts = findings_of(cfg, scratch / f"t{depth}")
            checked = check_findings(found, cfg, pts, cache, cpus)
            label = f"pp.async_depth={depth}"
            trials.append(SweepTrial(f"#{len(trials)} {label}", cfg, (label,),
                                     tuple(f.change for f in checked if f.change)))
        row("run this instead, 4 trials", cpus, "cold", timed(
            lambda: run_instead([dataclasses.replace(t) for t in trials], scratch / "instead-cold", cpus)))
        answer: dict = {}
        row("run this instead, 4 trials", cpus, "after the trials",
            timed(lambda: answer.update(run_instead(trials, cache, cpus))))
        print(f"answer: {answer.get('recommend', {}).get('change') or answer}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
