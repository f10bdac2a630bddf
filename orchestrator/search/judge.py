"""Judging candidates: on a pool of worker processes (``search.workers``, default one per CPU; each
keeps its own caches of model specs and kernel tables), each candidate screened (validated and bounded
by the cost model's ceiling), then predicted best ceiling first, skipping those that cannot reach the
best ``keep`` predicted so far (docs/search.md, "How a candidate is judged").
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import math
import multiprocessing
from collections.abc import Callable
from typing import Any

from analysis.diagnose import overrides_text
from orchestrator.config.schema import ParasweepConf
from orchestrator.search.evaluate import (
    OK,
    PRUNED,
    REJECTED,
    Outcome,
    Screened,
    Settings,
    confirmed,
    evaluate,
    replicated,
    screen,
)

log = logging.getLogger("parasweep")

RUNNERS_UP = 4  # shown after the best: the best 1 + RUNNERS_UP are always exact
SCREEN_CHUNK = 16  # candidates a worker validates and bounds per job


def _screen_some(args: tuple[ParasweepConf, list[dict[str, Any]], Settings]) -> list[Screened | Outcome]:
    base, changes, settings = args
    return [_guarded(change, screen, base, change, settings) for change in changes]


# In a worker process: the bar to beat, shared with the judge (set by the pool's initializer)
_shared_bar: Any = None


def _share_bar(bar: Any) -> None:
    global _shared_bar
    _shared_bar = bar


def _evaluate_one(args: tuple[ParasweepConf, Screened, Settings]) -> Outcome:
    base, screened, settings = args
    return _guarded(screened.change, evaluate, base, screened, settings, lambda: _shared_bar.value)


def _confirm_one(args: tuple[ParasweepConf, Screened, Outcome, Settings]) -> Outcome:
    base, screened, derived, settings = args
    return _guarded(screened.change, confirmed, base, screened, derived, settings, lambda: _shared_bar.value)


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


def _replica_families(engines: list[Screened]) -> tuple[list[Screened], dict[str, list[Screened]]]:
    """The engines to predict, and for each (by engine key) the engines derived from it: of engines that
    differ only in their count of interchangeable DP replicas (``Screened.replica_key``), the one with
    fewest replicas is predicted and every one with a multiple of that count is derived from it
    (``evaluate.replicated``); a count that is no multiple of a predicted one is predicted too."""
    families: dict[str, list[Screened]] = collections.defaultdict(list)
    for s in engines:
        families[s.replica_key].append(s)
    judged: list[Screened] = []
    derived: dict[str, list[Screened]] = {}
    for family in families.values():
        heads: list[Screened] = []
        for s in sorted(family, key=lambda s: s.replicas):
            head = next((h for h in heads if s.replicas % h.replicas == 0), None)
            if head is None:
                heads.append(s)
                derived[s.engine_key] = []
            else:
                derived[head.engine_key].append(s)
        judged += heads
    return judged, derived


class Judge:
    """Judges batches of candidates on one pool of worker processes, with one ranking to prune by
    across batches. Use as a context manager: its workers are forked on entry, before any progress
    display starts its refresh thread (a fork never copies a lock that thread holds)."""

    def __init__(self, cfg: ParasweepConf, settings: Settings, workers: int, keep: int) -> None:
        self.cfg, self.settings, self.workers, self.keep = cfg, settings, workers, keep
        self.ranking = _Ranking(keep)
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.shared_bar: Any = None

    def __enter__(self) -> Judge:
        if self.workers > 1:
            # the ranking's bar, in shared memory: a candidate being judged sees it rise as others finish
            self.shared_bar = multiprocessing.RawValue("d", -math.inf)
            self.pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers, initializer=_share_bar, initargs=(self.shared_bar,))
            self.pool.submit(int).result()  # forks every worker now (the fork start method forks all)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def judge(self, changes: list[dict[str, Any]], advance: Callable[[], None]) -> list[Outcome]:
        """Every candidate's outcome, in the candidates' order: screened first (validated, bounded,
        grouped with the candidates its engine cannot be told from, and with those that only run more
        of its interchangeable DP replicas), then predicted in order of falling ceiling, skipping those
        whose ceiling is below the ``keep``-th best predicted so far.
        ``advance`` is called once per candidate settled."""
        cfg, settings, pool = self.cfg, self.settings, self.pool
        outcomes: list[Outcome | None] = [None] * len(changes)
        index = {id(change): i for i, change in enumerate(changes)}
        chunks = [changes[i:i + SCREEN_CHUNK] for i in range(0, len(changes), SCREEN_CHUNK)]
        results = ((f.result() for f in [pool.submit(_screen_some, (cfg, c, settings)) for c in chunks])
                   if pool else (_screen_some((cfg, c, settings)) for c in chunks))
        screened: list[Screened] = []
        for chunk, result in zip(chunks, results, strict=True):
            for change, item in zip(chunk, result, strict=True):
                if isinstance(item, Screened):
                    screened.append(dataclasses.replace(item, change=change))
                else:
                    outcomes[index[id(change)]] = item
                    advance()
        twins: dict[str, list[Screened]] = collections.defaultdict(list)
        for s in screened:
            twins[s.engine_key].append(s)
        judged, derived = _replica_families([group[0] for group in twins.values()])
        queue = collections.deque(sorted(judged, key=lambda s: -s.ceiling))
        ranking = self.ranking

        # derived outcomes (more replicas judged from fewer) waiting to be held to the full simulation
        checks: collections.deque[tuple[Screened, Outcome]] = collections.deque()

        def settle_one(member: Screened, result: Outcome) -> None:
            ranking.add(result)
            if pool is not None:
                self.shared_bar.value = ranking.bar
            for i, twin in enumerate(twins[member.engine_key]):
                outcomes[index[id(twin.change)]] = result if i == 0 else _twin(result, twin)
                advance()

        def settle(s: Screened, outcome: Outcome) -> None:
            settle_one(s, outcome)
            for d in derived[s.engine_key]:
                more = replicated(outcome, d.change, d.replicas // s.replicas, settings)
                if more.status == OK and (more.score or 0.0) >= ranking.bar:
                    checks.append((d, more))
                else:  # bounded out, over the SLOs at one request (as the fewer replicas are), or
                    # scored below the best few: kept as derived, unconfirmed (no prediction of its own)
                    settle_one(d, more)

        # each future: the candidate, and whether it was judged in full (else a derived one confirmed)
        running: dict[concurrent.futures.Future[Outcome], tuple[Screened, bool]] = {}
        while queue or running or checks:
            while checks and len(running) < 2 * max(1, self.workers):
                d, more = checks.popleft()
                if pool is None:
                    settle_one(d, _guarded(d.change, confirmed, cfg, d, more, settings, lambda: ranking.bar))
                else:
                    running[pool.submit(_confirm_one, (cfg, d, more, settings))] = (d, False)
            while queue and len(running) < 2 * max(1, self.workers):
                s = queue.popleft()
                if s.ceiling < ranking.bar:  # and every one after it: the queue falls in ceiling
                    for rest in (s, *queue):
                        settle(rest, _pruned(rest, ranking.bar, settings, self.keep))
                    queue.clear()
                    break
                if pool is None:
                    settle(s, _guarded(s.change, evaluate, cfg, s, settings, lambda: ranking.bar))
                else:
                    running[pool.submit(_evaluate_one, (cfg, s, settings))] = (s, True)
            if running:
                done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    s, full = running.pop(future)
                    (settle if full else settle_one)(s, future.result())
        return [o for o in outcomes if o is not None]


def progress_bar(show: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[parasweep] predicting candidates"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), disable=not show, transient=True)


def evaluate_all(cfg: ParasweepConf, changes: list[dict[str, Any]], settings: Settings,
                 workers: int, keep: int = 1 + RUNNERS_UP, show_progress: bool = True) -> list[Outcome]:
    """Every candidate's outcome, in the candidates' order (``Judge.judge``), with a progress bar."""
    with Judge(cfg, settings, workers, keep) as judge, progress_bar(show_progress) as progress:
        task = progress.add_task("candidates", total=len(changes))
        return judge.judge(changes, lambda: progress.advance(task))
