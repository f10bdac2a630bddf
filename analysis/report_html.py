"""``python -m analysis report [RUN_ID]``: one self-contained HTML file for a sweep, a trial or a
prediction, read back from the MLflow store (docs/mlflow-layout.md).

The file fetches nothing: the CSS is inline, every picture is a PNG embedded as a ``data:`` URI, and
there is no script, so it can be mailed, attached to a ticket or opened offline years later. Every
text that came from the store is escaped. Missing metrics and artifacts (a trial that failed, a store
that lost its artifact folder) leave a gap in the report, never an error: the end of every sweep
calls :func:`build_report`, and a failed sweep is the one a person most wants to read.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from analysis.diagnose import overrides_text
from analysis.noise import NAN, judge, point_estimate
from analysis.repeats import combine_repeats
from analysis.report import finding_key, merge_findings, merge_texts
from analysis.store import StoreError, checked_store, default_tracking_uri, masked
from analysis.store import client as store_client
from vocab.metric_keys import PointLabel, point_metrics
from vocab.status import RunKind, Tag

TELEMETRY_PICTURES = (("plots/gpu_timeline.png", "GPU power and utilisation over time"),
                      ("plots/stage_queues.png", "running and queued requests per pipeline stage"))
SIM_ENGINES = ("sim", "sim-predict")
COMMON_HIGHLIGHTS = ("model.name", "hardware.name", "hardware.gpu", "tp.size", "pp.size", "dp.size",
                     "ep.size", "workload.name", "workload.concurrency", "workload.rate")


class ReportError(Exception):
    """Bad input (unknown run, no sweep, a store that is not one): the message is one line for a user."""


# --------------------------------------------------------------------------------------------------
# The store


def _not_found(exc: Exception) -> bool:
    return getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST"


def _target_run(client: Any, run_id: str | None, experiment: str | None, uri: str) -> Any:
    from mlflow.exceptions import MlflowException

    if run_id:
        try:
            return client.get_run(run_id)
        except MlflowException as exc:
            if _not_found(exc) or "not found" in str(exc).lower():
                raise ReportError(f"run id {run_id!r}: no such run in {masked(uri)} (the sweep's run id "
                                  "is printed at its end; `python -m analysis report` alone takes the "
                                  "latest sweep)") from exc
            raise
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            names = ", ".join(e.name for e in client.search_experiments()) or "none"
            raise ReportError(f"--experiment {experiment!r}: no such experiment in {masked(uri)} "
                              f"(experiments: {names})")
        ids = [exp.experiment_id]
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, filter_string=f"tags.`{Tag.KIND}` = '{RunKind.SWEEP}'",
                              order_by=["attributes.start_time DESC"], max_results=1) if ids else []
    if not runs:
        where = f"experiment {experiment!r} of " if experiment else ""
        raise ReportError(f"no sweep run in {where}{masked(uri)} (run a sweep first, or pass a run id)")
    return runs[0]


def _children(client: Any, run: Any) -> list[Any]:
    runs = client.search_runs([run.info.experiment_id],
                              filter_string=f"tags.`{Tag.PARENT}` = '{run.info.run_id}'", max_results=5000)
    return sorted(runs, key=lambda r: (_int(r.data.tags.get(Tag.TRIAL_NUM)), r.info.start_time or 0))


def _int(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return 1 << 30  # runs without a number go last


def _artifact(client: Any, run_id: str, path: str, tmp: Path, local_dir: str | None) -> Path | None:
    """The artifact from the store, else the trial directory's copy (written before it is logged),
    else None: a trial that failed early has neither, and the report shows what exists."""
    from mlflow.exceptions import MlflowException

    try:
        got = Path(client.download_artifacts(run_id, path, str(tmp / run_id)))
        if got.is_file():
            return got
    except (MlflowException, OSError):
        pass
    if local_dir and (Path(local_dir) / path).is_file():
        return Path(local_dir) / path
    return None


# --------------------------------------------------------------------------------------------------
# What the report shows, gathered first


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


def _png_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _findings(path: Path | None) -> list[dict[str, Any]] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return [f for f in data if isinstance(f, dict)] if isinstance(data, list) else []


def _gather(client: Any, runs: Sequence[Any]) -> list[Trial]:
    trials = []
    with tempfile.TemporaryDirectory(prefix="parasweep-report-") as tmp:
        for run in runs:
            metrics = run.data.metrics
            trial = Trial(run, point_metrics(metrics), point_metrics(metrics, "pred"))
            local = run.data.tags.get(Tag.TRIAL_DIR)
            trial.findings = _findings(_artifact(client, run.info.run_id, "diagnosis.json", Path(tmp), local))
            for path, caption in TELEMETRY_PICTURES:
                png = _artifact(client, run.info.run_id, path, Path(tmp), local)
                if png is not None:
                    trial.pictures.append((caption, _png_uri(png)))
            trials.append(trial)
    return trials


@dataclass
class SearchPage:
    """A search run's own artifacts (``search/``): its answer, its table of candidates, its Pareto
    fronts and its measured candidates."""

    source: str  # where the candidates' numbers come from
    answer: str = ""
    candidates: Any = None  # DataFrame, or None when the table is missing
    measured: Any = None
    pictures: list[tuple[str, str]] = field(default_factory=list)


SEARCH_PICTURES = (("search/pareto_per_user.png", "Pareto front: output tokens/s per GPU against per user"),
                   ("search/pareto_ttft.png", "Pareto front: output tokens/s per GPU against TTFT p99"))


def _search(client: Any, run: Any) -> SearchPage:
    import pandas as pd

    page = SearchPage(run.data.tags.get(Tag.SEARCH_SOURCE, ""))
    local = run.data.tags.get(Tag.SWEEP_DIR)
    with tempfile.TemporaryDirectory(prefix="parasweep-report-") as tmp:
        def get(path: str) -> Path | None:
            return _artifact(client, run.info.run_id, path, Path(tmp), local)

        answer = get("search/answer.md")
        page.answer = answer.read_text(encoding="utf-8").strip().strip("`").strip() if answer else ""
        table = get("search/candidates.csv")
        page.candidates = pd.read_csv(table) if table else None
        measured = get("search/measured.csv")
        page.measured = pd.read_csv(measured) if measured else None
        for path, caption in SEARCH_PICTURES:
            png = get(path)
            if png is not None:
                page.pictures.append((caption, _png_uri(png)))
    return page


SEARCH_SHOWN = 10  # candidates of the search's table shown in the report, best first


def _search_html(page: SearchPage) -> str:
    parts = ["<h2>Search</h2>", f'<p class="muted">Candidates: {_e(page.source)}. The measured candidates '
             "are this run's trials, below.</p>"]
    if page.answer:
        parts.append(f"<pre>{_e(page.answer)}</pre>")
    for caption, uri in page.pictures:
        parts.append(f'<figure><img src="{uri}" alt="{_e(caption)}"><figcaption>{_e(caption)}</figcaption>'
                     "</figure>")
    table = page.candidates
    if table is not None and not table.empty:
        counts = table["status"].value_counts()
        parts.append("<p>" + ", ".join(f"{_e(k)}: {n}" for k, n in counts.items()) + "</p>")
        ok = table[table["status"] == "ok"].sort_values("score", ascending=False).head(SEARCH_SHOWN)
        shown = [c for c in ok.columns if c not in SEARCH_HIDDEN]
        parts.append(_frame_html(ok[shown], f"The best {len(ok)} candidates (predicted)"))
    if page.measured is not None and not page.measured.empty:
        parts.append(_frame_html(page.measured, "Measured candidates: predicted against measured, per load"))
    return "\n".join(parts)


SEARCH_HIDDEN = ("status", "reason", "category", "miss", "same_as")


def _placement_html(trials: Sequence[Trial]) -> str:
    """Where each trial ran: host, Ray node, the GPUs Ray gave it and their NVML UUIDs."""
    placed = [t for t in trials if t.tags.get(Tag.HOST)]
    if not placed:
        return ""
    rows = "".join(
        f"<tr><td>{_e(t.label)}</td><td>{_e(t.tags.get(Tag.HOST))}</td>"
        f"<td>{_e(t.tags.get(Tag.RAY_NODE_ID, ''))}</td>"
        f"<td>{_e(t.tags.get(Tag.CUDA_VISIBLE_DEVICES, ''))}</td>"
        f"<td>{_e(t.tags.get(Tag.GPU_UUIDS, ''))}</td></tr>" for t in placed)
    return ("<h2>Where each trial ran</h2><table><tr><th>trial</th><th>host</th><th>Ray node</th>"
            f"<th>CUDA_VISIBLE_DEVICES</th><th>GPU UUIDs (NVML)</th></tr>{rows}</table>")


def _frame_html(frame: Any, caption: str) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    rows = "".join("<tr>" + "".join(f"<td>{_e(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><caption>{_e(caption)}</caption><tr>{head}</tr>{rows}</table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:,.1f}"
    return str(value)


# --------------------------------------------------------------------------------------------------
# Build


def build_report(run_id: str | None, tracking_uri: str | None, out: Path | None = None,
                 experiment: str | None = None) -> Path:
    """Writes the report of ``run_id`` (a sweep run: its trials are its children; or one trial or
    prediction run; None: the latest sweep in the store, or in ``experiment``) and returns its path
    (default ``report-<run id prefix>.html`` in the current directory).

    Raises :class:`ReportError` for bad input (no such run, no sweep, not a store) and MLflow's own
    errors when the store fails; missing metrics and artifacts never raise."""
    try:
        uri = checked_store(tracking_uri or default_tracking_uri())
    except StoreError as exc:
        raise ReportError(str(exc)) from exc
    client = store_client(uri)
    run = _target_run(client, run_id, experiment, uri)
    kind = run.data.tags.get(Tag.KIND)
    if kind not in tuple(RunKind):
        raise ReportError(f"run id {run.info.run_id}: not a parasweep run (no {Tag.KIND} tag); pass a "
                          "sweep, trial or prediction run")
    parent = None
    if kind == RunKind.SWEEP:
        runs = _children(client, run)
    else:
        runs = [run]
        parent_id = run.data.tags.get(Tag.PARENT)
        if parent_id:
            try:
                parent = client.get_run(parent_id)
            except Exception:  # a deleted parent only loses the header's command line
                parent = None
    trials = _gather(client, runs)
    experiment_name = _experiment_name(client, run.info.experiment_id)
    search = _search(client, run) if run.data.tags.get(Tag.MODE) == "search" else None
    page = render(run, parent, trials, uri, experiment_name, search)
    out = out or Path.cwd() / f"report-{run.info.run_id[:8]}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def _experiment_name(client: Any, experiment_id: str) -> str:
    try:
        return client.get_experiment(experiment_id).name
    except Exception:  # only a label in the report
        return "?"


# --------------------------------------------------------------------------------------------------
# Render

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1180px;
padding:16px 24px;color:#1d1d1f;background:#fff}
h1{font-size:1.6em;margin:.2em 0}h2{font-size:1.25em;margin:1.6em 0 .5em;border-bottom:2px solid #ddd;
padding-bottom:.2em}h3{font-size:1.05em;margin:1.1em 0 .4em}
.sub{color:#555;margin:.2em 0 .8em}code,pre{font:13px/1.4 ui-monospace,Menlo,Consolas,monospace;
background:#f4f4f6;border-radius:3px}code{padding:1px 4px;word-break:break-all}
pre{padding:8px;white-space:pre-wrap;word-break:break-word;max-height:18em;overflow:auto}
.banner{padding:10px 14px;border-radius:6px;margin:10px 0;font-weight:600}
.sim{background:#fff3cd;border:2px solid #e0a800;color:#5c4400}.meas{background:#e6f4ea;border:1px solid
#5aa469;color:#1e4620}.none{background:#eee;border:1px solid #aaa}
nav a{margin-right:14px}table{border-collapse:collapse;margin:6px 0 12px;font-size:14px}
th,td{border:1px solid #d6d6da;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f3}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.pred{color:#6a4fb0;font-size:.9em}.bad{color:#b00020;font-weight:600}.ok{color:#1e7b34}
.warnrow td{background:#fff7f7}.scroll{overflow-x:auto}
.kv{columns:3 300px;column-gap:24px;font-size:13px;margin:6px 0}.kv div{break-inside:avoid;
padding:1px 0}.kv b{font-weight:600;color:#333}
figure{margin:10px 0 18px}figure img{max-width:100%;height:auto;border:1px solid #e3e3e6}
figcaption{color:#444;font-size:.92em}.finding{border-left:5px solid #999;padding:6px 12px;
margin:10px 0;background:#fafafa}.finding.critical{border-color:#c62828}.finding.warning{border-color:
#ef8f00}.finding.info{border-color:#1565c0}.sev{font-weight:700;text-transform:uppercase;font-size:.8em;
margin-right:6px}.finding p{margin:.3em 0}.muted{color:#666}ul.tight{margin:.2em 0;padding-left:1.3em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _when(run: Any) -> str:
    started = run.data.tags.get(Tag.STARTED)
    if not started and run.info.start_time:
        started = datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M:%S")
    took = ""
    if run.info.start_time and run.info.end_time:
        secs = (run.info.end_time - run.info.start_time) / 1000
        took = f", took {secs:.0f} s" if secs < 120 else f", took {secs / 60:.1f} min"
    return f"{started or 'unknown start'}{took}"


def _engines(trials: Sequence[Trial]) -> tuple[bool, str]:
    """Whether any number is simulated, and one sentence naming the engine and GPU telemetry source."""
    engines = sorted({t.tags.get(Tag.ENGINE, "") for t in trials} - {""})
    versions = sorted({t.tags.get(Tag.ENGINE_VERSION, "") for t in trials} - {""})
    sources = sorted({t.tags.get(Tag.GPU_TELEMETRY, "") for t in trials} - {""})
    simulated = any(e in SIM_ENGINES for e in engines) or "simulated" in sources
    parts = []
    for engine in engines:
        parts.append({"sim": "the simulated engine (a discrete-event model behind an SGLang-compatible "
                             "HTTP server): timings simulated, not measured",
                      "sim-predict": "the simulated engine's model in virtual time: predictions, "
                                     "not measurements",
                      "sglang": "measured on SGLang"}.get(engine, f"engine {engine}"))
    text = "; ".join(parts) or "engine unknown (no trial recorded one)"
    if versions:
        text += f" ({', '.join(versions)})"
    if sources:
        from analysis.plots import describe_source

        text += ". GPU telemetry: " + ", ".join(describe_source(s) for s in sources)
    return simulated, text + "."


def _header(run: Any, parent: Any, trials: Sequence[Trial]) -> str:
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
    simulated, engine = _engines(trials)
    out = [f"<h1>{_e(what)} report: {_e(run.info.run_name or run.info.run_id)}</h1>",
           f'<p class="sub">{_e(sub)} · started {_e(_when(run))} · run '
           f"<code>{_e(run.info.run_id)}</code></p>"]
    if simulated:
        out.append('<div class="banner sim">SIMULATED, NOT MEASURED. These numbers come from parasweep\'s '
                   "simulated engine, not from GPUs: read them as a model's estimate.<br>"
                   f"Engine: {_e(engine)}</div>")
    elif any(t.tags.get(Tag.ENGINE) for t in trials):
        out.append(f'<div class="banner meas">{_e(engine[0].upper() + engine[1:])}</div>')
    else:
        out.append(f'<div class="banner none">{_e(engine)}</div>')
    command = tags.get(Tag.COMMAND) or (parent.data.tags.get(Tag.COMMAND) if parent is not None else None)
    if command:
        out.append(f"<p>Command: <code>{_e(command)}</code></p>")
    best = headline(trials)
    if best:
        out.append(f"<p>{best}</p>")
    out.append('<nav><a href="#config">Configuration</a><a href="#results">Results</a>'
               '<a href="#plots">Plots</a><a href="#findings">Findings</a><a href="#telemetry">Telemetry'
               '</a><a href="#where">Where the data is</a></nav>')
    return "\n".join(out)


def headline(trials: Sequence[Trial]) -> str:
    """The highest output tok/s among valid points, the one-line answer most readers look for, and
    whether it beats the next trial at that point beyond the noise of both (repeats of a configuration
    count as one, judged by their spread: :mod:`analysis.repeats`)."""
    rows = [Trial(run, point_metrics(run.data.metrics), {})
            for run in combine_repeats([t.run for t in trials])]
    best: tuple[float, Trial, PointLabel] | None = None
    for trial in rows:
        for point, m in trial.measured.items():
            value = m.get("output_tok_s")
            if value is None or not math.isfinite(value) or m.get("valid", 1.0) != 1.0:
                continue
            if best is None or value > best[0]:
                best = (value, trial, point)
    if best is None:
        return ""
    value, trial, point = best
    head = f"Highest output throughput at a valid point: <b>{_num(value)} tok/s</b> at {_e(point)}"
    # the other trials at that point: is it better than the next beyond the noise of both?
    here = [(t, t.measured[point]) for t in rows if point in t.measured
            and t.measured[point].get("valid", 1.0) == 1.0
            and math.isfinite(t.measured[point].get("output_tok_s", NAN))]
    verdict = judge([point_estimate(m, "output_tok_s") for _, m in here]) if len(here) > 1 else None
    if verdict is None or verdict.runner_up is None:
        return f"{head} ({_e(trial.label)})."
    second = here[verdict.runner_up]
    if verdict.clear:
        return (f"{head} ({_e(trial.label)}), ahead of the next ({_e(second[0].label)}, "
                f"{_num(second[1]['output_tok_s'])} tok/s) beyond the noise of both.")
    return (f"{head} ({_e(trial.label)}), {verdict.text()} of {_e(second[0].label)} "
            f"({_num(second[1]['output_tok_s'])} tok/s): no trial is measurably faster there.")


def _config(trials: Sequence[Trial]) -> str:
    out = ['<h2 id="config">Configuration</h2>']
    params = [t.run.data.params for t in trials if t.run.data.params]
    keys = sorted(set().union(*params)) if params else []
    varying = [k for k in keys if len({p.get(k) for p in params}) > 1]
    common = {k: params[0][k] for k in keys if k not in varying}
    out.append("<h3>What varies between trials</h3>")
    if len(trials) > 1 and varying:
        head = "".join(f"<th>{_e(k)}</th>" for k in varying)
        rows = "".join(f"<tr><td>{_e(t.label)}</td>"
                       + "".join(f"<td>{_e(_short(t.run.data.params.get(k, '–')))}</td>" for k in varying)
                       + "</tr>" for t in trials)
        out.append(f'<div class="scroll"><table><tr><th>trial (its overrides)</th>{head}</tr>{rows}'
                   "</table></div>")
        if any(k.startswith("resolved.") for k in varying):
            out.append('<p class="muted">resolved.* are the values the engine reported after start-up, '
                       "so they can differ as a consequence of the overrides.</p>")
    else:
        label = trials[0].tags.get(Tag.OVERRIDES) if trials else None
        out.append(f"<p>{_e(label or 'nothing: one trial')}</p>")
    if common:
        highlights = ", ".join(f"{k}={common[k]}" for k in COMMON_HIGHLIGHTS if k in common)
        out.append(f"<h3>Common to all trials ({len(common)} parameters)</h3>")
        if highlights:
            out.append(f"<p>{_e(highlights)}</p>")
        items = "".join(f"<div><b>{_e(k)}</b> = {_e(_short(v))}</div>" for k, v in common.items())
        out.append(f"<details><summary>all {len(common)} common parameters</summary>"
                   f'<div class="kv">{items}</div></details>')
    return "\n".join(out)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pct(pred: float | None, meas: float | None) -> str:
    if pred is None or meas is None or not (math.isfinite(pred) and math.isfinite(meas)) or meas == 0:
        return ""
    return f" ({(pred - meas) / meas * 100:+.0f}%)"


def _results(trials: Sequence[Trial]) -> str:
    with_pred = any(t.predicted for t in trials)
    with_energy = any("j_per_output_token" in m for t in trials for m in t.measured.values())
    all_predictions = all(t.is_prediction for t in trials)
    head = ["trial", "status", "point", "output tok/s"]
    if with_pred:
        head.append("predicted tok/s (vs measured)")
    head += ["TTFT p99 ms", "ITL p99 ms"]
    if with_energy:
        head.append("J / output token")
    head.append("valid")
    out = ['<h2 id="results">Results</h2>']
    note = ("Every number here is a prediction of the simulated engine in virtual time." if all_predictions
            else "Per trial and load point (c&lt;N&gt; = N requests kept in flight, r&lt;R&gt; = R requests "
                 "per second).")
    if with_pred:
        note += (' <span class="pred">Purple</span> = the simulator\'s prediction for the same config and '
                 "point, beside the measurement.")
    out.append(f"<p class=\"muted\">{note}</p>")
    rows = []
    for trial in trials:
        status_cls = "ok" if trial.status in ("ok", "skipped") else "bad"
        cells_status = f'<td class="{status_cls}">{_e(trial.status)}</td>'
        points = sorted(set(trial.measured) | set(trial.predicted))
        if not points:
            error = trial.tags.get(Tag.ERROR, "").strip().splitlines()
            why = _short(error[-1], 300) if error else "no load point finished"
            rows.append(f'<tr class="warnrow"><td>{_e(trial.label)}</td>{cells_status}'
                        f'<td colspan="{len(head) - 2}">no results: {_e(why)}</td></tr>')
            continue
        for point in points:
            m, p = trial.measured.get(point, {}), trial.predicted.get(point, {})
            valid = m.get("valid")
            cells = [f"<td>{_e(trial.label)}</td>", cells_status, f"<td>{_e(point)}</td>",
                     f'<td class="n">{_num(m.get("output_tok_s"))}</td>']
            if with_pred:
                cells.append(f'<td class="n pred">{_num(p.get("output_tok_s"))}'
                             f'{_e(_pct(p.get("output_tok_s"), m.get("output_tok_s")))}</td>')
            for key, digits in (("ttft_p99_ms", 1), ("itl_p99_ms", 2)):
                extra = f' <span class="pred">({_num(p[key], digits)})</span>' if key in p else ""
                cells.append(f'<td class="n">{_num(m.get(key), digits)}{extra}</td>')
            if with_energy:
                cells.append(f'<td class="n">{_num(m.get("j_per_output_token"), 3)}</td>')
            if valid is None:
                cells.append("<td>–</td>")
            elif valid == 1.0:
                cells.append('<td class="ok">yes</td>')
            else:
                cells.append('<td class="bad">NO: the client fell behind or the point was cut short '
                             '(see the findings)</td>')
            cls = ' class="warnrow"' if valid is not None and valid != 1.0 else ""
            rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    head_html = "".join(f"<th>{_e(h)}</th>" for h in head)
    out.append(f'<div class="scroll"><table id="results-table"><tr>{head_html}</tr>{"".join(rows)}'
               "</table></div>")
    if any(m.get("valid", 1.0) != 1.0 for t in trials for m in t.measured.values()):
        out.append('<p class="muted">valid = NO: the client could not keep the load it was asked for, so '
                   "that point says more about the load generator than about the server.</p>")
    return "\n".join(out)


# ---- plots


def _fig_uri(fig: Any) -> str:
    import matplotlib.pyplot as plt

    from analysis.plots import tight_layout

    buf = io.BytesIO()
    tight_layout(fig)
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _series(points: Mapping[PointLabel, Mapping[str, float]], key: str, open_loop: bool
            ) -> tuple[list[float], list[float], list[bool]]:
    """x (load), y and the valid flag of every point of one loop kind that has ``key``."""
    xs, ys, valid = [], [], []
    for point in sorted(points):
        value = points[point].get(key)
        if point.open_loop == open_loop and value is not None and math.isfinite(value):
            xs.append(point.load)
            ys.append(value)
            valid.append(points[point].get("valid", 1.0) == 1.0)
    return xs, ys, valid


def _legend_label(trial: Trial) -> str:
    return _short(trial.label, 40)


def _plots(trials: Sequence[Trial]) -> list[tuple[str, str]]:
    """(caption, data URI) for every plot across trials that has data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    simulated, _ = _engines(trials)
    tail = " (simulated engine, not measured)" if simulated else ""
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figures = []
    for open_loop in (False, True):
        if not any(p.open_loop == open_loop for t in trials for p in (*t.measured, *t.predicted)):
            continue
        xlabel = "request rate (req/s, open loop)" if open_loop else "concurrency (requests in flight)"
        # throughput, measured solid and predicted dashed in the trial's colour
        fig, ax = plt.subplots(figsize=(8, 4.2))
        any_pred = False
        for i, trial in enumerate(trials):
            colour = colours[i % len(colours)]
            xs, ys, valid = _series(trial.measured, "output_tok_s", open_loop)
            if xs:
                ax.plot(xs, ys, marker="o", color=colour, label=_legend_label(trial))
                bad = [(x, y) for x, y, ok in zip(xs, ys, valid, strict=True) if not ok]
                if bad:
                    ax.scatter(*zip(*bad, strict=True), s=110, facecolors="none", edgecolors="red", zorder=3)
            pxs, pys, _ = _series(trial.predicted, "output_tok_s", open_loop)
            if pxs:
                any_pred = True
                ax.plot(pxs, pys, ls="--", marker="x", color=colour, alpha=0.7)
        if any_pred:
            ax.plot([], [], ls="--", marker="x", color="grey", label="dashed: simulator's prediction")
        if any(m.get("valid", 1.0) != 1.0 for t in trials for m in t.measured.values()):
            ax.scatter([], [], s=110, facecolors="none", edgecolors="red", label="red ring: valid=0")
        ax.set(xlabel=xlabel, ylabel="output tokens / s", title=f"Output throughput{tail}")
        _load_ticks([ax], trials, open_loop)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
        figures.append((f"Output throughput against {xlabel.split(' (')[0]}, one line per trial.",
                        _fig_uri(fig)))

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, (key, name) in zip(axes, (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99")),
                                   strict=True):
            for i, trial in enumerate(trials):
                xs, ys, _ = _series(trial.measured, key, open_loop)
                if xs:
                    ax.plot(xs, ys, marker="o", color=colours[i % len(colours)], label=_legend_label(trial))
            ax.set(xlabel=xlabel, ylabel="ms", title=f"{name}{tail}")
            low, high = ax.dataLim.y0, ax.dataLim.y1
            if ax.has_data() and low > 0 and high / low > 20:  # log only where it spreads the lines apart
                ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
        _load_ticks(axes, trials, open_loop)
        if axes[0].has_data():
            axes[0].legend(fontsize="small")
        figures.append(("Tail latency: time to first token (TTFT) and inter-token latency (ITL), 99th "
                        "percentile.", _fig_uri(fig)))

        if any("j_per_output_token" in m for t in trials for m in t.measured.values()):
            fig, ax = plt.subplots(figsize=(8, 4))
            for i, trial in enumerate(trials):
                xs, ys, _ = _series(trial.measured, "j_per_output_token", open_loop)
                if xs:
                    ax.plot(xs, ys, marker="o", color=colours[i % len(colours)], label=_legend_label(trial))
            source = _telemetry_words(trials)
            ax.set(xlabel=xlabel, ylabel="joules per output token", title=f"Energy per token ({source})")
            _load_ticks([ax], trials, open_loop)
            ax.grid(alpha=0.3)
            if ax.has_data():
                ax.legend(fontsize="small")
                figures.append((f"GPU energy per output token ({source}); lower is better.", _fig_uri(fig)))
            else:
                plt.close(fig)

    pairs = [(t, p, t.measured[p], t.predicted[p]) for t in trials for p in t.predicted if p in t.measured]
    if pairs:
        fig, axes = plt.subplots(1, 3, figsize=(12, 4))
        index = {id(t): i for i, t in enumerate(trials)}
        for ax, (key, name) in zip(axes, (("output_tok_s", "output tok/s"), ("ttft_p99_ms", "TTFT p99 ms"),
                                          ("itl_p99_ms", "ITL p99 ms")), strict=True):
            vals = []
            for trial, point, m, p in pairs:
                if key in m and key in p and math.isfinite(m[key]) and math.isfinite(p[key]):
                    ax.scatter(p[key], m[key], color=colours[index[id(trial)] % len(colours)])
                    ax.annotate(str(point), (p[key], m[key]), fontsize="x-small", xytext=(3, 3),
                                textcoords="offset points")
                    vals += [m[key], p[key]]
            if vals:
                lo, hi = min(vals), max(vals)
                ax.plot([lo, hi], [lo, hi], color="grey", ls=":", label="measured = predicted")
                ax.legend(fontsize="x-small", loc="upper left")
            ax.set(xlabel=f"predicted {name}", ylabel=f"measured {name}", title=name)
            ax.grid(alpha=0.3)
        fig.suptitle("Predicted (simulator, virtual time) vs measured, one dot per trial and point")
        figures.append(("Each dot is one trial at one load point (colour = trial, as above); on the dotted "
                        "line the prediction matched the measurement.", _fig_uri(fig)))
    return figures


def _load_ticks(axes: Iterable[Any], trials: Sequence[Trial], open_loop: bool) -> None:
    """Ticks at the loads that were run (1, 4, 16), not at values nobody ran (2.5); a log axis when
    they double from point to point (1 ... 256), so the low ones are not crowded into a corner."""
    from matplotlib.ticker import NullFormatter

    loads = sorted({p.load for t in trials for p in (*t.measured, *t.predicted) if p.open_loop == open_loop})
    if not loads:
        return
    spread = loads[0] > 0 and loads[-1] / loads[0] >= 16
    for ax in axes:
        if spread:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_minor_formatter(NullFormatter())
        if len(loads) <= 12:
            ax.set_xticks(loads, [f"{x:g}" for x in loads])


def _telemetry_words(trials: Sequence[Trial]) -> str:
    from analysis.plots import describe_source

    sources = sorted({t.tags.get(Tag.GPU_TELEMETRY, "") for t in trials} - {""})
    return ", ".join(describe_source(s) for s in sources) or "source not recorded"


def _plots_html(trials: Sequence[Trial]) -> str:
    out = ['<h2 id="plots">Plots</h2>']
    figures = _plots(trials)
    if not figures:
        out.append('<p class="muted">No load point finished, so there is nothing to plot.</p>')
    for caption, uri in figures:
        out.append(f'<figure><img src="{uri}" alt="{_e(caption)}"><figcaption>{_e(caption)}</figcaption>'
                   "</figure>")
    return "\n".join(out)


# ---- findings


def _overrides(change: Any) -> str:
    """The change as the overrides a user types (:func:`analysis.diagnose.overrides_text`, as the
    terminal summary writes it)."""
    return overrides_text(change) if isinstance(change, Mapping) and change else "no change"


def _effect(effect: Any) -> str:
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
    tried = effect.get("tried")
    if isinstance(tried, list) and tried:
        text += "; tried: " + "; ".join(f"{_overrides(t.get('change'))} ({t.get('verdict', '?')})"
                                        for t in tried if isinstance(t, Mapping))
    if effect.get("source"):
        text += f" [{effect['source']}]"
    return text


def _findings_html(trials: Sequence[Trial]) -> str:
    out = ['<h2 id="findings">Findings</h2>']
    # merged as the terminal summary merges them: by id and load point (report.merge_findings)
    merged = merge_findings([(i, list(t.findings or [])) for i, t in enumerate(trials)])
    if not merged:
        with_file = any(t.findings is not None for t in trials)
        out.append(f'<p class="muted">{"No findings." if with_file else "No diagnosis was recorded."}'
                   "</p>")
        return "\n".join(out)
    out.append('<p class="muted">What the diagnosis saw in each trial, from engine-independent signals; '
               "the same finding at the same load point in several trials is shown once. Every suggested "
               "change was predicted on the simulated engine before it was suggested.</p>")
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
        merged_title = merge_texts(m.titles, members[0][0].label)
        title = f"{scope}: {merged_title}" if scope else merged_title
        body = [f'<div class="finding {_e(m.severity)}"><p><span class="sev">{_e(m.severity)}</span>'
                f"<code>{_e(m.id)}</code> <b>{_e(title)}</b></p>"]
        for field_name, label in (("evidence", "Evidence"), ("suggestion", "Suggestion")):
            texts = list(dict.fromkeys(str(f.get(field_name, "")) for _t, f in members if f.get(field_name)))
            if len(texts) == 1:
                body.append(f"<p><b>{label}:</b> {_e(texts[0])}</p>")
            elif texts:
                items = "".join(f"<li>{_e(t.label)}: {_e(f.get(field_name, ''))}</li>" for t, f in members
                                if f.get(field_name))
                body.append(f'<p><b>{label}:</b></p><ul class="tight">{items}</ul>')
        effects = [(t, _effect(f.get("predicted_effect"))) for t, f in members]
        effects = [(t, e) for t, e in effects if e]
        if effects:
            distinct = list(dict.fromkeys(e for _t, e in effects))
            if len(distinct) == 1:
                body.append(f'<p class="pred">{_e(distinct[0])}</p>')
            else:
                items = "".join(f"<li>{_e(t.label)}: {_e(e)}</li>" for t, e in effects)
                body.append(f'<ul class="tight pred">{items}</ul>')
        body.append("</div>")
        out.append("".join(body))
    return "\n".join(out)


# ---- telemetry pictures and where the data is


def _telemetry_html(trials: Sequence[Trial]) -> str:
    out = ['<h2 id="telemetry">Telemetry per trial</h2>']
    if not any(t.pictures for t in trials):
        out.append('<p class="muted">No trial logged telemetry pictures (a prediction has none; a measured '
                   "trial without GPU telemetry or engine log has none).</p>")
    for trial in trials:
        if not trial.pictures:
            continue
        source = trial.tags.get(Tag.GPU_TELEMETRY_NOTE) or trial.tags.get(Tag.GPU_TELEMETRY) or ""
        out.append(f"<h3>{_e(trial.label)}</h3>")
        if source:
            out.append(f'<p class="muted">GPU telemetry: {_e(_telemetry_words([trial]))}; {_e(source)}</p>')
        for caption, uri in trial.pictures:
            text = f"{trial.label}: {caption}"
            out.append(f'<figure><img src="{uri}" alt="{_e(text)}"><figcaption>{_e(text)}</figcaption>'
                       "</figure>")
    return "\n".join(out)


def _where_html(run: Any, trials: Sequence[Trial], uri: str, experiment: str) -> str:
    shown = masked(uri)
    out = ['<h2 id="where">Where the data is</h2>', "<ul>",
           f"<li>MLflow store: <code>{_e(shown)}</code>, experiment <code>{_e(experiment)}</code> "
           f"(id {_e(run.info.experiment_id)})</li>",
           f"<li>This run: <code>{_e(run.info.run_id)}</code> ({_e(run.info.run_name or '')})</li>"]
    sweep_dir = run.data.tags.get(Tag.SWEEP_DIR)
    if sweep_dir:
        out.append(f"<li>Sweep directory: <code>{_e(sweep_dir)}</code></li>")
    out.append(f"<li>Browse: <code>mlflow ui --backend-store-uri {_e(shown)} --host 127.0.0.1 --port 5000"
               f"</code>, then open <code>#/experiments/{_e(run.info.experiment_id)}/runs?workflowType="
               "machine_learning</code> on that address</li>")
    if run.data.tags.get(Tag.KIND) == RunKind.SWEEP:
        out.append(f"<li>Replay the sweep: <code>python run.py reproduce={_e(run.info.run_id)}</code></li>")
    out.append("</ul>")
    rows = "".join(f"<tr><td>{_e(t.label)}</td><td>{_e(t.status)}</td><td><code>{_e(t.run.info.run_id)}"
                   f"</code></td><td><code>{_e(t.tags.get(Tag.TRIAL_DIR, '–'))}</code></td></tr>"
                   for t in trials)
    if rows:
        out.append("<table><tr><th>trial</th><th>status</th><th>MLflow run id</th><th>trial directory</th>"
                   f"</tr>{rows}</table>")
    return "\n".join(out)


def render(run: Any, parent: Any, trials: Sequence[Trial], uri: str, experiment: str,
           search: SearchPage | None = None) -> str:
    """The whole page as one string."""
    title = f"parasweep report: {run.info.run_name or run.info.run_id}"
    body = [_header(run, parent, trials), *([_search_html(search)] if search else []), _config(trials),
            _results(trials), _placement_html(trials), _plots_html(trials),
            _findings_html(trials), _telemetry_html(trials), _where_html(run, trials, uri, experiment)]
    generated = datetime.now().strftime("%Y-%m-%d %H:%M")
    # the empty data: icon keeps a browser from asking a server for /favicon.ico
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f'<link rel="icon" href="data:,"><title>{_e(title)}</title><style>{CSS}</style></head><body>\n'
            + "\n".join(body)
            + f'\n<p class="muted">Generated by <code>python -m analysis report</code> on {_e(generated)}.'
            "</p>\n</body></html>\n")


# --------------------------------------------------------------------------------------------------
# CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, like every other bad input
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _quiet_mlflow() -> None:
    import logging
    import warnings

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="mlflow")


def main(argv: Iterable[str]) -> int:
    parser = _Parser(prog="python -m analysis report",
                     description="Write one self-contained HTML report of a sweep, trial or prediction run.")
    parser.add_argument("run_id", nargs="?", help="sweep, trial or prediction run id (default: the latest "
                        "sweep in the store)")
    parser.add_argument("--tracking-uri", help="MLflow store (default: sqlite:///<cwd>/runs/mlflow.db, as "
                        "for run.py)")
    parser.add_argument("--experiment", help="with no run id: the latest sweep of this experiment")
    parser.add_argument("--out", type=Path, help="output file (default: report-<run id prefix>.html)")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # --help (0) or a bad flag (2, its one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    _quiet_mlflow()
    from mlflow.exceptions import MlflowException

    try:
        path = build_report(args.run_id, args.tracking_uri, args.out, args.experiment)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (MlflowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: reading {masked(args.tracking_uri or default_tracking_uri())}: {_short(first, 300)}",
              file=sys.stderr)
        return 2
    print(path)
    return 0
