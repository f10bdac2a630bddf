"""``python -m analysis compare``: trials of several sweeps (or experiments, or any MLflow filter) side
by side: one row per run and closed-loop load point, a table, a CSV, plots against load, Pareto fronts,
and the best configuration under service-level objectives (SLOs).

Reads only the MLflow store (layout: docs/mlflow-layout.md), never a trial directory, so it works on a
copy of the store or a remote tracking server. The selection, the Pareto front and the SLO choice are
plain functions (:func:`load_rows`, :func:`pareto_front`, :func:`best_under`) so they can be used and
tested without the command line.

Numbers from the simulated engine stay marked as such: the ``kind`` column says ``predicted`` for the
simulator's virtual-time predictions, ``engine`` says ``sim`` for trials measured over HTTP against the
simulated engine, and ``simulated`` is true for both. Plots say so in their legends and titles.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.noise import Estimate, Verdict, judge
from analysis.store import StoreError, checked_store, default_tracking_uri, masked
from analysis.store import client as store_client
from vocab.metric_keys import Prefix, point_metrics
from vocab.status import RunKind, Tag, TrialStatus

TABLE_WIDTH = 100  # the terminal table never gets wider than this
PREDICTED_ENGINE = "sim-predict"  # the engine tag of prediction runs; also given to a trial's pred/ rows

# The columns every row has, in this order; the remaining per-point metrics follow alphabetically.
CORE_COLUMNS = (
    "label", "kind", "engine", "simulated", "gpus", "concurrency", "output_tok_s", "tok_s_per_gpu",
    "tok_s_per_user", "tok_s_per_user_from", "ttft_p99_ms", "itl_p99_ms", "j_per_output_token", "valid",
    "run_id", "run_name", "sweep_id", "sweep", "trial_num", "overrides")
# Columns that describe the row rather than measure it: no SLO can name them.
_DESCRIPTIVE = frozenset(CORE_COLUMNS) - {
    "output_tok_s", "tok_s_per_gpu", "tok_s_per_user", "ttft_p99_ms", "itl_p99_ms", "j_per_output_token",
    "gpus", "concurrency"}


class CompareError(Exception):
    """Bad input or an unusable store: the message is the one line the user sees (exit 2)."""


def lower_is_better(metric: str) -> bool:
    """Latencies (``*_ms``), energy per token and error counts: smaller is better. Everything else
    (throughputs, rates, concurrency) is taken as larger is better."""
    return metric.endswith("_ms") or metric.startswith("errors") or metric == "j_per_output_token"


# ---- selection and loading ------------------------------------------------------------------------

def _search(client: Any, experiment_ids: list[str], filter_string: str) -> list[Any]:
    from mlflow.exceptions import MlflowException

    runs: list[Any] = []
    token = None
    while True:
        try:
            page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=1000,
                                      page_token=token)
        except MlflowException as exc:
            first = (str(exc.message).strip().splitlines() or ["(no reason given)"])[0]
            raise CompareError(f"--filter {filter_string!r}: MLflow refused it: {first}") from exc
        runs += list(page)
        token = page.token
        if not token:
            return runs


def _experiment_ids(experiments: list[tuple[str, str]], name: str | None) -> list[str]:
    """The ids to search: the named experiment's, or every (active) experiment's."""
    ids = [exp_id for exp_id, exp_name in experiments if name is None or exp_name == name]
    if not ids and name is not None:
        names = ", ".join(sorted(n for _, n in experiments)) or "none"
        raise CompareError(f"--experiment {name!r}: no such experiment (the store has: {names})")
    return ids


def _sweep_run(client: Any, sweep_id: str, experiment_ids: list[str]) -> Any:
    """The sweep run with this id, or the only one whose id starts with it (labels show prefixes)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(sweep_id)
    except MlflowException:
        matches = []
        if len(sweep_id) >= 4:
            sweeps = _search(client, experiment_ids, f"tags.`{Tag.KIND}` = '{RunKind.SWEEP}'")
            matches = [r for r in sweeps if r.info.run_id.startswith(sweep_id)]
        if len(matches) != 1:
            what = "no sweep run has that id" if not matches else f"{len(matches)} sweep runs start with it"
            raise CompareError(f"--sweep {sweep_id!r}: {what} (give a sweep run's id, as printed at the "
                               "end of a sweep)") from None
        run = matches[0]
    kind = run.data.tags.get(Tag.KIND)
    if kind != RunKind.SWEEP:
        raise CompareError(f"--sweep {sweep_id!r}: that run is a {kind or 'non-parasweep'} run, not a sweep "
                           f"(its parent is {run.data.tags.get(Tag.PARENT, 'none')})")
    return run


def _gpus(params: dict[str, str]) -> int:
    """World size, as parasweep computes it: tp × pp × dp (a missing size counts as 1)."""
    n = 1
    for key in ("tp.size", "pp.size", "dp.size"):
        # a size logged as something odd: keep the others rather than drop the run
        with contextlib.suppress(ValueError):
            n *= max(int(params.get(key, "1")), 1)
    return n


def _rows_of_run(run: Any, sweep_name: str, with_predictions: bool) -> list[dict[str, Any]]:
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    kind = tags.get(Tag.KIND)
    engine = tags.get(Tag.ENGINE, "?")
    base = {"run_id": run.info.run_id, "run_name": run.info.run_name or "",
            "sweep_id": tags.get(Tag.PARENT, ""), "sweep": sweep_name,
            "trial_num": tags.get(Tag.TRIAL_NUM, ""), "overrides": tags.get(Tag.OVERRIDES, ""),
            "gpus": _gpus(params)}
    own_kind = "measured" if kind == RunKind.TRIAL else "predicted"
    sources: list[tuple[str, str, Prefix]] = [(own_kind, engine, "")]
    if with_predictions and kind == RunKind.TRIAL:
        sources.append(("predicted", PREDICTED_ENGINE, "pred"))
    rows = []
    for row_kind, row_engine, prefix in sources:
        for point, values in point_metrics(metrics, prefix).items():
            if point.concurrency is None or "output_tok_s" not in values:
                continue  # open-loop points have no concurrency to plot or divide by
            rows.append({**base, **values, "kind": row_kind, "engine": row_engine,
                         "concurrency": point.concurrency})
    return rows


def _derive(df: pd.DataFrame) -> pd.DataFrame:
    """The per-GPU and per-user rates, validity as a bool, and the column order."""
    for col in ("tpot_p50_ms", "ttft_p99_ms", "itl_p99_ms", "j_per_output_token", "valid"):
        if col not in df:
            df[col] = np.nan
    df["tok_s_per_gpu"] = df["output_tok_s"] / df["gpus"]
    tpot = pd.to_numeric(df["tpot_p50_ms"], errors="coerce")
    from_tpot = tpot.notna() & (tpot > 0) & np.isfinite(tpot)
    # what one user sees: the decode speed of a request (1000 / TPOT p50) when there is a TPOT; a point
    # whose requests made at most one token has none, and then throughput / concurrency stands in
    df["tok_s_per_user"] = np.where(from_tpot, 1000.0 / tpot.where(from_tpot, 1.0),
                                    df["output_tok_s"] / df["concurrency"])
    df["tok_s_per_user_from"] = np.where(from_tpot, "tpot_p50_ms", "output_tok_s/concurrency")
    # a point without a validity flag predates the check: count it valid rather than hide it
    df["valid"] = df["valid"].fillna(1.0).astype(float) == 1.0
    df["simulated"] = (df["kind"] == "predicted") | df["engine"].isin(["sim", PREDICTED_ENGINE])
    df["label"] = _labels(df)
    rest = sorted(c for c in df.columns if c not in CORE_COLUMNS)
    return df[list(CORE_COLUMNS) + rest]


def _labels(df: pd.DataFrame) -> pd.Series:
    """The run's overrides, prefixed by the sweep's id (first 6 hex digits) when several sweeps are
    shown: the same overrides in two sweeps are different runs."""
    overrides = df["overrides"].where(df["overrides"] != "", "defaults")
    if df["sweep_id"].nunique() <= 1:
        return overrides
    return df["sweep_id"].str[:6].where(df["sweep_id"] != "", df["run_id"].str[:6]) + " " + overrides


def load_rows(tracking_uri: str | None = None, *, experiment: str | None = None,
              sweeps: Sequence[str] = (), filter_string: str = "",
              with_predictions: bool = False) -> pd.DataFrame:
    """One row per (trial run, closed-loop load point) of the selection, columns as in CORE_COLUMNS
    then every other per-point metric. The selection is the intersection of what is given: the
    experiment (default: every experiment), the children of the sweeps, the MLflow filter string. Only
    trial and prediction runs whose status is ok or skipped count. With ``with_predictions`` a
    measured trial's ``pred/`` metrics become rows of their own (kind ``predicted``).

    Raises :class:`CompareError` for an unusable store, an unknown experiment or sweep, a filter
    MLflow refuses, or an empty selection."""
    try:
        uri = checked_store(tracking_uri or default_tracking_uri())
    except StoreError as exc:
        raise CompareError(str(exc)) from exc
    try:
        client = store_client(uri)
        experiment_names = [(e.experiment_id, e.name) for e in client.search_experiments()]
    except Exception as exc:  # the first touch of the store: sqlalchemy, HTTP or MLflow errors alike
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CompareError(f"--tracking-uri {masked(uri)}: cannot read the store: {first}") from exc
    experiment_ids = _experiment_ids(experiment_names, experiment)
    user_filter = filter_string.strip()
    parents: dict[str, Any] = {}
    if sweeps:
        runs = []
        for sweep_id in sweeps:
            parent = _sweep_run(client, sweep_id, experiment_ids)
            parents[parent.info.run_id] = parent
            parts = [f"tags.`{Tag.PARENT}` = '{parent.info.run_id}'"] + ([user_filter] if user_filter else [])
            runs += _search(client, experiment_ids, " and ".join(parts))
    else:
        runs = _search(client, experiment_ids, user_filter)
    wanted = {RunKind.TRIAL.value, RunKind.PREDICTION.value}
    good = {s.value for s in TrialStatus if s.succeeded}
    by_id = {r.info.run_id: r for r in runs
             if r.data.tags.get(Tag.KIND) in wanted and r.data.tags.get(Tag.STATUS) in good}
    for parent_id in {r.data.tags.get(Tag.PARENT, "") for r in by_id.values()} - set(parents) - {""}:
        parents[parent_id] = _run_or_none(client, parent_id)
    rows = []
    for run in by_id.values():
        parent = parents.get(run.data.tags.get(Tag.PARENT, ""))
        rows += _rows_of_run(run, parent.info.run_name if parent is not None else "", with_predictions)
    if not rows:
        chosen = [f"--experiment {experiment!r}" if experiment else "every experiment"]
        chosen += [f"--sweep {s}" for s in sweeps] + ([f"--filter {user_filter!r}"] if user_filter else [])
        raise CompareError(f"empty selection: no trial or prediction run with status ok/skipped and "
                           f"closed-loop load points in {', '.join(chosen)} of {masked(uri)}")
    df = _derive(pd.DataFrame(rows))
    order = df.assign(_measured_first=df["kind"] != "measured")
    order = order.sort_values(["label", "_measured_first", "concurrency"], kind="stable")
    return df.loc[order.index].reset_index(drop=True)


def _run_or_none(client: Any, run_id: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException:
        return None  # a deleted parent: its trials still compare, with an empty sweep name


# ---- Pareto fronts and SLOs -------------------------------------------------------------------------

def pareto_front(df: pd.DataFrame, x: str, y: str, *, x_higher_better: bool | None = None,
                 y_higher_better: bool | None = None) -> pd.Series:
    """A boolean mask over ``df``: the rows no other row dominates on (x, y). A row dominates another
    when it is at least as good on both and better on one. The direction of each axis defaults to
    :func:`lower_is_better` of its name (``*_ms`` lower, throughputs higher). Rows with a missing x or
    y are never on the front and dominate nothing; equal rows are all on it."""
    xh = not lower_is_better(x) if x_higher_better is None else x_higher_better
    yh = not lower_is_better(y) if y_higher_better is None else y_higher_better
    # turn both axes into "higher is better"
    xs = pd.to_numeric(df[x], errors="coerce").to_numpy(dtype=float) * (1 if xh else -1)
    ys = pd.to_numeric(df[y], errors="coerce").to_numpy(dtype=float) * (1 if yh else -1)
    ok = np.isfinite(xs) & np.isfinite(ys)
    xs_ok, ys_ok = xs[ok], ys[ok]
    # O(n²) by broadcasting: clear, and a comparison holds hundreds of rows, not millions
    ge = (xs_ok[None, :] >= xs_ok[:, None]) & (ys_ok[None, :] >= ys_ok[:, None])
    gt = (xs_ok[None, :] > xs_ok[:, None]) | (ys_ok[None, :] > ys_ok[:, None])
    dominated = (ge & gt).any(axis=1)
    mask = np.zeros(len(df), dtype=bool)
    mask[np.flatnonzero(ok)[~dominated]] = True
    return pd.Series(mask, index=df.index)


_SLO_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|=)\s*([-+0-9.eE]+|inf)\s*$")


@dataclass(frozen=True)
class Slo:
    """One objective: ``metric <= bound`` (``upper``) or ``metric >= bound``."""

    metric: str
    bound: float
    upper: bool

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft_p99_ms=2000`` (``=`` bounds in the metric's good direction: an upper bound on a
        latency, a lower bound on a throughput), ``itl_p99_ms<=100``, ``output_tok_s>=100``."""
        m = _SLO_RE.match(text)
        value = None
        if m is not None:
            try:
                value = float(m.group(3))
            except ValueError:
                value = None
        if m is None or value is None or math.isnan(value):
            raise CompareError(f"--slo {text!r}: expected METRIC=VALUE, METRIC<=VALUE or METRIC>=VALUE "
                               "with a number, e.g. --slo ttft_p99_ms=2000 or --slo 'output_tok_s>=100'")
        op = m.group(2)
        upper = lower_is_better(m.group(1)) if op == "=" else op == "<="
        return cls(m.group(1), value, upper)

    def met(self, df: pd.DataFrame) -> pd.Series:
        """Which rows meet it; a missing value meets nothing."""
        values = pd.to_numeric(df[self.metric], errors="coerce")
        return (values <= self.bound) if self.upper else (values >= self.bound)

    def shortfall(self, df: pd.DataFrame) -> pd.Series:
        """How far each row misses it, relative to the bound (0 when met, inf when missing)."""
        values = pd.to_numeric(df[self.metric], errors="coerce").astype(float)
        excess = (values - self.bound) if self.upper else (self.bound - values)
        scale = abs(self.bound) or 1.0
        return (excess.clip(lower=0) / scale).fillna(math.inf)

    def __str__(self) -> str:
        return f"{self.metric}{'<=' if self.upper else '>='}{self.bound:g}"


def slo_metrics(df: pd.DataFrame) -> list[str]:
    """The names an SLO may use on this frame: its numeric measurement columns."""
    return sorted(c for c in df.columns if c not in _DESCRIPTIVE and pd.api.types.is_numeric_dtype(df[c]))


def check_slos(df: pd.DataFrame, slos: Iterable[Slo]) -> None:
    valid = slo_metrics(df)
    for slo in slos:
        if slo.metric not in valid:
            raise CompareError(f"--slo {slo}: unknown metric {slo.metric!r}; valid metrics here: "
                               f"{', '.join(valid)}")


@dataclass(frozen=True)
class SloChoice:
    """The answer to "what is best under these SLOs": ``best`` (a row of the frame) when some valid
    candidate meets every SLO; otherwise ``closest``, the valid candidate missing them by the least (the
    largest relative shortfall over the SLOs, smallest first; ties to the higher tok/s per GPU), with
    ``misses`` saying by how much, per SLO. Both None when no candidate is valid. ``among`` says which
    rows were candidates: ``measured``, or ``predicted`` when the frame has no measured row."""

    best: pd.Series | None
    closest: pd.Series | None
    misses: dict[str, float]
    among: str
    runner_up: pd.Series | None = None  # the next best that meets every SLO
    verdict: Verdict | None = None  # whether ``best`` beats it beyond the noise of both


def _estimate(row: pd.Series) -> Estimate:
    """A row's tok/s per GPU with its interval (the window's relative interval of its throughput)."""
    rel = row.get("output_tok_s_ci95_rel")
    return Estimate.scaled(float(row["tok_s_per_gpu"]), None if pd.isna(rel) else float(rel))


def best_under(df: pd.DataFrame, slos: Sequence[Slo]) -> SloChoice:
    """The highest output tok/s per GPU among the valid rows that meet every SLO (see :class:`SloChoice`).
    Measured rows are the candidates whenever there are any: a prediction is not evidence, and a
    trial's ``pred/`` row must not win over the measurement of the same configuration. Raises
    :class:`CompareError` for an SLO on a metric the frame does not have."""
    check_slos(df, slos)
    among = "measured" if (df["kind"] == "measured").any() else "predicted"
    candidates = df[df["kind"] == among]
    valid = candidates[candidates["valid"].astype(bool)]
    meets = pd.Series(True, index=valid.index)
    for slo in slos:
        meets &= slo.met(valid)
    ok = valid[meets & valid["tok_s_per_gpu"].notna()]
    if not ok.empty:
        ranked = ok.sort_values("tok_s_per_gpu", ascending=False, kind="stable")
        if len(ranked) < 2:
            return SloChoice(ranked.iloc[0], None, {}, among)
        best, second = ranked.iloc[0], ranked.iloc[1]
        return SloChoice(best, None, {}, among, second, judge([_estimate(best), _estimate(second)]))
    if valid.empty:
        return SloChoice(None, None, {}, among)
    gaps = pd.DataFrame({str(slo): slo.shortfall(valid) for slo in slos}, index=valid.index)
    ranked = valid.assign(_gap=gaps.max(axis=1), _neg=-valid["tok_s_per_gpu"].fillna(-math.inf))
    idx = ranked.sort_values(["_gap", "_neg"], kind="stable").index[0]
    return SloChoice(None, valid.loc[idx], {k: float(v) for k, v in gaps.loc[idx].items() if v > 0}, among)


# ---- terminal ---------------------------------------------------------------------------------------

def _fmt(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    if math.isnan(v):
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _source(row: pd.Series) -> str:
    """``sglang`` (measured on GPUs), ``sim`` (measured over HTTP on the simulated engine) or ``pred``
    (the simulator's prediction in virtual time)."""
    return "pred" if row["kind"] == "predicted" else str(row["engine"])


def _cut(text: str, width: int) -> str:
    """Cut in the middle: the sweep id at the front and the last override at the end both stay."""
    if len(text) <= width:
        return text
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + "…" + text[len(text) - tail:]


def compare_table(df: pd.DataFrame, title: str, width: int = TABLE_WIDTH) -> Table:
    """The rows as a table at most ``width`` columns wide: the numbers are never cut, the run labels
    are (their full text is in the CSV)."""
    headers = ["source", "GPUs", "C", "valid", "tok/s", "tok/s\n/GPU", "tok/s\n/user", "TTFT\np99 ms",
               "ITL\np99 ms"]
    with_energy = df["j_per_output_token"].notna().any()
    if with_energy:
        headers.append("J/tok")
    rows = []
    for _, row in df.iterrows():
        cells = [_source(row), str(row["gpus"]), str(row["concurrency"]), "yes" if row["valid"] else "NO",
                 _fmt(row["output_tok_s"]), _fmt(row["tok_s_per_gpu"]), _fmt(row["tok_s_per_user"]),
                 _fmt(row["ttft_p99_ms"]), _fmt(row["itl_p99_ms"])]
        rows.append((str(row["label"]), cells + ([_fmt(row["j_per_output_token"])] if with_energy else []),
                     bool(row["valid"])))
    widths = [max([len(line) for line in h.split("\n")] + [len(cells[i]) for _, cells, _ in rows])
              for i, h in enumerate(headers)]
    # what is left for the label once every number has its width and each column its 2-character gap
    budget = max(width - sum(widths) - 2 * len(widths), 8)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1, 0, 0), show_edge=False)
    table.add_column("run", no_wrap=True, max_width=budget)
    for i, header in enumerate(headers):
        justify = "left" if i in (0, 3) else "right"  # source and valid are words
        table.add_column(header, justify=justify, no_wrap=True, min_width=widths[i])
    for label, cells, valid in rows:
        table.add_row(escape(_cut(label, budget)), *cells, style=None if valid else "dim")
    return table


def _describe_row(row: pd.Series) -> str:
    origin = {"pred": "predicted by the simulator, not measured",
              "sim": "measured on the simulated engine, not a GPU"}.get(_source(row),
                                                                       f"measured, {row['engine']}")
    return (f"{row['label']} at concurrency {row['concurrency']} ({origin}): {_fmt(row['tok_s_per_gpu'])} "
            f"tok/s per GPU ({_fmt(row['output_tok_s'])} tok/s on {row['gpus']} GPU(s)), "
            f"TTFT p99 {_fmt(row['ttft_p99_ms'])} ms, ITL p99 {_fmt(row['itl_p99_ms'])} ms; "
            f"run {row['run_id']}")


def print_choice(choice: SloChoice, slos: Sequence[Slo], console: Console) -> None:
    wanted = f"{', '.join(str(s) for s in slos)} (among {choice.among} rows)"
    if choice.best is not None:
        console.print(f"Best under {wanted}: " + escape(_describe_row(choice.best)))
        if choice.runner_up is not None and choice.verdict is not None:
            nxt = escape(_describe_row(choice.runner_up))
            if choice.verdict.clear:
                console.print(f"  ahead of the next, beyond the noise of both: {nxt}")
            else:
                console.print(f"  {choice.verdict.text()} of the next, so not measurably better: {nxt}")
    elif choice.closest is not None:
        misses = ", ".join(f"{k} by {v * 100:.0f} %" for k, v in choice.misses.items())
        console.print(f"No valid configuration meets {wanted}. Closest: "
                      + escape(_describe_row(choice.closest)) + f"; misses {misses}")
    else:
        console.print(f"No valid configuration meets {wanted}: no {choice.among} row is valid (the load "
                      "generator fell behind at every point)")


# ---- plots ------------------------------------------------------------------------------------------

SERIES_STYLE = {"measured": {"marker": "o", "linestyle": "-"},
                "predicted": {"marker": "^", "linestyle": "--"}}


def _series_name(label: str, kind: str, engine: str) -> str:
    if kind == "predicted":
        return f"{label} (predicted, simulator)"
    return f"{label} (sim engine)" if engine == "sim" else label


def _title(base: str, df: pd.DataFrame) -> str:
    if not df["simulated"].any():
        return base
    what = []
    if (df["kind"] == "predicted").any():
        what.append("predictions")
    if ((df["kind"] == "measured") & df["simulated"]).any():
        what.append("the simulated engine")
    return f"{base}\nincludes simulated numbers ({' and '.join(what)}), not GPU measurements"


def _colours(df: pd.DataFrame) -> dict[str, Any]:
    cmap = plt.get_cmap("tab20" if df["label"].nunique() > 10 else "tab10")
    return {label: cmap(i % cmap.N) for i, label in enumerate(dict.fromkeys(df["label"]))}


def _save(fig: Any, path: Path, title: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # the title also goes into the PNG's Title chunk, so a script can tell simulated plots apart
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Title": title.replace("\n", " — ")})
    plt.close(fig)
    return path


def _legend(ax: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="x-small")


def _series(df: pd.DataFrame) -> Iterable[tuple[str, pd.DataFrame]]:
    for (label, kind, engine), part in df.groupby(["label", "kind", "engine"], sort=False):
        yield _series_name(str(label), str(kind), str(engine)), part.sort_values("concurrency")


def plot_throughput(df: pd.DataFrame, path: Path) -> Path:
    """Output tok/s against concurrency, a line per run (predictions dashed)."""
    colours = _colours(df)
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for name, part in _series(df):
        ax.plot(part["concurrency"], part["output_tok_s"], color=colours[part["label"].iloc[0]],
                label=name, **SERIES_STYLE[part["kind"].iloc[0]])
    xs = sorted(df["concurrency"].unique())
    if xs[-1] >= 8 * xs[0]:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])  # the load points themselves
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    title = _title("output throughput against concurrency", df)
    ax.set(xlabel="concurrency", ylabel="output tok/s", title=title)
    _legend(ax)
    return _save(fig, path, title)


def plot_latency(df: pd.DataFrame, path: Path) -> Path:
    """TTFT p99 and ITL p99 against output tok/s, a line per run."""
    colours = _colours(df)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    panels = (("ttft_p99_ms", "TTFT p99"), ("itl_p99_ms", "ITL p99"))
    for ax, (metric, name) in zip(axes, panels, strict=True):
        for series, part in _series(df):
            ax.plot(part["output_tok_s"], part[metric], color=colours[part["label"].iloc[0]], label=series,
                    **SERIES_STYLE[part["kind"].iloc[0]])
        ax.set(xlabel="output tok/s", ylabel=f"{name}, ms", title=name)
        values = pd.to_numeric(df[metric], errors="coerce")
        values = values[values > 0]
        if not values.empty and values.max() >= 10 * values.min():  # a log axis only for a wide range
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    title = _title("latency against throughput", df)
    fig.suptitle(title)
    _legend(axes[1])
    return _save(fig, path, title)


def plot_pareto(df: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str, path: Path) -> Path:
    """Every row as a point (measured ●, predicted ▲, invalid hollow), coloured by run, and the Pareto
    front of the valid rows of each kind joined by a line, its points named by concurrency."""
    colours = _colours(df)
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    for name, part in _series(df):
        style = SERIES_STYLE[part["kind"].iloc[0]]
        colour = colours[part["label"].iloc[0]]
        for valid, sub in part.groupby("valid"):
            ax.scatter(sub[x], sub[y], marker=style["marker"], s=36,
                       label=name if valid else f"{name}, invalid",
                       facecolors=colour if valid else "none", edgecolors=colour)
    for kind, line in (("measured", "-"), ("predicted", "--")):
        rows = df[(df["kind"] == kind) & df["valid"]]
        if rows.empty:
            continue
        front = rows[pareto_front(rows, x, y)].sort_values(x)
        if front.empty:
            continue
        ax.plot(front[x], front[y], color="black", linestyle=line, linewidth=1, zorder=0,
                label=f"Pareto front ({kind})")
        for _, row in front.drop_duplicates([x, y]).iterrows():  # equal runs share one label
            ax.annotate(f"c{row['concurrency']}", (row[x], row[y]), textcoords="offset points", xytext=(4, 4),
                        fontsize="x-small")
    ax.grid(alpha=0.3)
    better = "lower" if lower_is_better(x) else "higher"
    title = _title(f"{ylabel} against {xlabel} ({better} x is better; invalid points hollow)", df)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    _legend(ax)
    return _save(fig, path, title)


def write_plots(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """throughput.png, latency.png, pareto_per_user.png, pareto_ttft.png in ``out_dir``."""
    return [plot_throughput(df, out_dir / "throughput.png"),
            plot_latency(df, out_dir / "latency.png"),
            plot_pareto(df, "tok_s_per_user", "tok_s_per_gpu", "output tok/s per user",
                        "output tok/s per GPU", out_dir / "pareto_per_user.png"),
            plot_pareto(df, "ttft_p99_ms", "tok_s_per_gpu", "TTFT p99, ms", "output tok/s per GPU",
                        out_dir / "pareto_ttft.png")]


# ---- command line -----------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        self.exit(2, f"compare: {message} (see python -m analysis compare --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m analysis compare",
                description="Trials of several sweeps side by side: a table, a CSV, plots, Pareto fronts "
                            "and the best configuration under SLOs. Selectors combine as an intersection.")
    p.add_argument("--experiment", help="an MLflow experiment's name (default: every experiment)")
    p.add_argument("--sweep", action="append", default=[], metavar="RUN_ID",
                   help="a sweep run's id, or a unique prefix of it (repeatable): its trials")
    p.add_argument("--filter", default="", metavar="FILTER",
                   help="an MLflow filter string on the trial runs, e.g. \"params.`pp.size` = '8'\"")
    p.add_argument("--tracking-uri", help="the MLflow store (default: sqlite:///<cwd>/runs/mlflow.db)")
    p.add_argument("--with-predictions", action="store_true",
                   help="also a 'predicted' row per measured point from its pred/ metrics")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC=VALUE",
                   help="a service-level objective (repeatable): ttft_p99_ms=2000 (upper bound on a "
                        "latency), 'output_tok_s>=100', 'itl_p99_ms<=50'")
    p.add_argument("--csv", type=Path, metavar="PATH", help="write every column of every row here")
    plots = p.add_mutually_exclusive_group()
    plots.add_argument("--out", type=Path, metavar="DIR",
                       help="where the PNG plots go (default: compare-<timestamp>/ in the cwd)")
    plots.add_argument("--no-plots", action="store_true",
                       help="write no PNG plots (only the table, and the CSV with --csv)")
    return p


def _console() -> Console:
    if sys.stdout.isatty():
        return Console(width=min(shutil.get_terminal_size().columns, TABLE_WIDTH))
    return Console(width=TABLE_WIDTH)


def run(args: argparse.Namespace) -> None:
    slos = [Slo.parse(text) for text in args.slo]
    df = load_rows(args.tracking_uri, experiment=args.experiment, sweeps=args.sweep,
                   filter_string=args.filter, with_predictions=args.with_predictions)
    check_slos(df, slos)
    console = _console()
    n_runs, n_sweeps = df["run_id"].nunique(), df["sweep_id"].nunique()
    console.print(compare_table(df, f"{len(df)} load point(s) of {n_runs} run(s) in {n_sweeps} sweep(s)",
                                console.width))
    notes = ["source: sglang = measured on GPUs, sim = measured on the simulated engine, pred = the "
             "simulator's prediction; tok/s/user = 1000 / TPOT p50 (else tok/s / C)"]
    if not df["valid"].all():
        notes.append("valid NO = the load generator fell behind at that point: not a server number")
    for note in notes:
        console.print(note, style="dim")
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.csv, index=False)
        console.print(f"CSV: {args.csv}", soft_wrap=True)
    if not args.no_plots:
        out = args.out or Path.cwd() / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
        paths = write_plots(df, out)
        console.print(f"Plots: {out}/ ({', '.join(p.name for p in paths)})", soft_wrap=True)
    if slos:
        print_choice(best_under(df, slos), slos, console)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        run(args)
    except CompareError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    return 0
