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
import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.diagnose import overrides_text
from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import UserError
from orchestrator.search.evaluate import (
    OK,
    OVER_SLO,
    PRUNED,
    REJECTED,
    Outcome,
    Screened,
    Settings,
    check_settings,
    evaluate,
    screen,
)
from orchestrator.search.space import candidates, parse_space, size

log = logging.getLogger("parasweep")

PREDICTED = "predicted by the simulated engine in virtual time, not measured"
SHOWN = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "tpot_p50_ms", "e2e_p99_ms")
RUNNERS_UP = 4
SCREEN_CHUNK = 16  # candidates a worker validates and bounds per job


@dataclass
class SearchResult:
    outcomes: list[Outcome]
    table: pd.DataFrame
    folder: Path
    answer: list[str] = dataclasses.field(default_factory=list)  # the lines printed at its end

    @property
    def ranked(self) -> list[Outcome]:
        ok = [o for o in self.outcomes if o.status == OK and o.score is not None and not o.same_as]
        return sorted(ok, key=lambda o: -(o.score or 0.0))


def _screen_some(args: tuple[ParasweepConf, list[dict[str, Any]], Settings]) -> list[Screened | Outcome]:
    base, changes, settings = args
    return [_guarded(change, screen, base, change, settings) for change in changes]


def _evaluate_one(args: tuple[ParasweepConf, Screened, Settings]) -> Outcome:
    base, screened, settings = args
    return _guarded(screened.change, evaluate, base, screened, settings)


def _guarded(change: dict[str, Any], fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # a model failure costs this candidate, not the search
        log.exception("could not predict candidate %s", overrides_text(change))
        reason = f"prediction failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return Outcome(dict(change), REJECTED, reason=reason, category="prediction failed")


class _Ranking:
    """The best scores so far, to prune by: a candidate whose ceiling is below the ``keep``-th best
    cannot enter the top ``keep``."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.scores: list[float] = []

    def add(self, outcome: Outcome) -> None:
        if outcome.status == OK and outcome.score is not None:
            self.scores = sorted([*self.scores, outcome.score], reverse=True)[:self.keep]

    @property
    def bar(self) -> float:
        return self.scores[-1] if len(self.scores) == self.keep else -math.inf


def _pruned(s: Screened, bar: float, settings: Settings, keep: int) -> Outcome:
    if s.ceiling == 0.0:
        return Outcome(s.change, PRUNED, gpus=s.gpus, ceiling=0.0,
                       reason="over the ITL bound at any load (the cost model's decode trip of one request "
                              "alone exceeds it)")
    return Outcome(s.change, PRUNED, gpus=s.gpus, ceiling=s.ceiling,
                   reason=(f"{settings.objective} at most {s.ceiling:,.1f} at any load (the cost model's "
                           f"ceiling), below the {keep} best predicted ({bar:,.1f} and up)"))


def _twin(outcome: Outcome, s: Screened) -> Outcome:
    """``outcome`` for ``s``, a candidate the simulated engine cannot tell from the one judged."""
    return dataclasses.replace(outcome, change=s.change, predictions=0,
                               same_as=overrides_text(outcome.change))


def evaluate_all(cfg: ParasweepConf, changes: list[dict[str, Any]], settings: Settings,
                 workers: int, keep: int = 1 + RUNNERS_UP, show_progress: bool = True) -> list[Outcome]:
    """Every candidate's outcome, in the candidates' order: screened first (validated, bounded,
    grouped with the candidates its engine cannot be told from), then predicted in order of falling
    ceiling, skipping those whose ceiling is below the ``keep``-th best predicted so far."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    outcomes: list[Outcome | None] = [None] * len(changes)
    index = {id(change): i for i, change in enumerate(changes)}
    columns = (TextColumn("[parasweep] predicting candidates"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    chunks = [changes[i:i + SCREEN_CHUNK] for i in range(0, len(changes), SCREEN_CHUNK)]
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        # every job submitted (and so every worker forked) before the progress display starts its
        # refresh thread: a fork never copies a lock that thread holds
        screening = [pool.submit(_screen_some, (cfg, chunk, settings)) for chunk in chunks] if pool else []
        with Progress(*columns, disable=not show_progress, transient=True) as progress:
            task = progress.add_task("candidates", total=len(changes))
            screened: list[Screened] = []
            for chunk, result in zip(chunks, (f.result() for f in screening) if pool
                                     else (_screen_some((cfg, c, settings)) for c in chunks), strict=True):
                for change, item in zip(chunk, result, strict=True):
                    if isinstance(item, Screened):
                        screened.append(dataclasses.replace(item, change=change))
                    else:
                        outcomes[index[id(change)]] = item
                        progress.advance(task)
            twins: dict[str, list[Screened]] = collections.defaultdict(list)
            for s in screened:
                twins[s.engine_key].append(s)
            firsts = sorted((group[0] for group in twins.values()), key=lambda s: -s.ceiling)
            queue = collections.deque(firsts)
            ranking = _Ranking(keep)

            def settle(s: Screened, outcome: Outcome) -> None:
                ranking.add(outcome)
                for i, twin in enumerate(twins[s.engine_key]):
                    outcomes[index[id(twin.change)]] = outcome if i == 0 else _twin(outcome, twin)
                    progress.advance(task)

            running: dict[concurrent.futures.Future[Outcome], Screened] = {}
            while queue or running:
                while queue and len(running) < 2 * max(1, workers):
                    s = queue.popleft()
                    if s.ceiling < ranking.bar:  # and every one after it: the queue falls in ceiling
                        for rest in (s, *queue):
                            settle(rest, _pruned(rest, ranking.bar, settings, keep))
                        queue.clear()
                        break
                    if pool is None:
                        settle(s, _evaluate_one((cfg, s, settings)))
                    else:
                        running[pool.submit(_evaluate_one, (cfg, s, settings))] = s
                if running:
                    done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                    for future in done:
                        settle(running.pop(future), future.result())
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return [o for o in outcomes if o is not None]


def outcome_table(outcomes: list[Outcome], keys: list[str]) -> pd.DataFrame:
    rows = []
    for o in outcomes:
        row: dict[str, Any] = {k: o.change.get(k) for k in keys}
        row.update(status=o.status, reason=o.reason, category=o.category, gpus=o.gpus or None,
                   concurrency=o.concurrency, score=o.score, limit=o.limit, miss=o.miss,
                   ceiling=o.ceiling, same_as=o.same_as, predictions=o.predictions)
        row.update({m: o.metrics.get(m) for m in SHOWN})
        rows.append(row)
    frame = pd.DataFrame(rows)
    for k in keys:  # mixed types (null and numbers, booleans) as text, so Parquet takes the column
        frame[k] = frame[k].map(lambda v: "null" if v is None else str(v).lower() if isinstance(v, bool)
                                else str(v))
    return frame


def search_base(cfg: ParasweepConf) -> ParasweepConf:
    """The config every candidate changes: the workload gives the requests (lengths, distributions,
    API); the search chooses the load."""
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, concurrency=[1], rate=[]))


def run_search(cfg: ParasweepConf, out_dir: Path, show_progress: bool = True,
               keep: int = 1 + RUNNERS_UP) -> SearchResult:
    """The search of ``cfg.search`` on ``cfg`` as the base configuration; its table is written under
    ``out_dir/search/``. Raises a ``UserError`` (one line) for a bad search or when no candidate meets
    the SLOs, naming the one that came closest."""
    settings = check_settings(cfg)
    dims = parse_space(cfg.search.space)
    cfg = search_base(cfg)
    changes = list(candidates(dims))
    workers = cfg.search.workers or os.cpu_count() or 1
    print(f"[parasweep] search {cfg.search.name}: {size(dims)} candidates of {len(dims)} keys "
          f"({', '.join(d.key for d in dims)}), objective {settings.objective}, SLOs "
          f"{_slo_text(settings) or 'none'}, on {workers} process(es); {PREDICTED}", flush=True)
    outcomes = evaluate_all(cfg, changes, settings, workers, keep=max(keep, 1 + RUNNERS_UP),
                            show_progress=show_progress)
    folder = out_dir / "search"
    folder.mkdir(parents=True, exist_ok=True)
    table = outcome_table(outcomes, [d.key for d in dims])
    table.to_parquet(folder / "candidates.parquet", index=False)
    table.to_csv(folder / "candidates.csv", index=False)
    result = SearchResult(outcomes, table, folder)
    result.answer = answer_lines(cfg, result, settings)
    for line in result.answer:
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
    twins = sum(1 for o in outcomes if o.same_as)
    lines = [f"Search {cfg.search.name}: {len(outcomes)} candidates: {counts.get(OK, 0)} within the SLOs, "
             f"{counts.get(OVER_SLO, 0)} over them at any load, {counts.get(PRUNED, 0)} could not win "
             f"(the cost model's ceiling below the best predicted), {counts.get(REJECTED, 0)} rejected; "
             f"{twins} the same engine as another; {sum(o.predictions for o in outcomes)} load points "
             f"predicted; {PREDICTED}."]
    if ranked:
        best = ranked[0]
        lines.append(f"Best: {overrides_text(best.change)} at concurrency {best.concurrency}: "
                     f"{_scored(best, settings)}; a higher load: {best.limit}")
        lines.append(f"  python run.py {overrides_text(best.change)} "
                     f"workload.concurrency=[{best.concurrency}]")
        lines.append(f"  SGLang (0.5.23's flags): {sglang_command(cfg, best.change)}")
        for o in ranked[1:1 + RUNNERS_UP]:
            lines.append(f"Runner-up: {overrides_text(o.change)} at concurrency {o.concurrency}: "
                         f"{_scored(o, settings)}; {_lost(o, best)}")
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


def _lost(o: Outcome, best: Outcome) -> str:
    """Why a runner-up lost: how far below the best it scores, and what held its load down."""
    behind = 100.0 * (1.0 - (o.score or 0.0) / (best.score or 1.0))
    return f"{behind:.0f}% below the best; held at this load by {o.limit}"


def _scored(o: Outcome, settings: Settings) -> str:
    m = o.metrics
    parts = [f"{settings.objective} {o.score:,.1f}", f"{o.gpus} GPU(s)",
             f"{m.get('output_tok_s', float('nan')):,.0f} tok/s",
             f"TTFT p99 {m.get('ttft_p99_ms', float('nan')):,.0f} ms",
             f"ITL p99 {m.get('itl_p99_ms', float('nan')):,.1f} ms"]
    return ", ".join(parts)
