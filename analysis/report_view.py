"""What the HTML report shows, as plain data for its template (``analysis/templates/report.html.j2``):
the header and its headline, the search's page, the configuration, the results table, where each trial
ran, the findings, the telemetry pictures and where the data is. Nothing here writes HTML: the template
does, with autoescaping, so every text from the store reaches the page escaped."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from analysis.by_length import class_rows
from analysis.diagnose import overrides_text
from analysis.noise import NAN, judge, point_estimate
from analysis.repeats import combine_repeats
from analysis.report import behind_text, finding_key, instead_lines, load_text, merge_findings, merge_texts
from analysis.store import masked
from vocab.metric_keys import PointLabel, point_metrics
from vocab.status import RunKind, Tag
from vocab.status import simulated as is_simulated
from workloads.length_classes import CLASSES

COMMON_HIGHLIGHTS = ("model.name", "hardware.name", "hardware.gpu", "tp.size", "pp.size", "dp.size",
                     "ep.size", "workload.name", "workload.concurrency", "workload.rate")
SEARCH_SHOWN = 10  # candidates of the search's table shown in the report, best first
SEARCH_HIDDEN = ("status", "reason", "category", "miss", "same_as", "replicas_of")


@dataclass
class Trial:
    run: Any
    measured: dict[PointLabel, dict[str, float]]
    predicted: dict[PointLabel, dict[str, float]]
    findings: list[dict[str, Any]] | None = None  # None: no diagnosis.json recorded
    pictures: list[tuple[str, str]] = field(default_factory=list)  # (caption, data URI)

    @property
    def tags(self) -> dict[str, str]:
        return self.run.data.tags

    @property
    def label(self) -> str:
        num = self.tags.get(Tag.TRIAL_NUM)
        overrides = self.tags.get(Tag.OVERRIDES) or "defaults"
        return f"#{num} {overrides}" if num is not None else (self.run.info.run_name or overrides)

    @property
    def status(self) -> str:
        return self.tags.get(Tag.STATUS) or self.run.info.status.lower()

    @property
    def is_prediction(self) -> bool:
        return self.tags.get(Tag.KIND) == RunKind.PREDICTION


@dataclass
class SearchPage:
    """A search run's own artifacts (``search/``): its answer, its table of candidates, its Pareto
    fronts and its measured candidates."""

    source: str  # where the candidates' numbers come from
    answer: str = ""
    candidates: Any = None  # DataFrame, or None when the table is missing
    measured: Any = None
    pictures: list[tuple[str, str]] = field(default_factory=list)


def num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:,.{digits}f}"


def short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def telemetry_words(trials: Sequence[Trial]) -> str:
    from analysis.plots import describe_source

    sources = sorted({t.tags.get(Tag.GPU_TELEMETRY, "") for t in trials} - {""})
    return ", ".join(describe_source(s) for s in sources) or "source not recorded"


def engines(trials: Sequence[Trial]) -> tuple[bool, str]:
    """Whether any number is simulated, and one sentence naming the engine and GPU telemetry source."""
    names = sorted({t.tags.get(Tag.ENGINE, "") for t in trials} - {""})
    versions = sorted({t.tags.get(Tag.ENGINE_VERSION, "") for t in trials} - {""})
    sources = sorted({t.tags.get(Tag.GPU_TELEMETRY, "") for t in trials} - {""})
    simulated = any(is_simulated(e) for e in names) or "simulated" in sources
    parts = []
    for engine in names:
        parts.append({"sim": "the simulated engine (a discrete-event model behind an SGLang-compatible "
                             "HTTP server): timings simulated, not measured",
                      "sim-predict": "the simulated engine's model in virtual time: predictions, "
                                     "not measurements",
                      "sim-vllm": "the simulated engine playing vLLM (the same model behind a "
                                  "vLLM-compatible HTTP server): timings simulated, not measured",
                      "sglang": "measured on SGLang",
                      "vllm": "measured on vLLM"}.get(engine, f"engine {engine}"))
    text = "; ".join(parts) or "engine unknown (no trial recorded one)"
    if versions:
        text += f" ({', '.join(versions)})"
    if sources:
        text += f". GPU telemetry: {telemetry_words(trials)}"
    errors = sorted({t.tags.get(Tag.PREDICTION_ERROR, "") for t in trials} - {""})
    if errors and (simulated or any(t.predicted for t in trials)):  # how far the model's numbers go
        text += f". The model's error on published runs like these: {'; '.join(errors)}"
    return simulated, text + "."


# -- the header ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Headline:
    """The highest output tok/s among valid points and how it stands against the next trial there."""

    value: str
    point: str
    label: str
    verdict: str  # "" (no other trial there), or a sentence on the next trial, starting with ", "

    @property
    def text(self) -> str:
        return (f"Highest output throughput at a valid point: {self.value} tok/s at {self.point} "
                f"({self.label}){self.verdict}.")


def headline(trials: Sequence[Trial]) -> Headline | None:
    """The one-line answer most readers look for, and whether it beats the next trial at that point
    beyond the noise of both (repeats of a configuration count as one, judged by their spread:
    :mod:`analysis.repeats`)."""
    combined = combine_repeats([t.run for t in trials])
    rows = [Trial(run, point_metrics(run.data.metrics), {}) for run in combined]
    best: tuple[float, Trial, PointLabel] | None = None
    for trial in rows:
        for point, m in trial.measured.items():
            value = m.get("output_tok_s")
            if value is None or not math.isfinite(value) or m.get("valid", 1.0) != 1.0:
                continue
            if best is None or value > best[0]:
                best = (value, trial, point)
    if best is None:
        return None
    value, trial, point = best
    here = [(t, t.measured[point]) for t in rows if point in t.measured
            and t.measured[point].get("valid", 1.0) == 1.0
            and math.isfinite(t.measured[point].get("output_tok_s", NAN))]
    verdict = judge([point_estimate(m, "output_tok_s") for _, m in here]) if len(here) > 1 else None
    tail = ""
    if verdict is not None and verdict.runner_up is not None:
        second, m = here[verdict.runner_up]
        if verdict.clear:
            tail = (f", ahead of the next ({second.label}, {num(m['output_tok_s'])} tok/s) beyond the noise "
                    "of both")
        else:
            tail = (f", {verdict.text()} of {second.label} ({num(m['output_tok_s'])} tok/s): no trial is "
                    "measurably faster there")
    return Headline(num(value), str(point), trial.label, tail)


def _when(run: Any) -> str:
    started = run.data.tags.get(Tag.STARTED)
    if not started and run.info.start_time:
        started = datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M:%S")
    took = ""
    if run.info.start_time and run.info.end_time:
        secs = (run.info.end_time - run.info.start_time) / 1000
        took = f", took {secs:.0f} s" if secs < 120 else f", took {secs / 60:.1f} min"
    return f"{started or 'unknown start'}{took}"


def header(run: Any, parent: Any, trials: Sequence[Trial]) -> dict[str, Any]:
    tags = run.data.tags
    kind = tags.get(Tag.KIND, "?")
    if kind == RunKind.SWEEP:
        what = "Prediction sweep" if tags.get(Tag.MODE) == "prediction" else "Sweep"
        sub = f"{what} of {len(trials)} trial(s), status {tags.get(Tag.STATUS, '?')}"
    else:
        what = "Prediction" if kind == RunKind.PREDICTION else "Trial"
        sub = f"{what} {trials[0].label}, status {trials[0].status}"
        if parent is not None:
            sub += f", of sweep {parent.info.run_name or parent.info.run_id}"
    simulated, engine = engines(trials)
    banner = "sim" if simulated else ("meas" if any(t.tags.get(Tag.ENGINE) for t in trials) else "none")
    command = tags.get(Tag.COMMAND) or (parent.data.tags.get(Tag.COMMAND) if parent is not None else None)
    return {"what": what, "name": run.info.run_name or run.info.run_id, "sub": sub, "when": _when(run),
            "run_id": run.info.run_id, "banner": banner,
            "engine": engine if banner != "meas" else engine[0].upper() + engine[1:],
            "command": command, "headline": headline(trials)}


# -- the search ------------------------------------------------------------------------------------

def table(frame: Any, caption: str) -> dict[str, Any]:
    """A DataFrame as a caption, its column names and its rows of printed cells."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:,.1f}"
        return str(value)

    return {"caption": caption, "columns": [str(c) for c in frame.columns],
            "rows": [[cell(v) for v in row] for row in frame.itertuples(index=False)]}


def search(page: SearchPage | None) -> dict[str, Any] | None:
    if page is None:
        return None
    out: dict[str, Any] = {"source": page.source, "answer": page.answer, "pictures": page.pictures,
                           "counts": [], "tables": []}
    frame = page.candidates
    if frame is not None and not frame.empty:
        out["counts"] = [(str(k), int(n)) for k, n in frame["status"].value_counts().items()]
        ok = frame[frame["status"] == "ok"].sort_values("score", ascending=False).head(SEARCH_SHOWN)
        shown = [c for c in ok.columns if c not in SEARCH_HIDDEN]
        out["tables"].append(table(ok[shown], f"The best {len(ok)} candidates (predicted)"))
    if page.measured is not None and not page.measured.empty:
        out["tables"].append(table(page.measured,
                                   "Measured candidates: predicted against measured, per load"))
    return out


# -- configuration, results, placement -------------------------------------------------------------

def config(trials: Sequence[Trial]) -> dict[str, Any]:
    params = [t.run.data.params for t in trials if t.run.data.params]
    keys = sorted(set().union(*params)) if params else []
    varying = [k for k in keys if len({p.get(k) for p in params}) > 1]
    common = {k: params[0][k] for k in keys if k not in varying}
    many = len(trials) > 1 and bool(varying)
    return {
        "varying": varying if many else [],
        "rows": ([(t.label, [short(t.run.data.params.get(k, "–")) for k in varying]) for t in trials]
                 if many else []),
        "any_resolved": any(k.startswith("resolved.") for k in varying),
        "single": (trials[0].tags.get(Tag.OVERRIDES) if trials else None) or "nothing: one trial",
        "common": [(k, short(v)) for k, v in common.items()],
        "highlights": ", ".join(f"{k}={common[k]}" for k in COMMON_HIGHLIGHTS if k in common),
    }


def _pct(pred: float | None, meas: float | None) -> str:
    if pred is None or meas is None or not (math.isfinite(pred) and math.isfinite(meas)) or meas == 0:
        return ""
    return f" ({(pred - meas) / meas * 100:+.0f}%)"


def results(trials: Sequence[Trial]) -> dict[str, Any]:
    """The results table: one row per trial and point, the prediction beside the measurement, the
    throughput's 95 % interval where the window gave one."""
    with_pred = any(t.predicted for t in trials)
    with_energy = any("j_per_output_token" in m for t in trials for m in t.measured.values())
    head = ["trial", "status", "point", "output tok/s (±95 %)"]
    if with_pred:
        head.append("predicted tok/s (vs measured)")
    head += ["TTFT p99 ms", "ITL p99 ms", "window s"]
    if with_energy:
        head.append("J / output token")
    head.append("valid")
    rows = []
    for trial in trials:
        ok = trial.status in ("ok", "skipped")
        points = sorted(set(trial.measured) | set(trial.predicted))
        if not points:
            error = trial.tags.get(Tag.ERROR, "").strip().splitlines()
            rows.append({"label": trial.label, "status": trial.status, "ok": ok,
                         "missing": short(error[-1], 300) if error else "no load point finished"})
            continue
        for point in points:
            m, p = trial.measured.get(point, {}), trial.predicted.get(point, {})
            half = m.get("output_tok_s_ci95")
            tok = num(m.get("output_tok_s"))
            if half is not None and math.isfinite(half):
                tok += f" ±{num(half)}"
            cells = [tok]
            if with_pred:
                cells.append(num(p.get("output_tok_s")) + _pct(p.get("output_tok_s"), m.get("output_tok_s")))
            latencies = [(num(m.get(key), digits), num(p[key], digits) if key in p else "")
                         for key, digits in (("ttft_p99_ms", 1), ("itl_p99_ms", 2))]
            window = num(m.get("window_s"), 1)
            if m.get("window_steady") == 0.0:
                window += " (no steady state)"
            rows.append({"label": trial.label, "status": trial.status, "ok": ok, "missing": None,
                         "point": str(point), "cells": cells, "latencies": latencies, "window": window,
                         "energy": num(m.get("j_per_output_token"), 3) if with_energy else None,
                         "valid": m.get("valid")})
    return {"head": head, "rows": rows, "with_pred": with_pred,
            "all_predictions": all(t.is_prediction for t in trials),
            "any_invalid": any(m.get("valid", 1.0) != 1.0 for t in trials for m in t.measured.values())}


def by_length(trials: Sequence[Trial]) -> dict[str, Any] | None:
    """TTFT per prompt-length class where a point's lengths varied (None: no point's did)."""
    rows = class_rows([(t.label, t.run.data.metrics) for t in trials])
    if not rows:
        return None
    classes = [c for c in CLASSES if any(c == cls for r in rows for cls, *_ in r.classes)]
    body = []
    for r in rows:
        per = {cls: (n, p50, p99) for cls, n, p50, p99 in r.classes}
        body.append({"point": r.point, "trial": r.trial,
                     "cells": [f"{num(per[c][1], 0)} / {num(per[c][2], 0)} (n={per[c][0]})"
                               if c in per else "–" for c in classes]})
    return {"classes": classes, "rows": body}


def placement(trials: Sequence[Trial]) -> list[list[str]]:
    """Where each trial ran: host, Ray node, the GPUs Ray gave it and their NVML UUIDs."""
    return [[t.label, t.tags.get(Tag.HOST, ""), t.tags.get(Tag.RAY_NODE_ID, ""),
             t.tags.get(Tag.CUDA_VISIBLE_DEVICES, ""), t.tags.get(Tag.GPU_UUIDS, "")]
            for t in trials if t.tags.get(Tag.HOST)]


# -- findings --------------------------------------------------------------------------------------

def _overrides(change: Any) -> str:
    """The change as the overrides a user types (as the terminal summary writes it)."""
    return overrides_text(change) if isinstance(change, Mapping) and change else "no change"


def effect_text(effect: Any) -> str:
    """One line: the verdict, what was predicted where, and the relative changes."""
    if not isinstance(effect, Mapping):
        return ""
    verdict = str(effect.get("verdict", "?"))
    where = str(effect.get("point", ""))
    if effect.get("predicted_at") and effect.get("predicted_at") != effect.get("point"):
        where += f" → {effect['predicted_at']}"
    pct = effect.get("change_pct") or {}
    names = {"output_tok_s": "tok/s", "ttft_p99_ms": "TTFT p99", "itl_p99_ms": "ITL p99"}
    changes = ", ".join(f"{names.get(k, k)} {v:+.0f}%" for k, v in pct.items()
                        if isinstance(v, int | float) and math.isfinite(v))
    text = f"predicted effect of {_overrides(effect.get('change'))}"
    text += f" at {where}" if where else ""
    text += f": {verdict}" + (f" ({changes})" if changes else "")
    if effect.get("goal") in names:  # a latency finding's change is judged on that latency
        text += f", judged on {names[effect['goal']]}"
    instead = effect.get("instead_of")
    if isinstance(instead, Mapping):
        text += f"; chosen instead of {_overrides(instead.get('change'))} ({instead.get('verdict', '?')})"
    runner = effect.get("runner_up")
    if isinstance(runner, Mapping):
        behind = behind_text(dict(runner), effect.get("goal"))
        text += f"; runner-up {_overrides(runner.get('change'))} ({behind})"
    own = effect.get("own")
    if isinstance(own, Mapping):
        text += f"; the finding's own best: {_overrides(own.get('change'))} ({own.get('verdict', '?')})"
    load = load_text(effect.get("load"))
    if load:
        text += f"; more load, not a fix: {load}"
    tried = effect.get("tried")
    if isinstance(tried, list) and tried and "change_pct" not in effect:  # nothing helped: each one
        text += "; tried: " + "; ".join(f"{_overrides(t.get('change'))} ({t.get('verdict', '?')})"
                                        for t in tried if isinstance(t, Mapping))
    elif isinstance(tried, list) and tried:
        text += f"; {len(tried)} changes tried (each in diagnosis.json)"
    if effect.get("source"):
        text += f" [{effect['source']}]"
    return text


def _one_or_each(pairs: list[tuple[str, str]]) -> tuple[str, list[tuple[str, str]]]:
    """One text when every trial says the same, else each trial's (label, text)."""
    distinct = list(dict.fromkeys(text for _label, text in pairs))
    return (distinct[0], []) if len(distinct) == 1 else ("", pairs)


def findings(trials: Sequence[Trial]) -> dict[str, Any]:
    """Merged as the terminal summary merges them: by id and load point (``report.merge_findings``)."""
    merged = merge_findings([(i, list(t.findings or [])) for i, t in enumerate(trials)])
    items = []
    for m in merged:
        # each trial's first finding with that key, as merge_findings counted it
        members = [(trials[i], next(f for f in trials[i].findings or [] if finding_key(f) == (m.id, m.point)))
                   for i in m.trials]
        if len(trials) > 1 and len(m.trials) == len(trials):
            scope = f"all {len(trials)} trials"
        elif len(trials) > 1:
            scope = ", ".join(dict.fromkeys(t.label for t, _f in members))
        else:
            scope = ""
        title = merge_texts(m.titles, members[0][0].label)
        item: dict[str, Any] = {"severity": m.severity, "id": m.id,
                                "title": f"{scope}: {title}" if scope else title, "fields": []}
        for field_name, label in (("evidence", "Evidence"), ("suggestion", "Suggestion")):
            pairs = [(t.label, str(f.get(field_name))) for t, f in members if f.get(field_name)]
            if pairs:
                one, each = _one_or_each(pairs)
                item["fields"].append((label, one, each))
        effects = [(t.label, effect_text(f.get("predicted_effect"))) for t, f in members]
        effects = [(label, e) for label, e in effects if e]
        item["effect"], item["effects"] = _one_or_each(effects) if effects else ("", [])
        items.append(item)
    return {"items": items, "recorded": any(t.findings is not None for t in trials)}


def instead(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sweep's "run this instead": its lines as the terminal prints them, and its command lines."""
    lines = instead_lines(dict(answer), width=10_000)
    if not lines:
        return None
    r = answer.get("recommend") or {}
    commands = [(label, r[key]) for key, label in (("run_py", "parasweep"),
                                                   ("vllm", f"vLLM as parasweep would launch it "
                                                            f"({r.get('vllm_release')}'s flags, random "
                                                            "weights, no tokenizer)"),
                                                   ("sglang", "SGLang as parasweep measures it (0.5.23's "
                                                              "flags, random weights, no tokenizer)"),
                                                   ("sglang_weights", "SGLang serving the real model"))
                if r.get(key)]
    return {"headline": lines[0], "lines": lines[1:], "commands": commands}


# -- telemetry pictures and where the data is ------------------------------------------------------

def telemetry(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    out = []
    for trial in trials:
        if not trial.pictures:
            continue
        note = trial.tags.get(Tag.GPU_TELEMETRY_NOTE) or trial.tags.get(Tag.GPU_TELEMETRY) or ""
        out.append({"label": trial.label, "source": telemetry_words([trial]) if note else "", "note": note,
                    "pictures": [(f"{trial.label}: {caption}", uri) for caption, uri in trial.pictures]})
    return out


def where(run: Any, trials: Sequence[Trial], uri: str, experiment: str) -> dict[str, Any]:
    return {"store": masked(uri), "experiment": experiment, "experiment_id": run.info.experiment_id,
            "run_id": run.info.run_id, "run_name": run.info.run_name or "",
            "sweep_dir": run.data.tags.get(Tag.SWEEP_DIR),
            "is_sweep": run.data.tags.get(Tag.KIND) == RunKind.SWEEP,
            "trials": [(t.label, t.status, t.run.info.run_id, t.tags.get(Tag.TRIAL_DIR, "–"))
                       for t in trials]}
