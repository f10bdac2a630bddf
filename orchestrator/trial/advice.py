"""Every suggestion checked before it is made: each finding's config change is predicted in virtual
time on the same load point, and the predicted effect goes into the finding.

Advice that costs a user a GPU-hour to disprove is worse than none. So for each finding with a
``change``:

1. predict the trial's config as it is, and with the change, at the finding's load point (both on the
   simulated engine, so the comparison is model against model);
2. if the change is predicted to help, keep the suggestion and add the effect. What *helps* means
   follows the finding's ``goal``. Most findings are about capacity (idle stages, idle GPUs, a full
   KV pool, slow links, eager steps, a queue at the door): *helps* means throughput up by
   ``MIN_GAIN`` or more, and by more than any p99 latency (TTFT, ITL) gets worse. A gain bought with
   a larger latency loss is a *trade-off*; a change that only moves latency (throughput within
   ``MIN_GAIN``, a p99 down by ``MIN_LATENCY_GAIN`` or more) is *latency only*. Both are reported,
   neither is suggested as the fix. A change of the load itself (more concurrency) is judged on
   throughput alone: more requests in flight always wait longer, and the finding states that cost.
   A finding about one latency (decodes stalled by prefills: ITL p99; requests queueing: TTFT p99)
   is judged on that p99: *helps* when it falls by ``MIN_LATENCY_GAIN`` or more while throughput
   does not fall by ``MIN_GAIN`` and the other p99 rises by less than the goal falls (in per cent);
   a larger cost on either side is a *trade-off*;
3. otherwise predict the finding's ``alternatives`` (more load, another layout, ...) and suggest the
   best that helps instead, saying that the first change would not; if none helps, say that, with
   every prediction tried, and suggest no change.

The effect is recorded as ``predicted_effect`` (see docs/mlflow-layout.md for its fields). It names its
source: a prediction of the simulated engine, not a measurement.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

from analysis.diagnose import overrides_text
from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import UserError
from orchestrator.load_plan import load_points
from orchestrator.trial.modelled import apply_change, predict_at, step_costs_label
from vocab.findings import Finding
from vocab.load import LoadPoint

log = logging.getLogger("parasweep")

MIN_GAIN = 0.05  # a throughput gain below 5 % is within the model's error: not worth a GPU-hour
MIN_LATENCY_GAIN = 0.10
MAX_PREDICTIONS = 16  # per trial: the check must stay seconds, not minutes
EFFECT_METRICS = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms")
SOURCE = "simulated engine in virtual time (a prediction, not a measurement)"


class AdviceChecker:
    """Predicts changes to one trial's config; predictions are cached and capped per trial."""

    def __init__(self, cfg: ParasweepConf, points: list[LoadPoint]) -> None:
        self.cfg = cfg
        self.points = {p.label: p for p in points}
        self.predictions = 0
        self.source = f"{SOURCE}; step costs: {step_costs_label(cfg)}"
        self._cache: dict[str, dict[str, float] | str] = {}

    def predict(self, change: Mapping[str, Any], label: str) -> dict[str, float] | str:
        """The predicted metrics of ``change`` at the point ``label`` (or at the changed concurrency),
        or a one-line reason it could not be predicted."""
        key = f"{sorted(change.items())!r}@{label}"
        if key not in self._cache:
            self._cache[key] = self._predict(change, label)
        return self._cache[key]

    def _predict(self, change: Mapping[str, Any], label: str) -> dict[str, float] | str:
        if self.predictions >= MAX_PREDICTIONS:
            return "not predicted (limit of predictions per trial reached)"
        self.predictions += 1
        try:
            changed, env = apply_change(self.cfg, change)
        except UserError as exc:
            return f"not possible: {exc}"
        # the same load point, unless the change is the load itself
        point = None if "workload.concurrency" in change else self.points.get(label)
        if point is None and "workload.concurrency" not in change:
            return f"not predicted: no load point {label}"
        if point is None:
            point = load_points(changed)[0]
        try:
            metrics = predict_at(changed, env, point)
        except Exception as exc:  # a config the model cannot run (e.g. weights that do not fit)
            return f"not possible: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        return {k: float(metrics[k]) for k in EFFECT_METRICS if k in metrics} | {"point": point.label}

    # -- one finding ---------------------------------------------------------------------------------
    def check(self, finding: Finding) -> Finding:
        if not finding.change or not finding.point:
            return finding
        baseline = self.predict({}, finding.point)
        if isinstance(baseline, str):
            return dataclasses.replace(finding, predicted_effect={"verdict": baseline, "source": self.source})
        first = self._effect(finding.change, finding.point, baseline, finding.goal)
        if first["verdict"] == "helps":
            return dataclasses.replace(
                finding, suggestion=f"{finding.suggestion} {_says(first)}", predicted_effect=first)
        tried = [first] + [self._effect(alt, finding.point, baseline, finding.goal)
                           for alt in finding.alternatives]
        helping = [e for e in tried[1:] if e["verdict"] == "helps"]
        not_first = f"{overrides_text(finding.change)} is predicted not to help ({_brief(first)})"
        if helping:
            best = max(helping, key=lambda e: _gain(e, finding.goal))
            return dataclasses.replace(
                finding, change=best["change"], alternatives=[],
                suggestion=f"{not_first}. Instead: {overrides_text(best['change'])}. {_says(best)}",
                predicted_effect={**best, "instead_of": first})
        others = "; ".join(f"{overrides_text(e['change'])}: {_brief(e)}" for e in tried[1:])
        return dataclasses.replace(
            finding, change={}, alternatives=[],
            suggestion=(f"No change tried is predicted to help at {finding.point}: {not_first}"
                        + (f"; {others}" if others else "") + f" ({self.source})."),
            predicted_effect={"verdict": "nothing tried helps", "tried": tried, "source": self.source})

    def _effect(self, change: Mapping[str, Any], label: str, baseline: dict[str, float],
                goal: str = "throughput") -> dict[str, Any]:
        predicted = self.predict(change, label)
        effect: dict[str, Any] = {"change": dict(change), "point": label, "source": self.source}
        if isinstance(predicted, str):
            return {**effect, "verdict": predicted}
        # a metric without samples (NaN: no ITL when every request has one output token) moves nothing
        pct = {k: 100.0 * (predicted[k] - baseline[k]) / baseline[k] for k in EFFECT_METRICS
               if k in predicted and k in baseline and baseline[k]
               and math.isfinite(predicted[k] - baseline[k])}
        effect.update(baseline={k: baseline[k] for k in EFFECT_METRICS if k in baseline},
                      predicted={k: predicted[k] for k in EFFECT_METRICS if k in predicted},
                      predicted_at=predicted["point"], change_pct=pct,
                      verdict=verdict(pct, load_change="workload.concurrency" in change, goal=goal))
        if goal != "throughput":
            effect["goal"] = goal
        return effect


def _gain(effect: Mapping[str, Any], goal: str) -> float:
    """How much an effect does for the goal: the throughput change, or the fall of the goal's p99 (%)."""
    pct = effect["change_pct"]
    return pct.get("output_tok_s", 0.0) if goal == "throughput" else -pct.get(goal, 0.0)


def _latency_verdict(pct: Mapping[str, float], goal: str) -> str:
    """``helps`` | ``trade-off`` | ``negligible`` | ``worse`` for a latency goal (module docstring)."""
    gain = -pct.get(goal, 0.0) / 100
    tok = pct.get("output_tok_s", 0.0) / 100
    other = "ttft_p99_ms" if goal == "itl_p99_ms" else "itl_p99_ms"
    cost = pct.get(other, 0.0) / 100
    if gain >= MIN_LATENCY_GAIN:
        return "helps" if tok > -MIN_GAIN and cost < gain else "trade-off"
    if gain <= -MIN_LATENCY_GAIN or tok <= -MIN_GAIN:
        return "worse"
    return "negligible"


def verdict(pct: Mapping[str, float], load_change: bool = False, goal: str = "throughput") -> str:
    """``helps`` | ``trade-off`` | ``latency only`` | ``negligible`` | ``worse`` (module docstring)."""
    if goal != "throughput":
        return _latency_verdict(pct, goal)
    tok = pct.get("output_tok_s", 0.0) / 100
    latencies = [] if load_change else [pct[k] / 100 for k in ("ttft_p99_ms", "itl_p99_ms") if k in pct]
    worst = max(latencies, default=0.0)
    if tok >= MIN_GAIN:
        return "helps" if worst < tok else "trade-off"
    if tok <= -MIN_GAIN:
        return "worse"
    if min(latencies, default=0.0) <= -MIN_LATENCY_GAIN:
        return "latency only"
    return "worse" if worst >= MIN_LATENCY_GAIN else "negligible"


def _brief(effect: Mapping[str, Any]) -> str:
    if "change_pct" not in effect:
        return str(effect["verdict"])
    pct = effect["change_pct"]
    parts = [f"{pct.get('output_tok_s', 0.0):+.0f}% tok/s"]
    parts += [f"{pct[k]:+.0f}% {name}" for k, name in (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99"))
              if k in pct and abs(pct[k]) >= 100 * MIN_LATENCY_GAIN]
    return f"{effect['verdict']}: {', '.join(parts)}"


def _says(effect: Mapping[str, Any]) -> str:
    """``Predicted at c32 → c32: 229 → 612 tok/s (+167%), TTFT p99 …, ITL p99 … (simulated ...).``"""
    b, p, pct = effect["baseline"], effect["predicted"], effect["change_pct"]
    where = effect["point"] if effect["predicted_at"] == effect["point"] else \
        f"{effect['point']} → {effect['predicted_at']}"
    parts = [f"{b['output_tok_s']:.0f} → {p['output_tok_s']:.0f} tok/s ({pct['output_tok_s']:+.0f}%)"]
    for key, name in (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99")):
        if key in pct:
            parts.append(f"{name} {b[key]:.0f} → {p[key]:.0f} ms ({pct[key]:+.0f}%)")
    return f"Predicted at {where}: {', '.join(parts)}; {effect['source']}."


def check_findings(findings: list[Finding], cfg: ParasweepConf, points: list[LoadPoint]) -> list[Finding]:
    """Each finding with a suggested change, checked by prediction (see the module docstring)."""
    checker = AdviceChecker(cfg, points)
    out = []
    for finding in findings:
        try:
            out.append(checker.check(finding))
        except Exception:  # the finding stands without its prediction rather than being lost
            log.exception("could not predict the effect of finding %s", finding.id)
            out.append(finding)
    return out
