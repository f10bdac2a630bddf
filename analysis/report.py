"""The end of a sweep in the terminal, read back from the MLflow store (so what is printed is what
landed), for a reader who has never seen parasweep before, within 100 columns:

1. a header naming the engine and why it was chosen (a simulated number is never read as measured);
2. one table, one section per load point and one row per trial in it: tok/s with the simulator's
   prediction in brackets, TTFT p99, ITL p99 and J per output token, the best of each column at that
   point marked ``*``. Sections by point (not by trial) put the numbers to compare under each other;
3. the findings that matter: every trial's ``diagnosis.json``, merged by finding id and load point
   across trials, each with its suggested change and that change's predicted effect, the runner-up,
   and apart from them the load the configuration needs, critical first;
4. what to run instead, when a configuration of the same GPUs the sweep did not run is predicted
   better than every trial at its loads (``instead_lines``; computed by the orchestrator).
"""

from __future__ import annotations

import json
import logging
import math
import re
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from analysis.by_length import class_lines, class_rows
from analysis.diagnose import overrides_text
from analysis.differences import Seen, check_predicted, gaps_beyond_noise
from analysis.noise import NAN, Estimate, judge, point_estimate
from analysis.prefix_reuse import reuse_lines
from analysis.repeats import combine_repeats, repeats_of
from vocab.findings import SEVERITIES
from vocab.metric_keys import MetricKey, point_metrics
from vocab.status import PLAYS, Tag
from vocab.telemetry import J_PER_TOKEN, GpuSource

log = logging.getLogger("parasweep")

MAX_WIDTH = 100  # the widest line printed: a README, a CI log and an 80-100 column terminal all hold it
MAX_FINDINGS = 5  # more is a wall of text; the rest are one command away (the report, diagnosis.json)
# Findings the summary does not repeat: a failed trial's reason is printed on its own line already
NOT_REPEATED = ("trial_failed",)
LATENCIES = (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99"))  # as a finding's effect names them
# after a predicted tok/s: the point ran its whole virtual-time budget before its numbers were known
BUDGET_MARK = "†"


def points_from_metrics(metrics: dict[str, float]) -> dict[int, dict[str, float]]:
    """``{"c8/output_tok_s": x}`` -> ``{8: {"output_tok_s": x}}`` (closed-loop points only)."""
    return {label.concurrency: values for label, values in point_metrics(metrics).items()
            if label.concurrency is not None}


def point_labels(runs: list[Any]) -> list[str]:
    """Every load point with a measured throughput in any of the runs, closed loop first, by load."""
    labels = set()
    for run in runs:
        for key in run.data.metrics:
            parsed = MetricKey.parse(key)
            if parsed and parsed.point and not parsed.prefix and parsed.metric == "output_tok_s":
                labels.add(parsed.point)
    return [str(label) for label in sorted(labels)]


def summary_width(console: Console) -> int:
    """The width to print at: the terminal's, at most :data:`MAX_WIDTH`."""
    return min(console.width, MAX_WIDTH)


# -- 1. the engine --------------------------------------------------------------------------------

def engine_lines(runs: list[Any]) -> list[str]:
    """One line per engine the trials ran on, with the reason it was chosen, saying plainly whether
    the numbers are measurements or the simulator's."""
    by_engine: dict[str, list[Any]] = {}
    for run in _ordered(runs):
        by_engine.setdefault(run.data.tags.get(Tag.ENGINE, "unknown"), []).append(run)
    lines = []
    for engine, group in by_engine.items():
        reasons = sorted({r.data.tags.get(Tag.ENGINE_REASON, "") for r in group} - {""})
        why = f" ({'; '.join(reasons)})" if reasons else ""
        who = "" if len(by_engine) == 1 else f"{_who([_num(r) for r in group], len(runs))}: "
        if engine == "sim-predict":
            text = f"Simulated engine in virtual time{why}: the simulator's predictions, not measured"
        elif engine in PLAYS:
            # SGLang is what the simulated engine plays unless said otherwise (a line stays within the
            # summary's width); another engine is named with the release it plays, where the tag names
            # one ("parasweep-sim playing vllm 0.34.0")
            versions = sorted({r.data.tags.get(Tag.ENGINE_VERSION, "") for r in group} - {""})
            shown = sorted({v.rsplit(" ", 1)[-1] for v in versions if " playing " in v})
            plays = ("" if PLAYS[engine] == "sglang"
                     else " playing vLLM" + (f" {', '.join(shown)}" if shown else ""))
            text = f"Simulated engine{plays}{why}: the simulator's numbers, not measured"
        else:  # a real engine measured them; a run without the tag says nothing it cannot back
            versions = sorted({r.data.tags.get(Tag.ENGINE_VERSION, "") for r in group} - {"", "unknown"})
            text = f"Engine {engine} {', '.join(versions)}".rstrip() + why
            text += ": measured" if engine in ("sglang", "vllm") else ""
        lines.append(f"{who}{text}")
        if engine in PLAYS and (pace := _pace(group)):
            lines += textwrap.wrap(pace, MAX_WIDTH, initial_indent="    ", subsequent_indent="    ")
    costs = sorted({r.data.tags.get(Tag.STEP_COSTS, "") for r in runs} - {""})
    if costs:  # what priced the simulator's numbers and predictions
        lines += textwrap.wrap(f"Step costs: {'; '.join(costs)}", MAX_WIDTH, subsequent_indent="    ")
    errors = sorted({r.data.tags.get(Tag.PREDICTION_ERROR, "") for r in runs} - {""})
    if errors:  # how far such predictions are from published measurements
        lines += textwrap.wrap(f"The model's error on published runs like these: {'; '.join(errors)} "
                               "(python -m orchestrator fidelity)", MAX_WIDTH, subsequent_indent="    ")
    return lines


def _pace(runs: list[Any]) -> str:
    """How fast simulated trials were played, when not in real time: their times and rates are still
    the engine's own (measured on its clock), which the line says."""
    scales = sorted({r.data.tags.get(Tag.SIM_TIME_SCALE, "") for r in runs} - {""}, key=float)
    if not scales:
        return ""
    return (f"played at {'/'.join(scales)}x real time (engine.time_scale) and timed on its own clock: "
            "every time and rate is in the engine's seconds")


# -- 2. the table ---------------------------------------------------------------------------------

@dataclass
class _Cell:
    """One measured value, whether it may be marked best (a valid point of a trial that ran), and
    the text that follows it (the prediction in brackets)."""

    value: float | None
    eligible: bool
    text: str = ""
    after: str = ""
    estimate: Estimate = field(default_factory=lambda: Estimate(NAN))
    predicted: Estimate | None = None  # the model's value for the same point (``pred/``), if logged


@dataclass
class _Column:
    header: str
    metric: str
    lower_is_better: bool
    fmt: str
    cells: dict[str, list[_Cell]] = field(default_factory=dict)  # per point label, one per trial


def _fmt(value: float | None, fmt: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    if fmt == "energy":  # J/token spans 0.05 (a full H100) to 50 (a lone request on eight GPUs)
        return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return fmt.format(value)


def _energy_source(run: Any) -> str:
    return run.data.tags.get(Tag.GPU_TELEMETRY, GpuSource.NONE.value)


def sweep_table(runs: list[Any]) -> tuple[Table, list[str]]:
    """The table and its footnotes (what the marks mean). Repeats of one configuration are one row: the
    median of each number, judged by the repeats' 95 % interval (:mod:`analysis.repeats`)."""
    repeated = repeats_of(runs) > 1
    runs = _ordered(combine_repeats(runs))
    labels = point_labels(runs) or [""]
    with_pred = any(point_metrics(r.data.metrics, "pred") for r in runs)
    # J/token only where a source wrote it; a simulated one is labelled so (decision: shown, because
    # the simulated engine's tok/s beside it is as simulated, and the header says so; hiding it
    # would hide the column a GPU run will fill)
    energy_sources = {_energy_source(r) for r in runs
                      if any(J_PER_TOKEN in m for m in point_metrics(r.data.metrics).values())}
    energy_sources &= {GpuSource.NVML.value, GpuSource.SIMULATED.value}
    columns = [_Column("tok/s (pred)" if with_pred else "tok/s", "output_tok_s", False, "{:.1f}"),
               _Column("TTFT p99 ms", "ttft_p99_ms", True, "{:.0f}"),
               _Column("ITL p99 ms", "itl_p99_ms", True, "{:.1f}")]
    if energy_sources:
        simulated_only = energy_sources == {GpuSource.SIMULATED.value}
        columns.append(_Column("J/tok (sim)" if simulated_only else "J/tok", J_PER_TOKEN, True, "energy"))
    notes: list[str] = []
    invalid = budget = False
    for run in runs:
        measured = {str(k): v for k, v in point_metrics(run.data.metrics).items()}
        predicted = {str(k): v for k, v in point_metrics(run.data.metrics, "pred").items()}
        ok = run.data.tags.get(Tag.STATUS) in ("ok", "skipped")
        for label in labels:
            m = measured.get(label, {})
            valid = m.get("valid", 1.0) == 1.0
            invalid |= not valid and bool(m)
            for col in columns:
                value = m.get(col.metric)
                if col.metric == J_PER_TOKEN and _energy_source(run) not in energy_sources:
                    value = None  # no source: not a number to print
                text = _fmt(value, col.fmt)
                # compared as printed: a difference in the fourth digit is no "best"
                cell = _Cell(None if text == "-" else float(text), ok and valid and text != "-", text,
                             estimate=point_estimate(m, col.metric))
                if col.metric == J_PER_TOKEN and value is not None and len(energy_sources) > 1 \
                        and _energy_source(run) == GpuSource.SIMULATED:
                    cell.text = "~" + cell.text
                if not valid and value is not None:
                    cell.text += "!"
                if col.metric == "output_tok_s" and m.get("budget_hit") == 1.0 and value is not None:
                    cell.text += BUDGET_MARK  # a predicted point stopped by its budget, not its target
                    budget = True
                if col.metric == "output_tok_s" and "output_tok_s" in predicted.get(label, {}):
                    cell.after = f" ({_fmt(predicted[label]['output_tok_s'], col.fmt)})"
                    cell.predicted = point_estimate(predicted[label], "output_tok_s")
                col.cells.setdefault(label, []).append(cell)
    marked = False
    unclear: dict[str, list[str]] = {}  # point -> the columns whose best is within noise
    for col in columns:
        for label, cells in col.cells.items():
            mark, noise = _mark_best(cells, col.lower_is_better)
            marked |= mark
            if noise:
                unclear.setdefault(label, []).append(f"{col.header.split(' (')[0]} {noise}")

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column("point", no_wrap=True)
    table.add_column("trial", overflow="fold")
    table.add_column("status", no_wrap=True)
    for col in columns:
        table.add_column(col.header, justify="right", no_wrap=True)
    for label in labels:
        for i, run in enumerate(runs):
            status = run.data.tags.get(Tag.STATUS, "?")
            style = {"ok": "green", "failed": "red", "killed": "yellow"}.get(status, "")
            row = [Text(label if i == 0 else ""), Text(_trial_label(run)), Text(status, style=style)]
            for col in columns:
                cell = col.cells[label][i]
                row.append(Text.assemble((cell.text, "bold" if cell.text.endswith("*") else ""), cell.after))
            table.add_row(*row, end_section=i == len(runs) - 1)
    if marked:
        notes.append("* best of the trials at that load point, beyond the noise of both (95 % intervals)")
    names = [f"#{_num(run)}" for run in runs]
    for label in labels:
        if label in unclear:
            notes.append(f"{label}: within noise, no trial marked: " + "; ".join(unclear[label]))
        # which trials differ at all, in throughput: the question most sweeps are run to answer
        notes.extend(_gap_notes(label, names, columns[0].cells[label]))
    if repeated:
        notes.append("×N = N repeats, each on a fresh engine: the median, judged by the 95 % interval of "
                     "their mean")
    if with_pred:
        notes.append("(pred) = the simulator's prediction for the same configuration")
    if energy_sources and energy_sources != {GpuSource.NVML.value}:
        notes.append("J/tok from simulated GPU telemetry is the simulator's power model, not measured"
                     + (" (~ marks it)" if len(energy_sources) > 1 else ""))
    if budget:
        notes.append(f"{BUDGET_MARK} = predicted point stopped by its virtual-time budget "
                     "(workload.predicted.budget_s) before its numbers were known to their targets")
    if invalid:
        notes.append("! = not a valid measurement (valid=0: the client fell behind, or the point was cut "
                     "short): see the findings")
    return table, notes


def _mark_best(cells: list[_Cell], lower_is_better: bool) -> tuple[bool, str]:
    """Append ``*`` to the best eligible value (ties: all of them), a space to the others so numbers
    stay aligned, when it beats the runner-up beyond the noise of both (:mod:`analysis.noise`).
    Returns whether it marked, and the noise (``±x %``) when two values or more could be told apart
    and noise could explain their difference (equal values: within any noise)."""
    eligible = [c for c in cells if c.eligible and c.value is not None]
    values = [c.value for c in eligible]
    if len(values) < 2:
        return False, ""
    verdict = judge([c.estimate for c in eligible], lower_is_better)
    if verdict is None or not verdict.clear or len(set(values)) == 1:
        return False, verdict.noise() if verdict is not None else ""
    best = min(values) if lower_is_better else max(values)  # type: ignore[type-var]
    for c in cells:
        c.text += "*" if c.eligible and c.value == best else ("" if c.text.endswith("!") else " ")
    return True, ""


def _gap_notes(label: str, names: list[str], cells: list[_Cell], most: int = 4) -> list[str]:
    """Which trials' throughputs at ``label`` differ beyond noise and, where the model's predictions
    are logged beside them, what became of the gaps it predicted (:mod:`analysis.differences`)."""
    measured = [c.estimate if c.eligible and c.value is not None else None for c in cells]
    if sum(e is not None for e in measured) < 2:
        return []

    def listed(items: list[str]) -> str:
        return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")

    gaps = gaps_beyond_noise(measured)
    lines = [f"{label} tok/s apart beyond noise: "
             + listed([f"{names[g.ahead]} > {names[g.behind]} {_pct(g.rel)}" for g in gaps])
             + "; the other pairs within it" if gaps else f"{label} tok/s: no two trials apart beyond noise"]
    # a prediction without its interval (logged before they were) cannot say what it puts apart
    predicted = [c.predicted if m is not None and c.predicted is not None
                 and math.isfinite(c.predicted.half_width) else None
                 for c, m in zip(cells, measured, strict=True)]
    if sum(p is not None for p in predicted) < 2:
        return lines
    checked = check_predicted(measured, predicted)
    if not checked:
        return [*lines, f"{label} tok/s: the model predicts no gap beyond its noise between these trials"]
    return [*lines, f"{label} tok/s, the model's gaps: " + listed([
        f"{names[c.predicted.ahead]} > {names[c.predicted.behind]} {_pct(c.predicted.rel)} {c.seen.value}"
        + ("" if c.seen is Seen.CONFIRMED else f" (measured {_pct(c.measured_rel)} {_noise(c.noise_rel)})")
        for c in checked])]


def _pct(rel: float) -> str:
    """A signed percentage, whole above 1 %, to one significant figure below."""
    pct = rel * 100
    return f"{pct:+.0f} %" if abs(pct) >= 1 or not math.isfinite(pct) else f"{pct:+.1g} %"


def _noise(rel: float) -> str:
    return f"±{_pct(rel)[1:]}" if math.isfinite(rel) else "noise unknown"


def _trial_label(run: Any) -> str:
    return f"#{_num(run)} {run.data.tags.get(Tag.OVERRIDES, '') or 'defaults'}"


def _num(run: Any) -> int:
    try:
        return int(run.data.tags.get(Tag.TRIAL_NUM, 0))
    except ValueError:
        return 0


def _ordered(runs: list[Any]) -> list[Any]:
    return sorted(runs, key=_num)


def where_lines(runs: list[Any]) -> list[str]:
    """Where the trials ran (host, Ray node, GPU UUIDs: the trial's ``parasweep.host`` and kin): one
    line when all ran on one node, else one per trial; nothing for runs that recorded no place (a
    prediction, a reused trial, a run from before these tags)."""
    placed = [(run, run.data.tags.get(Tag.HOST)) for run in _ordered(runs)]
    placed = [(run, host) for run, host in placed if host]
    if not placed:
        return []

    def node(run: Any) -> str:
        return short_node(run.data.tags.get(Tag.RAY_NODE_ID, "?"))

    def gpus(run: Any) -> str:
        return short_uuids(run.data.tags.get(Tag.GPU_UUIDS, "?"))

    nodes = {(host, node(run)) for run, host in placed}
    uuids = {gpus(run) for run, _ in placed}
    shared = uuids.pop() if len(uuids) == 1 else None  # e.g. every trial on the simulated engine
    if len(nodes) == 1:
        host, where = next(iter(nodes))
        return [f"Where: every trial on host {host}, Ray node {where}"
                + (f"; GPUs {shared}" if shared else "")]
    lines = [f"Where: {_trial_label(run)} on host {host}, Ray node {node(run)}"
             + ("" if shared else f"; GPUs {gpus(run)}") for run, host in placed]
    return lines + ([f"Where: GPUs of every trial: {shared}"] if shared else [])


def short_node(node_id: str) -> str:
    """A Ray node id (56 hex digits) as its first 8, as Ray's own tools abbreviate it; a trial across
    nodes has one per node, comma-separated."""
    if " " in node_id:  # a reason, not an id
        return node_id
    return ",".join(one[:8] if len(one) > 16 else one for one in node_id.split(","))


def short_uuids(uuids: str) -> str:
    """NVML UUIDs (``GPU-8f0c1d2e-...``) as ``GPU-8f0c1d2e``, comma-separated; a reason as it is."""
    if not uuids.startswith("GPU-"):
        return uuids
    return ",".join(u.strip()[:12] for u in uuids.split(","))


# -- 3. the findings ------------------------------------------------------------------------------

def load_findings(run: Any, tracking_uri: str | None) -> list[dict[str, Any]]:
    """A trial's ``diagnosis.json``: from its directory when this machine has it, else downloaded
    from the run's artifacts in ``tracking_uri`` (None: not looked for, so no default store is ever
    created). Empty when there is none or it cannot be read."""
    trial_dir = run.data.tags.get(Tag.TRIAL_DIR)
    try:
        local = Path(trial_dir) / "diagnosis.json" if trial_dir else None
        if local is not None and local.is_file():
            return list(json.loads(local.read_text()))
        if tracking_uri is None:
            return []
        from mlflow.tracking import MlflowClient

        with tempfile.TemporaryDirectory() as tmp:
            path = MlflowClient(tracking_uri).download_artifacts(run.info.run_id, "diagnosis.json", tmp)
            return list(json.loads(Path(path).read_text()))
    except Exception:  # a trial without a diagnosis (it never got that far) is not an error here
        log.debug("no diagnosis.json for run %s", run.info.run_id, exc_info=True)
        return []


@dataclass
class MergedFinding:
    """One finding id at one load point, as seen by every trial that reported it."""

    id: str
    point: str
    severity: str
    trials: list[int]
    titles: list[str]
    advice: list[str]  # one line per trial: the change and its predicted effect
    changes: list[str]  # per trial: the change suggested in the end, as overrides
    loads: list[str] = field(default_factory=list)  # per trial: the load it needs ("" when none)

    @property
    def rank(self) -> tuple[int, int]:
        return (-SEVERITIES.index(self.severity) if self.severity in SEVERITIES else 0, -len(self.trials))


def finding_key(finding: dict[str, Any]) -> tuple[str, str]:
    """What makes two trials' findings one: the same id at the same load point (the terminal summary
    and the HTML report merge by it)."""
    return str(finding.get("id")), str(finding.get("point", ""))


def merge_findings(per_run: list[tuple[int, list[dict[str, Any]]]]) -> list[MergedFinding]:
    """``[(trial number, findings)]`` -> findings merged by id and point, critical first, then by the
    number of trials reporting them."""
    merged: dict[tuple[str, str], MergedFinding] = {}
    for num, findings in per_run:
        for f in findings:
            if f.get("id") in NOT_REPEATED:
                continue
            key = finding_key(f)
            m = merged.setdefault(key, MergedFinding(key[0], key[1], "info", [], [], [], []))
            if num not in m.trials:
                m.trials.append(num)
                m.titles.append(str(f.get("title", key[0])))
                m.advice.append(advice_text(f))
                effect = f.get("predicted_effect") or {}
                m.changes.append(overrides_text(effect.get("change") or f.get("change") or {}))
                m.loads.append(load_text(effect.get("load")))
            severity = str(f.get("severity", "info"))
            if severity in SEVERITIES and SEVERITIES.index(severity) > SEVERITIES.index(m.severity):
                m.severity = severity
    return sorted(merged.values(), key=lambda m: m.rank)


def advice_text(finding: dict[str, Any]) -> str:
    """The suggestion in one line: the change, what the simulator predicts it does, and the runner-up."""
    effect = finding.get("predicted_effect") or {}
    change = finding.get("change") or {}
    if "change_pct" in effect:
        text = f"set {overrides_text(effect.get('change') or change)}: predicted {_effect_numbers(effect)}"
        runner = effect.get("runner_up")
        if isinstance(runner, dict) and runner.get("change"):
            behind = behind_text(runner, effect.get("goal"))
            text += f"; runner-up {overrides_text(runner['change'])} ({behind})"
        instead = effect.get("instead_of")
        if instead:
            # "would not help" only when it would not: a trade-off says what it trades, a change that
            # cannot run (or is not modelled) says so, its reason in the trial's diagnosis.json
            said = str(instead.get("verdict", ""))
            first = (f"is a trade-off ({_effect_numbers(instead)})" if said == "trade-off"
                     and "change_pct" in instead
                     else f"is {said.split(':', 1)[0]}" if said.startswith(("not possible", "not predicted"))
                     else "would not help")
            text = f"{overrides_text(instead.get('change', {}))} {first}; instead {text}"
        return text
    verdict = str(effect.get("verdict", ""))
    if verdict == "nothing tried helps":
        tried = effect.get("tried", [])
        names = ", ".join(overrides_text(e.get("change", {})) for e in tried[:3])
        names += ", …" if len(tried) > 3 else ""
        text = "no change tried is predicted to help" + (f" ({len(tried)} tried: {names})" if tried else "")
        trade = effect.get("best_trade_off")
        if isinstance(trade, dict) and "change_pct" in trade:
            trade_off = overrides_text(trade.get("change", {}))
            text += f"; the best trade-off: {trade_off} ({_effect_numbers(trade)})"
        return text
    if change:
        return f"set {overrides_text(change)}" + (f" (prediction: {verdict})" if verdict else "")
    # no change to predict (the measurement itself, or advice that is not a config change)
    suggestion = str(finding.get("suggestion", "")).strip()
    return suggestion.split(". ")[0].rstrip(".") if suggestion else "see the trial's diagnosis.json"


def behind_text(runner: dict[str, Any], goal: str | None) -> str:
    """How far a runner-up is behind the best: ``11% fewer tok/s, within noise``, or on a latency goal
    ``ITL p99 +40% against the best``."""
    behind = runner.get("behind_pct", NAN)
    if not isinstance(behind, int | float) or not math.isfinite(behind):
        return "behind"
    name = dict(LATENCIES).get(goal or "")
    how = (f"{name} {behind:+.0f}% against the best" if name
           else f"{-behind:.0f}% more tok/s, inside the model's error" if behind < 0
           else f"{behind:.0f}% fewer tok/s")
    return how + (", within noise" if runner.get("within_noise") else "")


def load_text(load: Any) -> str:
    """The load a finding's configuration needs, apart from the fix: ``at c64 this configuration is
    predicted at 227 tok/s (+42%), TTFT p99 +107%`` ("" when the finding names none)."""
    if not isinstance(load, dict) or "change_pct" not in load:
        return ""
    p, pct = load.get("predicted", {}), load["change_pct"]
    lat = "".join(f", {name} {pct[k]:+.0f}%" for k, name in LATENCIES if k in pct)
    return (f"at {load.get('predicted_at')} this configuration is predicted at "
            f"{p.get('output_tok_s', NAN):.0f} tok/s ({pct.get('output_tok_s', 0.0):+.0f}%){lat}")


def _effect_numbers(effect: dict[str, Any]) -> str:
    """``91 → 245 tok/s (+168%), TTFT p99 -38%, ITL p99 +43%`` (a latency only when it moves 10 %)."""
    b, p, pct = effect.get("baseline", {}), effect.get("predicted", {}), effect["change_pct"]
    parts = []
    if "output_tok_s" in b and "output_tok_s" in p:
        parts.append(f"{b['output_tok_s']:.0f} → {p['output_tok_s']:.0f} tok/s "
                     f"({pct.get('output_tok_s', 0.0):+.0f}%)")
    parts += [f"{name} {pct[k]:+.0f}%" for k, name in (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99"))
              if k in pct and abs(pct[k]) >= 10]
    text = ", ".join(parts)
    at = effect.get("predicted_at")
    text += f" at {at}" if at and at != effect.get("point") else ""
    band = effect.get("model_error_pct")
    if isinstance(band, int | float) and "output_tok_s" in pct and abs(pct["output_tok_s"]) < band \
            and effect.get("goal", "throughput") == "throughput":
        text += f", inside the model's ±{band:.0f} % error"
    return text


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def merge_texts(texts: list[str], first: str = "the first", max_ranges: int = 3) -> str:
    """Texts that differ only in up to ``max_ranges`` of their numbers become one text with ranges
    (``idle 79–86%``); texts that differ otherwise: the first one, saying first whose it is (``first``), so
    that a text cut short for width still says it is one of several."""
    distinct = list(dict.fromkeys(texts))
    if len(distinct) == 1:
        return distinct[0]
    skeletons = {_NUMBER.sub("#", t) for t in distinct}
    numbers = [_NUMBER.findall(t) for t in distinct]
    if len(skeletons) == 1 and sum(len(set(slot)) > 1 for slot in zip(*numbers, strict=True)) <= max_ranges:
        pieces = _NUMBER.split(distinct[0])
        out = [pieces[0]]
        for i, piece in enumerate(pieces[1:]):
            values = [n[i] for n in numbers]
            low, high = min(values, key=float), max(values, key=float)
            # "+167–168%", not "+167–+168%"
            out.append(low if low == high else f"{low}–{high.lstrip('+') if low.startswith('+') else high}")
            out.append(piece)
        return "".join(out)
    return f"({first}; others differ) {distinct[0]}"


def finding_lines(merged: list[MergedFinding], n_trials: int, width: int = MAX_WIDTH) -> list[str]:
    """At most :data:`MAX_FINDINGS` findings, each as a line saying who and what, then ``→`` the
    change and its predicted effect, wrapped to ``width``."""
    lines: list[str] = []
    shown: set[str] = set()  # advice already printed
    for m in merged[:MAX_FINDINGS]:
        head = f"{m.severity.upper() if m.severity == 'critical' else m.severity}: " \
               f"{_who(m.trials, n_trials)}: {merge_texts(m.titles, f'trial #{m.trials[0]}')}"
        lines += textwrap.wrap(head, width, subsequent_indent="    ")
        advice = merge_texts(m.advice, f"trial #{m.trials[0]}")
        text = f"the same change as above: {merge_texts(m.changes)}" if advice in shown else advice
        shown.add(advice)
        lines += textwrap.wrap(f"→ {text}", width, initial_indent="  ", subsequent_indent="    ",
                               max_lines=3, placeholder=" …")
        loads = [x for x in m.loads if x]
        load = merge_texts(loads, f"trial #{m.trials[0]}") if loads else ""
        if load and load not in shown:
            shown.add(load)
            lines += textwrap.wrap(f"more load, not a fix: {load}", width, initial_indent="    ",
                                   subsequent_indent="      ", max_lines=2, placeholder=" …")
    if len(merged) > MAX_FINDINGS:
        lines.append(f"... {len(merged) - MAX_FINDINGS} more: each trial's diagnosis.json, or the report")
    return lines


def _who(trials: list[int], n_trials: int) -> str:
    if n_trials > 1 and len(trials) == n_trials:
        return f"all {n_trials} trials"
    nums = ", ".join(f"#{n}" for n in sorted(trials))
    return f"trial{'s' if len(trials) > 1 else ''} {nums}"


# -- all of it ------------------------------------------------------------------------------------

def print_sweep_summary(runs: list[Any], title: str, console: Console | None = None,
                        tracking_uri: str | None = None) -> None:
    """Header, table with its notes, then the merged findings, within the console's width (at most
    :data:`MAX_WIDTH`)."""
    console = console or Console(width=MAX_WIDTH)
    width = summary_width(console)
    console.print(title, highlight=False, markup=False, width=width)
    for line in engine_lines(runs):
        console.print(line, highlight=False, markup=False, width=width,
                      style="bold" if "Simulated" in line else "")
    if not runs:
        return
    table, notes = sweep_table(runs)
    console.print(table, width=width)
    for note in notes:
        console.print(note, highlight=False, markup=False, width=width, style="dim")
    for line in where_lines(runs):
        console.print(line, highlight=False, markup=False, width=width, style="dim")
    for line in class_lines(class_rows([(f"#{_num(r)}", r.data.metrics) for r in _ordered(runs)]), width):
        console.print(line, highlight=False, markup=False, width=width)
    for line in reuse_lines([(f"#{_num(r)}", r.data.metrics) for r in _ordered(runs)], width):
        console.print(line, highlight=False, markup=False, width=width)
    for run in _ordered(runs):
        if run.data.tags.get(Tag.STATUS) not in ("ok", "skipped"):
            reason = (run.data.tags.get(Tag.ERROR) or "").strip().splitlines()
            console.print(Text.assemble((run.data.tags.get(Tag.STATUS, "?"), "red"), f" {_trial_label(run)}: "
                                        f"{reason[-1] if reason else 'no reason recorded'}"), width=width)
    merged = merge_findings([(_num(r), load_findings(r, tracking_uri)) for r in _ordered(runs)])
    if merged:
        console.print()
        console.print("Findings (each trial's diagnosis.json; effects predicted by the simulated engine):",
                      highlight=False, markup=False, width=width, style="bold")
        for line in finding_lines(merged, len(runs), width):
            style = "red" if line.startswith("CRITICAL") else "yellow" if line.startswith("warning") else ""
            console.print(line, highlight=False, markup=False, width=width, style=style)


# -- 4. what to run instead ----------------------------------------------------------------------

def instead_lines(answer: dict[str, Any], width: int = MAX_WIDTH) -> list[str]:
    """The end of a sweep's "run this instead" (``orchestrator/search/instead.py``) within ``width``,
    without its command lines (the caller prints those whole): a headline, one line per load point,
    where the numbers come from."""
    if "recommend" not in answer:
        text = answer.get("none") or ""
        return textwrap.wrap(f"Run this instead: nothing; {text}", width, subsequent_indent="  ") \
            if text else []
    r = answer["recommend"]
    loads = r.get("loads", [])
    where = ", ".join(loads[:-1]) + (" and " if len(loads) > 1 else "") + (loads[-1] if loads else "")
    lines = textwrap.wrap(f"Run this instead: {overrides_text(r['change'])}, predicted better than every "
                          f"trial at {where} on the same {r.get('gpus', '?')} GPUs:", width,
                          subsequent_indent="  ")
    for label in loads:
        one = r["per_load"][label]
        p, b, pct = one["predicted"], one["trial_predicted"], one["change_pct"]
        lat = "".join(f", {name} {b[k]:,.0f} → {p[k]:,.0f} ms" for k, name in LATENCIES if k in p and k in b)
        tok = f"{b.get('output_tok_s', NAN):,.0f} → {p.get('output_tok_s', NAN):,.0f} tok/s"
        inside = " (inside the model's error: measure it)" if one.get("inside_model_error") else ""
        lines += textwrap.wrap(f"{label}: {tok} ({pct.get('output_tok_s', 0.0):+.0f}%){lat}{inside}; against "
                               f"{one['best_trial']}, the best trial there", width, initial_indent="  ",
                               subsequent_indent="    ")
    lines += textwrap.wrap(f"Both sides predicted: {r.get('source', '')}", width, initial_indent="  ",
                           subsequent_indent="    ")
    return lines
