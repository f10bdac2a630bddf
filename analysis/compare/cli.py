"""``python -m analysis compare``'s command line: its arguments, and the run from the store to the table,
the CSV, the plots and the SLO choice."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from analysis.compare.columns import TABLE_WIDTH, CompareError
from analysis.compare.plots import write_plots
from analysis.compare.rows import load_rows
from analysis.compare.slo import Slo, best_under, check_slos
from analysis.compare.table import compare_table, print_choice


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
