"""``python run.py search=<name>``: every candidate of the space judged in prediction, in parallel, then
one table of all of them and the answer.

Candidates are spread over worker processes (``search.workers``, default one per CPU; each worker
keeps its own caches of model specs and kernel tables), with a progress bar. The table
(``search/candidates.parquet`` and ``.csv`` in the run's output directory) has one row per candidate:
the values of each searched key, the status (``ok``, ``rejected``, ``over the SLOs``) and why, the GPUs,
the highest load within the SLOs, the score and the predicted metrics there. The printed answer names
the winner as a ``run.py`` command line at its load, the runners-up, and the rejections counted by
reason. All of it is the simulator's prediction, and says so.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.diagnose import overrides_text
from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError, UserError
from orchestrator.search.evaluate import OK, OVER_SLO, REJECTED, Outcome, Settings, check_settings, evaluate
from orchestrator.search.space import candidates, parse_space, size

log = logging.getLogger("parasweep")

PREDICTED = "predicted by the simulated engine in virtual time, not measured"
SHOWN = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "tpot_p50_ms", "e2e_p99_ms")
RUNNERS_UP = 4


@dataclass
class SearchResult:
    outcomes: list[Outcome]
    table: pd.DataFrame
    folder: Path

    @property
    def ranked(self) -> list[Outcome]:
        ok = [o for o in self.outcomes if o.status == OK and o.score is not None]
        return sorted(ok, key=lambda o: -(o.score or 0.0))


def _evaluate_one(args: tuple[ParasweepConf, dict[str, Any], Settings]) -> Outcome:
    try:
        return evaluate(*args)
    except Exception as exc:  # a model failure costs this candidate, not the search
        log.exception("could not predict candidate %s", overrides_text(args[1]))
        reason = f"prediction failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return Outcome(dict(args[1]), REJECTED, reason=reason, category="prediction failed")


def evaluate_all(cfg: ParasweepConf, changes: list[dict[str, Any]], settings: Settings,
                 workers: int, show_progress: bool = True) -> list[Outcome]:
    """Every candidate's outcome, in the candidates' order."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    jobs = [(cfg, change, settings) for change in changes]
    outcomes: list[Outcome | None] = [None] * len(jobs)
    columns = (TextColumn("[parasweep] predicting candidates"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    if workers <= 1 or len(jobs) <= 1:
        with Progress(*columns, disable=not show_progress, transient=True) as progress:
            task = progress.add_task("candidates", total=len(jobs))
            for i, job in enumerate(jobs):
                outcomes[i] = _evaluate_one(job)
                progress.advance(task)
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            # every job submitted (and so every worker forked) before the progress display starts its
            # refresh thread: a fork never copies a lock that thread holds
            futures = {pool.submit(_evaluate_one, job): i for i, job in enumerate(jobs)}
            with Progress(*columns, disable=not show_progress, transient=True) as progress:
                task = progress.add_task("candidates", total=len(jobs))
                for future in concurrent.futures.as_completed(futures):
                    outcomes[futures[future]] = future.result()
                    progress.advance(task)
    return [o for o in outcomes if o is not None]


def outcome_table(outcomes: list[Outcome], keys: list[str]) -> pd.DataFrame:
    rows = []
    for o in outcomes:
        row: dict[str, Any] = {k: o.change.get(k) for k in keys}
        row.update(status=o.status, reason=o.reason, category=o.category, gpus=o.gpus or None,
                   concurrency=o.concurrency, score=o.score, miss=o.miss, predictions=o.predictions)
        row.update({m: o.metrics.get(m) for m in SHOWN})
        rows.append(row)
    frame = pd.DataFrame(rows)
    for k in keys:  # mixed types (null and numbers, booleans) as text, so Parquet takes the column
        frame[k] = frame[k].map(lambda v: "null" if v is None else str(v).lower() if isinstance(v, bool)
                                else str(v))
    return frame


def run_search(cfg: ParasweepConf, out_dir: Path, show_progress: bool = True) -> SearchResult:
    """The search of ``cfg.search`` on ``cfg`` as the base configuration; its table is written under
    ``out_dir/search/``. Raises a ``UserError`` (one line) for a bad search or when no candidate meets
    the SLOs, naming the one that came closest."""
    settings = check_settings(cfg)
    dims = parse_space(cfg.search.space)
    # the workload gives the requests (lengths, distributions, API); the search chooses the load
    cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, concurrency=[1], rate=[]))
    changes = list(candidates(dims))
    workers = cfg.search.workers or os.cpu_count() or 1
    print(f"[parasweep] search {cfg.search.name}: {size(dims)} candidates of {len(dims)} keys "
          f"({', '.join(d.key for d in dims)}), objective {settings.objective}, SLOs "
          f"{_slo_text(settings) or 'none'}, on {workers} process(es); {PREDICTED}", flush=True)
    outcomes = evaluate_all(cfg, changes, settings, workers, show_progress)
    folder = out_dir / "search"
    folder.mkdir(parents=True, exist_ok=True)
    table = outcome_table(outcomes, [d.key for d in dims])
    table.to_parquet(folder / "candidates.parquet", index=False)
    table.to_csv(folder / "candidates.csv", index=False)
    result = SearchResult(outcomes, table, folder)
    for line in answer_lines(cfg, result, settings):
        print(line, flush=True)
    if not result.ranked:
        raise UserError(_nothing_meets(outcomes, settings))
    return result


def _slo_text(settings: Settings) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in settings.slo.items())


def _nothing_meets(outcomes: list[Outcome], settings: Settings) -> str:
    over = [o for o in outcomes if o.status == OVER_SLO and o.miss is not None]
    if not over:
        reasons = collections.Counter(o.category for o in outcomes)
        first = reasons.most_common(1)[0][0] if reasons else "no candidate"
        return f"search.space: no candidate can run on this node (most common reason: {first})"
    closest = min(over, key=lambda o: o.miss or float("inf"))
    return (f"search.slo: no candidate meets {_slo_text(settings)}; closest: "
            f"{overrides_text(closest.change)} misses by {100 * ((closest.miss or 1.0) - 1):.0f}% "
            f"({closest.reason})")


def answer_lines(cfg: ParasweepConf, result: SearchResult, settings: Settings) -> list[str]:
    """The end of a search: counts, the winner as a command line, the runners-up, the rejections."""
    outcomes, ranked = result.outcomes, result.ranked
    counts = collections.Counter(o.status for o in outcomes)
    lines = [f"Search {cfg.search.name}: {len(outcomes)} candidates: {counts.get(OK, 0)} within the SLOs, "
             f"{counts.get(OVER_SLO, 0)} over them at any load, {counts.get(REJECTED, 0)} rejected "
             f"({sum(o.predictions for o in outcomes)} load points predicted); {PREDICTED}."]
    if ranked:
        best = ranked[0]
        lines.append(f"Best: {overrides_text(best.change)} at concurrency {best.concurrency}: "
                     f"{_scored(best, settings)}")
        lines.append(f"  python run.py {overrides_text(best.change)} "
                     f"workload.concurrency=[{best.concurrency}]")
        lines.append(f"  SGLang (0.5.23's flags): {sglang_command(cfg, best.change)}")
        for o in ranked[1:1 + RUNNERS_UP]:
            lines.append(f"Runner-up: {overrides_text(o.change)} at concurrency {o.concurrency}: "
                         f"{_scored(o, settings)}")
    reasons = collections.Counter(o.category for o in outcomes if o.status == REJECTED)
    for reason, n in reasons.most_common():
        example = next(o for o in outcomes if o.status == REJECTED and o.category == reason)
        lines.append(f"Rejected {n}: {reason} (e.g. {overrides_text(example.change)})")
    lines.append(f"Every candidate: {result.folder / 'candidates.csv'}")
    return lines


def sglang_command(cfg: ParasweepConf, change: dict[str, Any]) -> str:
    """The SGLang launch command of ``cfg`` with ``change``, as parasweep would start it (port 30000,
    secrets masked)."""
    from orchestrator.engines.base import sglang_flags
    from orchestrator.redact import redact_argv
    from orchestrator.trial.modelled import apply_change

    changed, env = apply_change(cfg, change)
    argv = ["python", "-m", "sglang.launch_server", *sglang_flags(changed, 30000)]
    prefix = [f"{k}={v}" for k, v in env.items()]  # engine environment variables the change sets
    return shlex.join([*prefix, *redact_argv(argv)])


def _scored(o: Outcome, settings: Settings) -> str:
    m = o.metrics
    parts = [f"{settings.objective} {o.score:,.1f}", f"{o.gpus} GPU(s)",
             f"{m.get('output_tok_s', float('nan')):,.0f} tok/s",
             f"TTFT p99 {m.get('ttft_p99_ms', float('nan')):,.0f} ms",
             f"ITL p99 {m.get('itl_p99_ms', float('nan')):,.1f} ms"]
    return ", ".join(parts)


def run_search_job(raw_cfg: Any) -> dict[str, Any]:
    """The Hydra task's body for ``search=<name>``: a single run, its output directory the job's."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from orchestrator.config.validate import typed_config

    cfg = typed_config(raw_cfg)
    hc = HydraConfig.get()
    if hc.mode != RunMode.RUN:
        raise ConfigError("search", cfg.search.name, "a single run (python run.py search=NAME)",
                          why="a search spans its own candidates: drop -m")
    run_search(cfg, Path(hc.runtime.output_dir).resolve())
    return {"status": "ok", "run_id": None, "timings": {}}
