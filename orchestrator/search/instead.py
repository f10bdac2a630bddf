"""What to run instead: at the end of a sweep, the configurations of the same GPUs it did not run,
predicted at its loads beside its trials, model against model. The search's answer for this model,
node and workload, where the user is already looking.

* **Comparable.** Only a sweep whose trials share the model, the hardware, the number of GPUs, the
  workload's requests and the cost model (calibration, step costs) is answered: otherwise "better"
  would compare unlike things. Its loads are the closed-loop concurrencies every trial ran.
* **Candidates.** Every other layout of the GPUs of the trial predicted best at the busiest load,
  aggregated or disaggregated into prefill and decode servers
  (``orchestrator/prediction/neighbourhood.py``), and the changes that trial's diagnosis suggested.
  Where the sweep ran both engines (``engine=sglang,vllm``), the same for each engine's best trial:
  the answer may be the other engine's.
  Each trial's own config is predicted at the same loads the same way (``at_load.py``), so the
  comparison is model against model, never a prediction against a measurement.
* **Better than every trial.** A candidate is recommended when, against each trial, it is at no load
  a trade-off or worse (``orchestrator/prediction/verdict.py``: throughput within 5 % or up, and no p99
  worse by more than the gain), and at some load it helps by more than the prediction's noise (the
  95 % intervals of the two windows' throughput); within the sweep's SLOs (``search.slo``) where it
  declares them. Of several, the one with the highest throughput at the busiest load.
* **Said once**, with its ``run.py`` command line (the trial's own overrides and the change) and the
  engine command it stands for (SGLang's, or ``vllm serve``). When nothing qualifies, one line says how
  many configurations were tried.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.diagnose import overrides_text
from analysis.noise import Estimate, judge
from orchestrator.config.schema import ParasweepConf, plays_vllm, world_size
from orchestrator.config.slo import worst_ratio
from orchestrator.fidelity.trust import THROUGHPUT, band_for_config
from orchestrator.prediction.at_load import Load, Predicted, predict_many
from orchestrator.prediction.modelled import step_costs_label
from orchestrator.prediction.neighbourhood import layouts
from orchestrator.prediction.verdict import COSTLY, EFFECT_METRICS, change_pct, verdict

log = logging.getLogger("parasweep")

SOURCE = "simulated engine in virtual time (a prediction, not a measurement)"
# overrides that say where a run is recorded or how Hydra runs it, not what it runs
NOT_CONFIG = ("tracking.", "hydra.", "ray.", "reproduce", "resume", "repeats", "predict", "dry_run")


@dataclass(frozen=True)
class SweepTrial:
    """One finished trial of the sweep, as the answer needs it."""

    name: str  # "#0 pp.async_depth=0"
    cfg: ParasweepConf
    overrides: tuple[str, ...] = ()  # as the user gave them (config/overrides.yaml)
    suggested: tuple[dict[str, Any], ...] = field(default_factory=tuple)  # its diagnosis's changes


def _comparable(trials: Sequence[SweepTrial]) -> str:
    """Why the trials cannot be compared as one question ("" when they can)."""
    def what(cfg: ParasweepConf) -> dict[str, Any]:
        w = cfg.workload
        return {"model": cfg.model.path, "hardware": cfg.hardware.name, "GPUs": world_size(cfg),
                "workload": (w.api, w.input_len, w.output_len, w.input_dist, w.output_dist),
                "cost model": (cfg.calibration.name, cfg.simulator.step_costs)}

    first = what(trials[0].cfg)
    for t in trials[1:]:
        other = what(t.cfg)
        differ = [k for k in first if first[k] != other[k]]
        if differ:
            return f"the trials differ in {', '.join(differ)}"
    return ""


def _loads(trials: Sequence[SweepTrial]) -> list[Load]:
    common = set.intersection(*(set(t.cfg.workload.concurrency) for t in trials))
    return [Load.closed(c) for c in sorted(common)]


def _judge_one(candidate: Predicted, trials: Mapping[str, Predicted], loads: Sequence[Load],
               slo: Mapping[str, float]) -> bool:
    """Whether ``candidate`` is better than every trial (module docstring)."""
    for trial in trials.values():
        clear = False
        for load in loads:
            mine, theirs = candidate.metrics[load.label], trial.metrics[load.label]
            call = verdict(change_pct(mine, theirs))
            worst, base = worst_ratio(mine, slo), worst_ratio(theirs, slo)
            if call in COSTLY or (worst and worst[1] > max(1.0, base[1] if base else 0.0)):
                return False
            if call == "helps":
                noise = judge([Estimate.scaled(mine["output_tok_s"], mine.get("output_tok_s_ci95_rel")),
                               Estimate.scaled(theirs["output_tok_s"], theirs.get("output_tok_s_ci95_rel"))])
                clear = clear or (noise is not None and noise.clear and noise.best == 0)
        if not clear:
            return False
    return True


def run_instead(trials: Sequence[SweepTrial], cache_dir: Path | None = None,
                workers: int | None = None) -> dict[str, Any]:
    """The answer (module docstring) as a JSON-able dict: ``recommend`` with the change, the numbers
    and the command lines, or ``none`` / ``skipped`` with the reason."""
    if not trials:
        return {"skipped": "no trial finished"}
    why = _comparable(trials)
    loads = _loads(trials)
    if why or not loads:
        return {"skipped": why or "the trials share no closed-loop load point"}
    predicted = predict_many([(t.cfg, {}) for t in trials], loads, cache_dir, workers)
    own = {t.name: p for t, p in zip(trials, predicted, strict=True) if p.ok}
    if not own:
        return {"skipped": "no trial's configuration could be predicted"}
    busiest = loads[-1].label
    # the best trial of each engine the sweep ran: the candidates are its neighbours
    bases = [max(group, key=lambda t: own[t.name].metrics[busiest].get("output_tok_s", 0.0))
             for vllm in (False, True)
             if (group := [t for t in trials if t.name in own and plays_vllm(t.cfg) == vllm])]
    engines = {p.engine for p in own.values()}
    changes = [(b, c) for b in bases for c in [*layouts(b.cfg), *b.suggested] if c]
    tried = predict_many([(b.cfg, c) for b, c in changes], loads, cache_dir, workers)
    fresh = [(b, p) for (b, _), p in zip(changes, tried, strict=True) if p.ok and p.engine not in engines]
    base = bases[0]
    slo = dict(base.cfg.search.slo)
    winners = [(b, p) for b, p in fresh if _judge_one(p, own, loads, slo)]
    gpus = world_size(base.cfg)
    labels = [load.label for load in loads]
    if not winners:
        return {"none": (f"no other configuration of the same {gpus} GPUs is predicted better than every "
                         f"trial at {', '.join(labels)} ({len(changes)} tried, {len(fresh)} predicted; "
                         f"{SOURCE})"), "tried": len(changes)}
    best_base, best = max(winners, key=lambda w: w[1].metrics[busiest].get("output_tok_s", 0.0))
    return {"recommend": _answer(best, best_base, own, loads, slo, len(changes))}


def _answer(best: Predicted, base: SweepTrial, own: Mapping[str, Predicted], loads: Sequence[Load],
            slo: Mapping[str, float], tried: int) -> dict[str, Any]:
    from orchestrator.search.runner import sglang_command, vllm_command

    per_load = {}
    for load in loads:
        label = load.label
        rival = max(own, key=lambda name: own[name].metrics[label].get("output_tok_s", -math.inf))
        mine, theirs = best.metrics[label], own[rival].metrics[label]
        per_load[label] = {"predicted": {k: mine[k] for k in EFFECT_METRICS if k in mine},
                           "best_trial": rival,
                           "trial_predicted": {k: theirs[k] for k in EFFECT_METRICS if k in theirs},
                           "change_pct": change_pct(mine, theirs)}
    cfg = base.cfg
    kept = [o for o in base.overrides if not o.lstrip("+~").startswith(NOT_CONFIG)
            and o.lstrip("+~").split("=", 1)[0] not in {k.removeprefix("env.") for k in best.change}]
    concurrency = ",".join(str(load.concurrency) for load in loads)
    if not any(o.startswith("workload.concurrency=") for o in kept):
        kept.append(f"workload.concurrency=[{concurrency}]")
    env = [f"{k.removeprefix('env.')}={v}" for k, v in best.change.items() if k.startswith("env.")]
    keys = {k: v for k, v in best.change.items() if not k.startswith("env.")}
    band = band_for_config(cfg, best.change, THROUGHPUT)
    if band is not None:  # how far such predictions are from published measurements
        for one in per_load.values():
            one["inside_model_error"] = band.inside(one["change_pct"].get("output_tok_s", 0.0))
    answer = {"change": best.change, "gpus": best.gpus, "base": base.name, "loads": list(per_load),
              "per_load": per_load, "tried": tried, "slo": dict(slo),
              "source": f"{SOURCE}; step costs: {step_costs_label(cfg)}"
                        + (f"; the model's error: {band.text()}" if band else ""),
              "run_py": " ".join([*env, "python", "run.py", *kept, overrides_text(keys)]).strip()}
    if plays_vllm(cfg):
        answer["vllm"], answer["vllm_release"] = vllm_command(cfg, best.change)
        return answer
    answer["sglang"] = sglang_command(cfg, best.change)
    if cfg.model.weights:
        answer["sglang_weights"] = sglang_command(cfg, best.change, cfg.model.weights)
    return answer


def sweep_trials(runs: Sequence[Any], tracking_uri: str | None) -> list[SweepTrial]:
    """The sweep's finished trials (status ok, or skipped as done before) whose directory is on this
    machine: their config as resolved, their overrides and the changes their diagnosis suggested."""
    import yaml
    from omegaconf import OmegaConf

    from analysis.report import load_findings
    from orchestrator.config.validate import typed_config
    from vocab.status import Tag

    out = []
    for index, run in enumerate(runs):
        tags = run.data.tags
        folder = Path(tags.get(Tag.TRIAL_DIR) or "") / "config"
        if tags.get(Tag.STATUS) not in ("ok", "skipped") or not (folder / "resolved.yaml").is_file():
            continue
        cfg = typed_config(OmegaConf.create(yaml.safe_load((folder / "resolved.yaml").read_text())))
        overrides = (yaml.safe_load((folder / "overrides.yaml").read_text()) or []
                     if (folder / "overrides.yaml").is_file() else [])
        suggested = tuple(dict(f["change"]) for f in load_findings(run, tracking_uri)
                          if f.get("change") and (f.get("predicted_effect") or {}).get("verdict") == "helps")
        name = f"#{tags.get(Tag.TRIAL_NUM, index)} {tags.get(Tag.OVERRIDES) or 'defaults'}"
        out.append(SweepTrial(name, cfg, tuple(str(o) for o in overrides), suggested))
    return out
