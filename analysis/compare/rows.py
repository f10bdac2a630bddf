"""The rows: runs found in the MLflow store (by sweep, experiment or filter), one row per run and
closed-loop load point, with the derived columns (tokens per GPU, per user) and a label per configuration."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.compare.columns import CORE_COLUMNS, PREDICTED_ENGINE, CompareError
from analysis.store import StoreError, checked_store, default_tracking_uri, masked
from analysis.store import client as store_client
from vocab.metric_keys import Prefix, point_metrics
from vocab.status import RunKind, Tag, TrialStatus, simulated


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
    df["simulated"] = (df["kind"] == "predicted") | df["engine"].map(simulated).astype(bool)
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
