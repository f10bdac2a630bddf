"""A space too large to enumerate (more candidates than ``search.max_candidates``): Optuna's TPE sampler
proposes candidates, in batches of a few per worker process, and each batch is judged exactly as an
enumerated space's candidates are (validated, bounded, predicted best first, pruned by the same
ranking). Each candidate's score goes back to the sampler (nothing, for one that cannot run or meets
no SLO), which proposes the next batch where scores were high. It stops after ``max_candidates``
distinct candidates, or when the sampler keeps proposing only candidates already judged.

The answer is the best of the candidates judged, not a proof that nothing better exists in the rest
of the space; the search's answer says how many of how many were judged, and with which seed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.search.evaluate import OK, Outcome
from orchestrator.search.judge import Judge
from orchestrator.search.space import Dimension

PER_WORKER = 8  # candidates a batch proposes per worker process
STALE_BATCHES = 20  # batches in a row that propose nothing new end the sampling


def sampled_outcomes(judge: Judge, dims: Sequence[Dimension], budget: int, seed: int,
                     advance: Callable[[], None]) -> list[Outcome]:
    """The outcomes of at most ``budget`` distinct candidates of ``dims``, as the sampler chose them."""
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    # each dimension's values by index: a value may be null, a list or anything else Optuna does not take
    space = {d.key: optuna.distributions.CategoricalDistribution(tuple(range(len(d.values)))) for d in dims}
    judged: dict[tuple[int, ...], Outcome] = {}
    batch = PER_WORKER * max(1, judge.workers)
    stale = 0
    while len(judged) < budget and stale < STALE_BATCHES:
        trials = [study.ask(space) for _ in range(batch)]
        picks = [tuple(int(t.params[d.key]) for d in dims) for t in trials]
        new = list(dict.fromkeys(p for p in picks if p not in judged))[:budget - len(judged)]
        stale = 0 if new else stale + 1
        changes = [_change(dims, p) for p in new]
        for pick, outcome in zip(new, judge.judge(changes, advance), strict=True):
            judged[pick] = outcome
        for trial, pick in zip(trials, picks, strict=True):
            outcome = judged.get(pick)
            if outcome is None:  # over the budget: never judged, so it says nothing to the sampler
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, _value(outcome))
    return list(judged.values())


def _change(dims: Sequence[Dimension], pick: tuple[int, ...]) -> dict[str, Any]:
    return {d.key: d.values[i] for d, i in zip(dims, pick, strict=True)}


def _value(outcome: Outcome) -> float:
    """What the sampler learns: the score; nothing for a candidate that cannot run, meets no SLO or
    cannot win (its ceiling is below the best five: it scores less than they do, whatever it is)."""
    return float(outcome.score or 0.0) if outcome.status == OK else 0.0
