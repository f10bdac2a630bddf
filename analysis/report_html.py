"""``python -m analysis report [RUN_ID]``: one self-contained HTML file for a sweep, a trial or a
prediction, read back from the MLflow store (docs/mlflow-layout.md).

The page is a Jinja2 template a person can edit (``analysis/templates/report.html.j2``, its CSS in
``report.css``), filled from plain data (:mod:`analysis.report_view`, the plots from
:mod:`analysis.report_figures`). The file fetches nothing: the CSS is inline, every picture is a PNG
embedded as a ``data:`` URI, and there is no script, so it can be mailed, attached to a ticket or
opened offline years later. The template autoescapes: every text that came from the store is escaped.
Missing metrics and artifacts (a trial that failed, a store that lost its artifact folder) leave a gap
in the report, never an error: the end of every sweep calls :func:`build_report`, and a failed sweep
is the one a person most wants to read.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from analysis import report_view as view
from analysis.report_figures import figures
from analysis.report_view import SearchPage, Trial
from analysis.store import StoreError, checked_store, default_tracking_uri, masked
from analysis.store import client as store_client
from vocab.metric_keys import point_metrics
from vocab.status import RunKind, Tag

TELEMETRY_PICTURES = (("plots/gpu_timeline.png", "GPU power and utilisation over time"),
                      ("plots/stage_queues.png", "running and queued requests per pipeline stage"))


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


def _instead(client: Any, run: Any) -> dict[str, Any]:
    """The sweep's "run this instead" (``instead.json``, written at its end), or {} when it has none."""
    with tempfile.TemporaryDirectory(prefix="parasweep-report-") as tmp:
        path = _artifact(client, run.info.run_id, "instead.json", Path(tmp), run.data.tags.get(Tag.SWEEP_DIR))
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path else {}
        except (OSError, ValueError):
            return {}
    return data if isinstance(data, dict) else {}


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
    instead = _instead(client, run) if kind == RunKind.SWEEP else {}
    page = render(run, parent, trials, uri, experiment_name, search, instead)
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


def render(run: Any, parent: Any, trials: Sequence[Trial], uri: str, experiment: str,
           search: SearchPage | None = None, instead: dict[str, Any] | None = None) -> str:
    """The whole page as one string, from ``templates/report.html.j2`` (autoescaped: every text from
    the store is escaped; the CSS of ``templates/report.css`` is inlined)."""
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("analysis", "templates"), undefined=StrictUndefined,
                      autoescape=select_autoescape(["html", "j2"], default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    return env.get_template("report.html.j2").render(
        header=view.header(run, parent, trials), search=view.search(search), config=view.config(trials),
        results=view.results(trials), by_length=view.by_length(trials), placement=view.placement(trials),
        plots=figures(trials),
        findings=view.findings(trials), instead=view.instead(instead or {}), telemetry=view.telemetry(trials),
        where=view.where(run, trials, uri, experiment), generated=datetime.now().strftime("%Y-%m-%d %H:%M"))


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
        where = masked(args.tracking_uri or default_tracking_uri())
        print(f"error: reading {where}: {view.short(first, 300)}", file=sys.stderr)
        return 2
    print(path)
    return 0
