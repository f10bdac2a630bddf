"""The best few candidates of a search, measured: each one a trial run through ``run.py`` as a user would
start it (the real engine on a GPU node, the simulated one elsewhere), at its predicted best load and
one bisection step either side, as a child of the search's run. Then the winner by measured numbers,
predicted against measured for each, and whether the model's ranking held.

A measured load holds when every SLO holds there, judged on the same steady state as the prediction
(each point's warm-up is its opening wave of C requests, then two measured requests per stream). The measured
score is the objective at the highest of the three loads that holds; a candidate none of whose loads
holds scores nothing.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.diagnose import overrides_text
from orchestrator.config.slo import worst_ratio
from orchestrator.prediction.at_load import REQUESTS_PER_STREAM, closed_point, ramped_point
from orchestrator.search.evaluate import RESOLUTION, Outcome, Settings
from vocab.load import LoadPoint
from vocab.records import PointResult

RUN_PY = Path(__file__).resolve().parents[2] / "run.py"
STOP_GRACE_S = 60.0  # a trial asked to stop ends its engine and closes its run within this
# keys the measured trial sets itself: a base override of any of them is dropped
OWN_KEYS = ("search", "workload.concurrency", "workload.rate", "workload.warmup_per_concurrency",
            "workload.requests_per_concurrency", "workload.requests_per_point", "workload.ramp",
            "workload.ci_target", "tracking.parent_run_id",
            "tracking.label", "hydra.run.dir", "predict", "dry_run")


@dataclass
class Measured:
    outcome: Outcome  # the candidate as predicted
    rank: int  # its place in the prediction's ranking (1 = best)
    loads: list[int]
    run_id: str | None = None
    status: str = "not run"  # the trial's status
    engine: str = ""  # what it ran on: sglang, or sim (the simulated engine)
    measured: dict[int, dict[str, float]] = field(default_factory=dict)  # load -> measured metrics
    predicted: dict[int, dict[str, float]] = field(default_factory=dict)  # load -> the trial's pred/
    concurrency: int | None = None  # the highest measured load within the SLOs
    score: float | None = None  # the objective measured there


def loads_around(c: int, limit: int) -> list[int]:
    """The predicted best load and one bisection step (an eighth of it, at least 1) either side."""
    step = max(1, c // RESOLUTION)
    return sorted({max(1, c - step), c, min(limit, c + step)})


def base_overrides(task: Sequence[str], change: dict[str, Any]) -> list[str]:
    """The search's own command-line overrides without those the measured trial sets itself (the
    search's keys, the load, the run's place) or the candidate changes."""
    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    own = (*OWN_KEYS, *change)
    return [o for o in task if not any(key(o) == k or key(o).startswith(k + ".") for k in own)]


def trial_points(loads: list[int], predict: Callable[[LoadPoint], PointResult]) -> dict[int, LoadPoint]:
    """The load points the measured trial runs (``trial_argv``'s workload keys), by concurrency: the
    search's own loads, ramped by ``predict`` as the search's predictions are, so predicted and
    measured send the same requests the same way (the prediction runs on until its numbers are known,
    ``orchestrator.points.virtual``; the measurement stops at its count)."""
    return {c: ramped_point(c, predict) for c in loads}


def judged_points(loads: list[int]) -> dict[int, LoadPoint]:
    """The same points as the window reads them (their ramp does not change which requests count)."""
    return {c: closed_point(c) for c in loads}


def trial_argv(task: Sequence[str], change: dict[str, Any], loads: list[int], parent_run_id: str,
               label: str, run_dir: Path) -> list[str]:
    """``run.py`` with the search's overrides, the candidate's change (``++``: added where the base
    config lacks the key, such as an engine flag under ``server.extra_args``; a group's option,
    ``pd=1p3d``, selected as it is) and the loads."""
    changed = [overrides_text({k: v}) if "." not in k else f"++{overrides_text({k: v}).lstrip('+')}"
               for k, v in change.items()]
    return [sys.executable, str(RUN_PY), *base_overrides(task, change), *changed,
            f"workload.concurrency=[{','.join(str(c) for c in loads)}]", "workload.rate=[]",
            "workload.warmup_per_concurrency=0", f"workload.requests_per_concurrency={REQUESTS_PER_STREAM}",
            "workload.requests_per_point=null", "workload.ramp=auto", "workload.ci_target=null",
            "search.name=null",
            f"tracking.parent_run_id={parent_run_id}", f"tracking.label='{label}'",
            f"hydra.run.dir={run_dir}"]


def live_refusal(cfg: Any, change: dict[str, Any]) -> str:
    """Why the candidate cannot run as a trial on this machine ("" when it can): a layout wider than
    the sweep's own local Ray, a disaggregated deployment across nodes, ... (the search judged it in
    virtual time, where these are allowed)."""
    import dataclasses

    from orchestrator.config.validate import validate
    from orchestrator.errors import UserError
    from orchestrator.prediction.modelled import apply_change

    try:
        changed, _ = apply_change(cfg, change)
        # as the measured trial runs: live, on the engine the search's config names, at its loads
        validate(dataclasses.replace(changed, predict=False, engine=cfg.engine))
    except (UserError, ValueError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ""


def run_trial_process(argv: list[str]) -> int:
    """Run one ``run.py`` to its end in its own process group, its output on ours; on Ctrl-C (or any
    exit of ours) it is asked to stop as a user's Ctrl-C would (SIGTERM), then killed with its group."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)  # no shell
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left


def judge(m: Measured, settings: Settings, gpus: int, goodput: dict[int, float]) -> None:
    """The highest measured load within the SLOs, and the objective there."""
    held = [c for c in m.loads if c in m.measured and _holds(m.measured[c], settings)]
    if not held:
        return
    m.concurrency = max(held)
    metrics = m.measured[m.concurrency]
    value = (metrics.get("output_tok_s", math.nan) if settings.objective == "output_tok_s_per_gpu"
             else goodput.get(m.concurrency, math.nan))
    m.score = value / max(1, gpus)


def _holds(metrics: dict[str, float], settings: Settings) -> bool:
    worst = worst_ratio(metrics, settings.slo)
    return worst is None or worst[1] <= 1.0


def rank_agreement(measured: list[Measured]) -> float | None:
    """Kendall's tau between the predicted and the measured order of the candidates measured (1: the
    model ranked them as they measured; -1: reversed). None for fewer than two scored."""
    from scipy.stats import kendalltau

    scored = [m for m in measured if m.score is not None]
    if len(scored) < 2:
        return None
    tau = kendalltau([-(m.outcome.score or 0.0) for m in scored], [-(m.score or 0.0) for m in scored])
    return float(tau.statistic) if math.isfinite(tau.statistic) else None


def measured_rows(measured: list[Measured], settings: Settings) -> list[dict[str, Any]]:
    """One row per candidate and load: predicted (by the search, and by the trial's own ``pred/``)
    against measured."""
    rows = []
    shown = ("output_tok_s", *settings.slo)
    for m in measured:
        for c in m.loads:
            row: dict[str, Any] = {"candidate": overrides_text(m.outcome.change), "predicted_rank": m.rank,
                                   "run_id": m.run_id, "status": m.status, "concurrency": c,
                                   "predicted_best_load": m.outcome.concurrency,
                                   "measured_best_load": m.concurrency, "measured_score": m.score,
                                   "predicted_score": m.outcome.score}
            for metric in dict.fromkeys(shown):
                row[f"predicted_{metric}"] = m.predicted.get(c, {}).get(metric)
                row[f"measured_{metric}"] = m.measured.get(c, {}).get(metric)
            rows.append(row)
    return rows


def candidate_label(rank: int, change: dict[str, Any]) -> str:
    return f"search #{rank} {overrides_text(change)}"
