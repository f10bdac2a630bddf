"""Every suggestion searched for and checked before it is made: for each finding, the changes worth
trying are predicted at the finding's own load point, and the best that helps is suggested, with the
runner-up and how far behind it is.

Advice that costs a user a GPU-hour to disprove is worse than none, and so is advice that misses a
better change nobody predicted. So for each finding with a load point:

1. **The changes tried.** The finding's own knobs, as its rule proposes them (``change`` first, then
   ``alternatives``: the micro-batch cap, async depth, admission cap, chunked prefill, mixed chunks, KV
   dtype, memory share, CUDA graphs, layer partition...), and every other layout of the same GPUs
   (``orchestrator/prediction/neighbourhood.py``). None is left out by a rule of thumb: the
   prediction decides, and a change that cannot run says why.
2. **Predicted as a search predicts a candidate**, at the finding's load point: validated, each
   closed-loop load ramped in and judged on its steady window (``orchestrator/prediction/at_load.py``),
   the trial's own config too, model against model. Each (engine, load) is predicted once per trial
   and shared with the sweep's other trials and its end through a cache on disk, on every core.
3. **Judged on the finding's goal.** Most findings are about capacity (idle stages, idle GPUs, a full
   KV pool, slow links, eager steps): *helps* means throughput up by ``MIN_GAIN`` or more, and by more
   than any p99 latency (TTFT, ITL) gets worse. A gain bought with a larger latency loss is a
   *trade-off*; a change that only moves latency (throughput within ``MIN_GAIN``, a p99 down by
   ``MIN_LATENCY_GAIN`` or more) is *latency only*. A finding about one latency (decodes stalled by
   prefills: ITL p99; requests queueing: TTFT p99) is judged on that p99: *helps* when it falls by
   ``MIN_LATENCY_GAIN`` or more while throughput does not fall by ``MIN_GAIN`` and the other p99 rises
   by less than the goal falls (in per cent); a larger cost on either side is a *trade-off*. Where the
   sweep declares SLOs (``search.slo``), a change that misses one at the point (one the trial's config
   met, or by more than it did) is *over the SLOs*, whatever else it does.
4. **The suggestion** is the change that helps most (its gain on the goal), with the runner-up and how
   far behind it is (and whether the prediction's noise can tell them apart). On throughput, a change
   predicted within ``MIN_GAIN`` of the best (a difference inside the model's error) is taken instead
   where it takes fewer GPUs or comes first in the finding's own order; when it is not one of
   the finding's own changes, the best of those that helps is named too (for a user who cannot change
   the layout). When the rule's own change does not help, the finding says so. When nothing helps, it
   says that, with every prediction tried, and suggests no change.
5. **Load is not a fix.** Where the rule names a load the configuration needs (``more_load``: a
   pipeline that fills only with more requests in flight), the same configuration is predicted there
   and reported apart, as what it needs, never as the change to make.

The effect is recorded as ``predicted_effect`` (docs/mlflow-layout.md lists its fields). It names its
source: a prediction of the simulated engine, not a measurement.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.diagnose import overrides_text
from analysis.noise import Estimate, judge
from orchestrator.config.schema import ParasweepConf, world_size
from orchestrator.config.slo import worst_ratio
from orchestrator.fidelity.trust import KIND_OF_GOAL, band_for_config
from orchestrator.prediction.at_load import Load, Predicted, predict_change, predict_changes
from orchestrator.prediction.modelled import step_costs_label
from orchestrator.prediction.neighbourhood import layouts
from orchestrator.prediction.verdict import (
    EFFECT_METRICS,
    MIN_GAIN,
    MIN_LATENCY_GAIN,
    change_pct,
    gain,
    verdict,
)
from vocab.findings import ABOUT_THE_MEASUREMENT, Finding
from vocab.load import LoadPoint

log = logging.getLogger("parasweep")

SOURCE = "simulated engine in virtual time (a prediction, not a measurement)"
OVER_SLO = "over the SLOs"
NAMES = {"output_tok_s": "tok/s", "ttft_p99_ms": "TTFT p99", "itl_p99_ms": "ITL p99"}


def _key(change: Mapping[str, Any]) -> str:
    return repr(sorted(change.items()))


def _own(finding: Finding) -> list[dict[str, Any]]:
    """The changes the finding's rule proposed: its change, then its alternatives."""
    return [c for c in (finding.change, *finding.alternatives) if c]


def _unique(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``changes`` without repeats, in their first order."""
    seen: dict[str, dict[str, Any]] = {}
    for change in changes:
        seen.setdefault(_key(change), change)
    return list(seen.values())


class AdviceChecker:
    """Predicts the changes worth trying for one trial's findings (``prepare``, once for all of them),
    then judges each finding (``check``)."""

    def __init__(self, cfg: ParasweepConf, points: list[LoadPoint], cache_dir: Path | None = None,
                 workers: int | None = None) -> None:
        self.cfg = cfg
        self.loads = {p.label: Load.of(p) for p in points}
        self.slo = dict(cfg.search.slo)
        self.cache_dir, self.workers = cache_dir, workers
        self.source = f"{SOURCE}; step costs: {step_costs_label(cfg)}"
        self.layouts = layouts(cfg)
        self._predicted: dict[tuple[str, str], Predicted] = {}  # (change, load label) -> prediction

    def _checkable(self, finding: Finding) -> bool:
        return finding.id not in ABOUT_THE_MEASUREMENT and finding.point in self.loads and bool(
            finding.change or finding.alternatives or self.layouts or finding.more_load)

    def candidates(self, finding: Finding) -> list[dict[str, Any]]:
        """The finding's own changes (its rule's, in its order), then every other layout."""
        return _unique([*_own(finding), *self.layouts])

    def prepare(self, findings: list[Finding]) -> None:
        """Predict what the findings need, each once: the trial's own config first, in this process
        (the pool's workers then inherit what it loaded), then every change at each point."""
        wanted: dict[str, list[dict[str, Any]]] = {}
        loads: dict[str, Load] = {}
        for f in findings:
            if not self._checkable(f):
                continue
            wanted.setdefault(f.point, []).extend(self.candidates(f))
            loads[f.point] = self.loads[f.point]
            if f.more_load:
                more = Load.closed(f.more_load)
                loads.setdefault(more.label, more)
        if not loads:
            return
        base = predict_change(self.cfg, {}, list(loads.values()), self.cache_dir)
        for label in loads:
            self._predicted[(_key({}), label)] = base
        for label, changes in wanted.items():
            predicted = predict_changes(self.cfg, _unique(changes), [loads[label]], self.cache_dir,
                                        self.workers)
            for p in predicted:
                self._predicted[(_key(p.change), label)] = p

    def _metrics(self, change: Mapping[str, Any], label: str) -> dict[str, float] | str:
        """The predicted metrics of ``change`` at ``label``, or why there are none."""
        p = self._predicted.get((_key(change), label))
        if p is None:
            return f"not predicted: no load point {label}"
        return p.metrics[label] if p.ok else p.reason

    # -- one finding ---------------------------------------------------------------------------------
    def check(self, finding: Finding) -> Finding:
        if not self._checkable(finding):
            return finding
        baseline = self._metrics({}, finding.point)
        if isinstance(baseline, str):
            return dataclasses.replace(finding, predicted_effect={"verdict": baseline, "source": self.source})
        goal = finding.goal
        own = _own(finding)
        effects = [self._effect(c, finding.point, baseline, goal) for c in self.candidates(finding)]
        tried = [_tried(e) for e in effects]
        helping = sorted((e for e in effects if e["verdict"] == "helps"), key=lambda e: -gain(e, goal))
        load = self._load_effect(finding, baseline)
        why = _why(finding)
        notes = []
        first = effects[0] if finding.change else None
        if first is not None and first["verdict"] != "helps":
            notes.append(f"{overrides_text(finding.change)} is predicted not to help ({_brief(first)}).")
        if not helping:
            effect: dict[str, Any] = {"verdict": "nothing tried helps", "point": finding.point,
                                      "tried": tried, "source": self.source,
                                      **({"load": load} if load else {})}
            text = (f"{why} No change tried is predicted to help at {finding.point} ({len(effects)} tried: "
                    f"{_tried_text(effects)}; {self.source}).")
            trades = sorted((e for e in effects if e["verdict"] == "trade-off"), key=lambda e: -gain(e, goal))
            if trades:  # what it would cost: the user may well take it
                best = effect["best_trade_off"] = trades[0]
                notes.append(f"The best trade-off: {overrides_text(best['change'])} ({_brief(best)}).")
            return dataclasses.replace(finding, change={}, alternatives=[], predicted_effect=effect,
                                       suggestion=" ".join([text, *notes, *_load_says(load)]))
        best = self._preferred(helping, finding, goal)
        rest = [e for e in helping if e is not best]
        effect = {**best, "tried": tried}
        if first is not None and first["verdict"] != "helps":
            effect["instead_of"] = first
        if rest:
            effect["runner_up"] = self._runner_up(best, rest[0], goal)
            notes.append(_runner_up_says(effect["runner_up"], goal))
        if all(_key(best["change"]) != _key(c) for c in own):
            mine = next((e for e in helping if any(_key(e["change"]) == _key(c) for c in own)), None)
            if mine is not None:
                effect["own"] = mine
                notes.append(f"Of this finding's own changes: {overrides_text(mine['change'])} "
                             f"({_brief(mine)}).")
        if load:
            effect["load"] = load
        text = f"{why} Set {overrides_text(best['change'])}. {_says(best)}"
        return dataclasses.replace(finding, change=best["change"], alternatives=[], predicted_effect=effect,
                                   suggestion=" ".join([text, *notes, *_load_says(load)]))

    def _effect(self, change: Mapping[str, Any], label: str, baseline: dict[str, float],
                goal: str = "throughput", load_change: bool = False, at: str | None = None) -> dict[str, Any]:
        predicted = self._metrics(change, at or label)
        effect: dict[str, Any] = {"change": dict(change), "point": label, "source": self.source}
        if isinstance(predicted, str):
            return {**effect, "verdict": predicted}
        pct = change_pct(predicted, baseline)
        effect.update(baseline={k: baseline[k] for k in EFFECT_METRICS if k in baseline},
                      predicted={k: predicted[k] for k in EFFECT_METRICS if k in predicted},
                      predicted_at=at or label, change_pct=pct,
                      verdict=verdict(pct, load_change=load_change, goal=goal))
        gpus = self._predicted[(_key(change), at or label)].gpus
        if gpus != world_size(self.cfg):  # a change that buys its effect with more GPUs says so
            effect["gpus"] = gpus
        noise = predicted.get("output_tok_s_ci95_rel")
        if noise is not None and math.isfinite(noise):
            effect["tok_s_ci95_rel"] = noise
        miss = self._slo_miss(predicted, baseline)
        if miss and not load_change:
            effect.update(verdict=OVER_SLO, slo_miss=miss)
        if goal != "throughput":
            effect["goal"] = goal
        band = band_for_config(self.cfg, change, KIND_OF_GOAL.get(goal, ""))
        if band is not None:  # how far such predictions are from published measurements
            effect.update(model_error_pct=band.pct, model_error=band.text())
        return effect

    def _slo_miss(self, predicted: Mapping[str, float], baseline: Mapping[str, float]) -> str:
        """The SLO the prediction misses (one the trial's config met, or by more than it did), or ""."""
        worst = worst_ratio(predicted, self.slo)
        base = worst_ratio(baseline, self.slo)
        if worst is None or worst[1] <= max(1.0, base[1] if base else 0.0):
            return ""
        metric = worst[0]
        return f"{metric} {predicted[metric]:,.1f} ms > {self.slo[metric]:g}"

    def _load_effect(self, finding: Finding, baseline: dict[str, float]) -> dict[str, Any] | None:
        """The trial's own config at the load its finding says it needs (``more_load``)."""
        if not finding.more_load:
            return None
        at = Load.closed(finding.more_load).label
        effect = self._effect({}, finding.point, baseline, load_change=True, at=at)
        return {**effect, "concurrency": finding.more_load}

    def _preferred(self, helping: list[dict[str, Any]], finding: Finding, goal: str) -> dict[str, Any]:
        """The change to suggest of those predicted to help (``helping``, best first): the best, unless
        another one within the model's error of it (``MIN_GAIN`` of its throughput) takes fewer GPUs or
        comes earlier in the finding's own order (the rule's preference: the same GPUs before more). A
        difference the model cannot resolve crowns nothing."""
        best = helping[0]
        if goal != "throughput":
            return best
        order = {_key(c): i for i, c in enumerate(self.candidates(finding))}
        gpus = world_size(self.cfg)
        floor = best["predicted"]["output_tok_s"] * (1.0 - MIN_GAIN)
        return min((e for e in helping if e["predicted"]["output_tok_s"] >= floor),
                   key=lambda e: (e.get("gpus", gpus), order.get(_key(e["change"]), len(order)),
                                  -e["predicted"]["output_tok_s"]))

    @staticmethod
    def _runner_up(best: dict[str, Any], runner: dict[str, Any], goal: str) -> dict[str, Any]:
        """The runner-up, how far behind the best it is (per cent of the best's goal metric) and whether
        the prediction's noise can tell them apart (throughput only: its window's interval)."""
        metric = "output_tok_s" if goal == "throughput" else goal
        b, r = best["predicted"].get(metric, math.nan), runner["predicted"].get(metric, math.nan)
        behind = 100.0 * ((1 - r / b) if goal == "throughput" else (r / b - 1)) if b else math.nan
        out = {"change": runner["change"], "verdict": runner["verdict"], "change_pct": runner["change_pct"],
               "behind_pct": behind}
        if goal == "throughput":
            call = judge([Estimate.scaled(b, best.get("tok_s_ci95_rel")),
                          Estimate.scaled(r, runner.get("tok_s_ci95_rel"))])
            if call is not None and not call.clear:
                out["within_noise"] = call.noise()
        return out


def _why(finding: Finding) -> str:
    """The rule's reason, without the "Set ..." its suggestion ends with (the check says what to set)."""
    text = finding.suggestion.strip()
    tail = f" Set {overrides_text(finding.change)}." if finding.change else ""
    return text[: -len(tail)] if tail and text.endswith(tail) else text


def _tried(effect: Mapping[str, Any]) -> dict[str, Any]:
    """What the record keeps of a change tried: the change, its verdict (or why it could not be
    predicted) and its relative changes."""
    out = {"change": effect["change"], "verdict": effect["verdict"]}
    for key in ("change_pct", "slo_miss"):
        if key in effect:
            out[key] = effect[key]
    return out


def _brief(effect: Mapping[str, Any]) -> str:
    if "change_pct" not in effect:
        return str(effect["verdict"])
    pct = effect["change_pct"]
    parts = [f"{pct.get('output_tok_s', 0.0):+.0f}% tok/s"]
    parts += [f"{pct[k]:+.0f}% {NAMES[k]}" for k in ("ttft_p99_ms", "itl_p99_ms")
              if k in pct and abs(pct[k]) >= 100 * MIN_LATENCY_GAIN]
    miss = f" ({effect['slo_miss']})" if effect.get("slo_miss") else ""
    return f"{effect['verdict']}{miss}: {', '.join(parts)}"


def _tried_text(effects: list[dict[str, Any]]) -> str:
    """The changes tried, by verdict, the first few of each named."""
    by: dict[str, list[str]] = {}
    for e in effects:
        verdict_ = str(e["verdict"]).split(":")[0]
        by.setdefault(verdict_, []).append(overrides_text(e["change"]))
    parts = []
    for v, changes in by.items():
        named = ", ".join(changes[:2]) + (f" and {len(changes) - 2} more" if len(changes) > 2 else "")
        parts.append(f"{v}: {named}")
    return "; ".join(parts)


def _says(effect: Mapping[str, Any]) -> str:
    """``Predicted at c32 → c64: 229 → 612 tok/s (+167%), TTFT p99 …, ITL p99 … (simulated ...).``"""
    b, p, pct = effect["baseline"], effect["predicted"], effect["change_pct"]
    where = effect["point"] if effect["predicted_at"] == effect["point"] else \
        f"{effect['point']} → {effect['predicted_at']}"
    parts = [f"{b['output_tok_s']:.0f} → {p['output_tok_s']:.0f} tok/s ({pct['output_tok_s']:+.0f}%)"]
    for key in ("ttft_p99_ms", "itl_p99_ms"):
        if key in pct:
            parts.append(f"{NAMES[key]} {b[key]:.0f} → {p[key]:.0f} ms ({pct[key]:+.0f}%)")
    gpus = f" on {effect['gpus']} GPUs" if effect.get("gpus") else ""
    return f"Predicted at {where}{gpus}: {', '.join(parts)}; {effect['source']}.{_inside_band(effect)}"


def _inside_band(effect: Mapping[str, Any]) -> str:
    """" Inside the model's error ..." when the predicted gain is smaller than the model's error on
    published runs like it ("" otherwise)."""
    band = effect.get("model_error_pct")
    if band is None or abs(gain(effect, effect.get("goal", "throughput"))) >= band:
        return ""
    return (f" The gain is inside the model's error on published measurements ({effect['model_error']}): "
            "measure it before relying on it.")


def _runner_up_says(runner: Mapping[str, Any], goal: str) -> str:
    behind = runner["behind_pct"]
    if goal != "throughput":
        how = f"its {NAMES.get(goal, goal)} {behind:+.0f}% against the best's"
    elif behind < 0:  # ahead by less than the model can resolve: the suggestion was preferred for its GPUs
        # or its place in the finding's order (_preferred)
        how = f"{-behind:.0f}% more tok/s, inside the model's error: the suggestion is preferred"
    else:
        how = f"{behind:.0f}% fewer tok/s"
    noise = (f"; within the prediction's noise ({runner['within_noise']}): either will do"
             if runner.get("within_noise") else "")
    return f"Runner-up: {overrides_text(runner['change'])} ({how}{noise})."


def _load_says(load: Mapping[str, Any] | None) -> list[str]:
    """The load the configuration needs, said apart from the fix."""
    if not load or "change_pct" not in load:
        return []
    p, pct = load["predicted"], load["change_pct"]
    lat = ", ".join(f"{NAMES[k]} {pct[k]:+.0f}%" for k in ("ttft_p99_ms", "itl_p99_ms") if k in pct)
    return [f"More load is what this configuration needs, not a fix: at {load['predicted_at']} it is "
            f"predicted at {p['output_tok_s']:.0f} tok/s ({pct['output_tok_s']:+.0f}%"
            + (f"; {lat}" if lat else "") + ")."]


def check_findings(findings: list[Finding], cfg: ParasweepConf, points: list[LoadPoint],
                   cache_dir: Path | None = None, workers: int | None = None) -> list[Finding]:
    """Each finding with a load point, its changes searched and checked by prediction (module
    docstring). A finding whose prediction fails stands without it rather than being lost."""
    checker = AdviceChecker(cfg, points, cache_dir, workers)
    try:
        checker.prepare(findings)
    except Exception:
        log.exception("could not predict the changes the findings suggest")
        return findings
    out = []
    for finding in findings:
        try:
            out.append(checker.check(finding))
        except Exception:
            log.exception("could not predict the effect of finding %s", finding.id)
            out.append(finding)
    return out
