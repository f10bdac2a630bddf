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

The package is read in the order of a run: ``columns`` (what a row is), ``rows`` (from the store),
``slo`` (Pareto fronts and the choice under SLOs), ``table`` (the terminal), ``plots``, ``cli``.
"""

from __future__ import annotations

from analysis.compare.cli import main, run
from analysis.compare.columns import (
    CORE_COLUMNS,
    PREDICTED_ENGINE,
    TABLE_WIDTH,
    CompareError,
    lower_is_better,
)
from analysis.compare.plots import plot_latency, plot_pareto, plot_throughput, write_plots
from analysis.compare.rows import load_rows
from analysis.compare.slo import Slo, SloChoice, best_under, check_slos, pareto_front, slo_metrics
from analysis.compare.table import compare_table, print_choice

__all__ = [
    "CORE_COLUMNS",
    "PREDICTED_ENGINE",
    "TABLE_WIDTH",
    "CompareError",
    "Slo",
    "SloChoice",
    "best_under",
    "check_slos",
    "compare_table",
    "load_rows",
    "lower_is_better",
    "main",
    "pareto_front",
    "plot_latency",
    "plot_pareto",
    "plot_throughput",
    "print_choice",
    "run",
    "slo_metrics",
    "write_plots",
]
