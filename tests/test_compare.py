"""``python -m analysis compare``: the Pareto front and the SLO choice on constructed frames (fast), and
the whole command on real sweeps in a scratch sqlite store (slow): two ``predict=true`` sweeps and one
live sweep on the simulated engine, read back through MLflow."""

from __future__ import annotations

import io
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from rich.console import Console

from analysis.compare import (
    CompareError,
    Slo,
    best_under,
    compare_table,
    load_rows,
    main,
    pareto_front,
    write_plots,
)
from tests.conftest import NO_DRAWING, ROOT, run_cli

# ---- constructed frames -------------------------------------------------------------------------


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows with the columns the table, the plots and the SLO choice read; per GPU derived here."""
    defaults = {"kind": "measured", "engine": "sglang", "gpus": 1, "concurrency": 1, "valid": True,
                "ttft_p99_ms": 100.0, "itl_p99_ms": 10.0, "j_per_output_token": np.nan,
                "tok_s_per_user": 50.0, "run_id": "r"}
    df = pd.DataFrame([{**defaults, **row} for row in rows])
    df["tok_s_per_gpu"] = df["output_tok_s"] / df["gpus"]
    df["simulated"] = (df["kind"] == "predicted") | df["engine"].isin(["sim", "sim-predict"])
    if "label" not in df:
        df["label"] = [f"run{i}" for i in range(len(df))]
    return df


def brute_front(xs: list[float], ys: list[float], x_high: bool, y_high: bool) -> list[bool]:
    """The definition, one pair at a time: i is on the front unless some j is no worse on both axes and
    strictly better on one."""
    sx, sy = (1 if x_high else -1), (1 if y_high else -1)
    out = []
    for i in range(len(xs)):
        if math.isnan(xs[i]) or math.isnan(ys[i]):
            out.append(False)
            continue
        dominated = any(
            not (math.isnan(xs[j]) or math.isnan(ys[j]))
            and sx * xs[j] >= sx * xs[i] and sy * ys[j] >= sy * ys[i]
            and (sx * xs[j] > sx * xs[i] or sy * ys[j] > sy * ys[i])
            for j in range(len(xs)))
        out.append(not dominated)
    return out


def test_pareto_front_small_case() -> None:
    df = pd.DataFrame({"tok_s_per_user": [10, 20, 15, 20, 5, np.nan],
                       "tok_s_per_gpu": [100, 50, 40, 50, 100, 999]})
    mask = pareto_front(df, "tok_s_per_user", "tok_s_per_gpu")
    # (15, 40) is dominated by (20, 50); (5, 100) by (10, 100); the two equal (20, 50) both stay;
    # a row with a missing value is never on the front and dominates nothing
    assert mask.tolist() == [True, True, False, True, False, False]
    assert mask.index.equals(df.index)


def test_pareto_front_latency_axis_is_lower_better() -> None:
    df = pd.DataFrame({"ttft_p99_ms": [50.0, 100.0, 200.0, 80.0], "tok_s_per_gpu": [10.0, 30.0, 20.0, 5.0]},
                      index=[7, 8, 9, 10])
    assert pareto_front(df, "ttft_p99_ms", "tok_s_per_gpu").tolist() == [True, True, False, False]
    # the direction can be forced: higher TTFT "better" makes the slowest point a front point
    forced = pareto_front(df, "ttft_p99_ms", "tok_s_per_gpu", x_higher_better=True)
    assert forced.tolist() == [False, True, True, False]


@pytest.mark.parametrize(("x_high", "y_high"), list(itertools.product([True, False], repeat=2)))
def test_pareto_front_matches_the_definition(x_high: bool, y_high: bool) -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 40))
        # a coarse grid so that ties happen often
        xs = rng.integers(0, 8, n).astype(float)
        ys = rng.integers(0, 8, n).astype(float)
        xs[rng.random(n) < 0.1] = np.nan
        df = pd.DataFrame({"a": xs, "b": ys})
        got = pareto_front(df, "a", "b", x_higher_better=x_high, y_higher_better=y_high).tolist()
        assert got == brute_front(xs.tolist(), ys.tolist(), x_high, y_high)


def test_slo_parse() -> None:
    assert Slo.parse("ttft_p99_ms=2000") == Slo("ttft_p99_ms", 2000.0, upper=True)
    # "=" bounds in the good direction: a floor on a throughput
    assert Slo.parse("output_tok_s=100") == Slo("output_tok_s", 100.0, upper=False)
    assert Slo.parse("output_tok_s>=1e3") == Slo("output_tok_s", 1000.0, upper=False)
    assert Slo.parse(" itl_p99_ms <= 50.5 ") == Slo("itl_p99_ms", 50.5, upper=True)
    assert str(Slo.parse("ttft_p99_ms=2000")) == "ttft_p99_ms<=2000"
    for bad in ("ttft_p99_ms", "ttft_p99_ms=", "=5", "ttft_p99_ms=abc", "ttft_p99_ms<5", "a=nan", "x=1.2.3"):
        with pytest.raises(CompareError, match="--slo") as err:
            Slo.parse(bad)
        assert "\n" not in str(err.value)


def test_best_under_picks_the_highest_per_gpu_row_that_meets_every_slo() -> None:
    df = frame([
        {"label": "a", "output_tok_s": 1000.0, "gpus": 2, "ttft_p99_ms": 150.0},  # 500/GPU, TTFT too high
        {"label": "b", "output_tok_s": 900.0, "gpus": 2, "ttft_p99_ms": 90.0, "itl_p99_ms": 30.0},  # 450/GPU
        {"label": "c", "output_tok_s": 800.0, "gpus": 1, "ttft_p99_ms": 90.0, "valid": False},  # invalid
        {"label": "d", "output_tok_s": 400.0, "gpus": 1, "ttft_p99_ms": 50.0, "itl_p99_ms": 15.0},
        {"label": "e", "output_tok_s": 300.0, "gpus": 1, "ttft_p99_ms": 50.0, "itl_p99_ms": 10.0},
    ])
    ttft = Slo.parse("ttft_p99_ms=100")
    choice = best_under(df, [ttft, Slo.parse("itl_p99_ms=20")])
    assert choice.best is not None and choice.best["label"] == "d"
    assert choice.closest is None and choice.among == "measured"
    assert best_under(df, [ttft, Slo.parse("itl_p99_ms<=12")]).best["label"] == "e"
    assert best_under(df, [ttft]).best["label"] == "b"
    assert best_under(df, []).best["label"] == "a"  # no SLO: the best valid row, never the invalid c
    assert best_under(df, [Slo.parse("output_tok_s>=850"), ttft]).best["label"] == "b"
    assert best_under(df, [Slo.parse("output_tok_s>=950"), ttft]).best is None


def test_best_under_reports_the_closest_when_nothing_meets() -> None:
    df = frame([
        {"label": "far", "output_tok_s": 1000.0, "ttft_p99_ms": 400.0},  # 300 % over
        {"label": "near", "output_tok_s": 500.0, "ttft_p99_ms": 120.0},  # 20 % over
        {"label": "invalid", "output_tok_s": 500.0, "ttft_p99_ms": 10.0, "valid": False},
    ])
    choice = best_under(df, [Slo.parse("ttft_p99_ms=100")])
    assert choice.best is None and choice.closest is not None
    assert choice.closest["label"] == "near"
    assert choice.misses == pytest.approx({"ttft_p99_ms<=100": 0.2})
    # a metric missing on a row misses by infinitely much
    df.loc[df["label"] == "near", "ttft_p99_ms"] = np.nan
    assert best_under(df, [Slo.parse("ttft_p99_ms=100")]).closest["label"] == "far"
    # nothing valid: no answer at all
    assert best_under(frame([{"output_tok_s": 1.0, "valid": False}]), []).closest is None


def test_best_under_prefers_measured_rows_and_rejects_unknown_metrics() -> None:
    df = frame([
        {"label": "x", "output_tok_s": 100.0},
        {"label": "x", "kind": "predicted", "engine": "sim-predict", "output_tok_s": 900.0},
    ])
    choice = best_under(df, [])
    assert choice.best["kind"] == "measured" and choice.among == "measured"
    only_predicted = df[df["kind"] == "predicted"]
    assert best_under(only_predicted, []).among == "predicted"
    with pytest.raises(CompareError, match=r"unknown metric 'ttft_p42_ms'.*ttft_p99_ms"):
        best_under(df, [Slo.parse("ttft_p42_ms=5")])


def test_table_fits_100_columns_with_long_labels() -> None:
    long = "0a1b2c " + " ".join(f"server.some_long_option_{i}=value{i}" for i in range(6))
    df = frame([{"label": long, "output_tok_s": 123456.7, "gpus": 8, "concurrency": 1024,
                 "j_per_output_token": 0.0123, "ttft_p99_ms": 12345.6, "valid": False},
                {"label": "short", "output_tok_s": 1.5, "kind": "predicted", "engine": "sim-predict"}])
    for width in (100, 80):
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(compare_table(df, "title", width))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width
        # the label is cut in the middle (sweep id and last override stay), never wrapped onto more lines
        assert "…" in text and (("0a1b2c" in text and "value5" in text) or width < 100)
        # the numbers are never cut
        for number in ("123457", "15432", "12346", "0.01", "1024", "NO", "pred", "sglang"):
            assert number in text, (number, text)
        assert len(text.splitlines()) == 1 + 2 + 1 + 2  # title, 2-line header, rule, a line per row


@pytest.mark.slow  # draws the comparison's plots: about two seconds
def test_plots_mark_simulated_numbers(tmp_path: Path) -> None:
    series = (("a", "measured", "sglang", 1.0), ("a", "predicted", "sim-predict", 1.2))
    df = frame([{"label": lab, "kind": kind, "engine": eng, "concurrency": c, "output_tok_s": 100.0 * c * k,
                 "tok_s_per_user": 100.0 / c, "ttft_p99_ms": 10.0 * c}
                for lab, kind, eng, k in series for c in (1, 4, 16)])
    paths = write_plots(df, tmp_path / "out")
    assert sorted(p.name for p in paths) == ["latency.png", "pareto_per_user.png", "pareto_ttft.png",
                                             "throughput.png"]
    for path in paths:
        with Image.open(path) as im:
            assert im.size[0] > 300 and "simulated numbers (predictions)" in im.text["Title"]
    measured_only = write_plots(df[df["kind"] == "measured"], tmp_path / "m")
    with Image.open(measured_only[0]) as im:
        assert "simulated" not in im.text["Title"]


def test_bad_store_and_slo_give_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    (tmp_path / "text.db").write_text("not a database\n")
    cases = [
        (["--tracking-uri", f"sqlite:///{tmp_path}/none.db"], "no MLflow store at"),
        (["--tracking-uri", f"sqlite:///{tmp_path}/text.db"], "not an MLflow store"),
        (["--tracking-uri", "http://user:hunter2@127.0.0.1:9"], "cannot reach the MLflow server"),
        (["--slo", "ttft_p99_ms"], "--slo 'ttft_p99_ms'"),
    ]
    for argv, expected in cases:
        assert main([*argv, "--out", str(tmp_path / "plots")]) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and expected in err, err
        assert "hunter2" not in err  # a URL's password is never echoed
    assert not (tmp_path / "none.db").exists()  # a reading command must not create a store
    assert not (tmp_path / "plots").exists()
    with pytest.raises(SystemExit) as exited:
        main(["--no-plots", "--out", str(tmp_path / "plots")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1 and "--no-plots" in err, err
    with pytest.raises(SystemExit) as exited:
        main(["--no-such-flag"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1 and "--no-such-flag" in err


# ---- real sweeps (slow) ---------------------------------------------------------------------------

# Enough requests per point that the client keeps the concurrency up, so the points are valid.
# The sweeps draw nothing at their end: compare draws its own plots from the store. Predicted points
# run 10 s of the engine's virtual time rather than 60: compare reads what was logged, however long.
WORKLOAD = ["model=tiny-test", "workload=tiny", "workload.concurrency=[1,4,16]",
            "workload.requests_per_concurrency=8", "workload.output_len=32", "workload.predicted.budget_s=10",
            *NO_DRAWING]
# keyed by the end of each sweep run's name (the swept override)
SWEEPS = {
    "pp.size=1,2": ["-m", "predict=true", *WORKLOAD, "pp.size=1,2"],
    "pp.async_depth=0,4": ["-m", "predict=true", *WORKLOAD, "pp.size=2", "pp.async_depth=0,4"],
    "pp.async_depth=0,2": ["-m", *WORKLOAD, "parallelism=pp2", "ray.num_cpus=2", "pp.async_depth=0,2"],
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], list]:
    workdir = tmp_path_factory.mktemp("compare")
    for args in SWEEPS.values():
        result = run_cli(args, workdir, timeout=600, store=True)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'runs' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    sweep_runs = [r for r in runs if r.data.tags.get("parasweep.kind") == "sweep"]
    sweep_ids = {key: r.info.run_id for key in SWEEPS for r in sweep_runs if r.info.run_name.endswith(key)}
    assert len(sweep_runs) == len(sweep_ids) == len(SWEEPS)
    trials = [r for r in runs if r.data.tags.get("parasweep.kind") in ("trial", "prediction")]
    return workdir, sweep_ids, trials


def compare_cli(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analysis", "compare", *args], cwd=workdir, text=True,
                          capture_output=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


def closed_points(run, prefix: str = "") -> dict[int, dict[str, float]]:
    """c<C> -> metrics, read straight from the run (not through analysis.compare)."""
    out: dict[int, dict[str, float]] = {}
    for key, value in run.data.metrics.items():
        parts = key.split("/")
        if prefix:
            if parts[0] != prefix:
                continue
            parts = parts[1:]
        if len(parts) == 2 and parts[0].startswith("c") and parts[0][1:].isdigit():
            out.setdefault(int(parts[0][1:]), {})[parts[1]] = value
    return out


def world(run) -> int:
    p = run.data.params
    return int(p["tp.size"]) * int(p["pp.size"]) * int(p["dp.size"])


@pytest.mark.slow
def test_table_csv_and_plots(store, tmp_path: Path) -> None:
    workdir, _sweeps, trials = store
    csv, out = tmp_path / "all.csv", tmp_path / "plots"
    result = compare_cli(workdir, "--with-predictions", "--csv", str(csv), "--out", str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # not a TTY: at most 100 columns, whatever COLUMNS says (the CSV and plot paths may run longer)
    assert all(len(line) <= 100 for line in lines if not line.startswith(("CSV:", "Plots:"))), result.stdout
    assert "pp.async_depth=2" in result.stdout and "pp.size=1" in result.stdout
    df = pd.read_csv(csv)
    expected = sum(len(closed_points(r)) for r in trials)
    expected += sum(len(closed_points(r, "pred")) for r in trials if r.data.tags["parasweep.kind"] == "trial")
    assert len(df) == expected > 0
    assert set(df["kind"]) == {"measured", "predicted"}
    assert set(df.loc[df["kind"] == "measured", "engine"]) == {"sim"} and df["simulated"].all()
    # every row is what its run logged: throughput, per GPU over tp x pp x dp, per user from TPOT p50
    by_id = {r.info.run_id: r for r in trials}
    for row in df.itertuples():
        run = by_id[row.run_id]
        pred = row.kind == "predicted" and run.data.tags["parasweep.kind"] == "trial"
        logged = closed_points(run, "pred" if pred else "")[row.concurrency]
        assert row.output_tok_s == pytest.approx(logged["output_tok_s"])
        assert row.gpus == world(run)
        assert row.tok_s_per_gpu == pytest.approx(logged["output_tok_s"] / world(run))
        if logged.get("tpot_p50_ms", 0.0) > 0:
            assert row.tok_s_per_user == pytest.approx(1000.0 / logged["tpot_p50_ms"])
            assert row.tok_s_per_user_from == "tpot_p50_ms"
        else:  # a busy client may see a request's tokens arrive together: no TPOT to go by
            assert row.tok_s_per_user_from == "output_tok_s/concurrency"
            assert row.tok_s_per_user == pytest.approx(logged["output_tok_s"] / row.concurrency)
        assert row.ttft_p99_ms == pytest.approx(logged["ttft_p99_ms"])
    # three sweeps: each label starts with its sweep's id prefix
    assert all(lab.split()[0] == sid[:6] for lab, sid in zip(df["label"], df["sweep_id"], strict=True))
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["latency.png", "pareto_per_user.png", "pareto_ttft.png", "throughput.png"]
    for path in out.glob("*.png"):
        with Image.open(path) as im:
            assert "simulated" in im.text["Title"]


@pytest.mark.slow
def test_slo_picks_the_expected_row(store, tmp_path: Path) -> None:
    workdir, _sweeps, trials = store
    measured = [r for r in trials if r.data.tags["parasweep.kind"] == "trial"]
    rows = [(r.info.run_id, c, m["output_tok_s"] / world(r), m["ttft_p99_ms"])
            for r in measured for c, m in closed_points(r).items() if m["valid"] == 1.0]
    if not rows:
        # a busy machine: the load generator fell behind at every live point (they are marked invalid,
        # correctly), and compare must say that rather than pick a row
        busy = compare_cli(workdir, "--slo", "ttft_p99_ms=1000", "--no-plots")
        assert busy.returncode == 0, busy.stderr
        assert ("no measured row is valid (the load generator fell behind at every point)"
                in " ".join(busy.stdout.split()))
        return
    # a bound that some valid measured points meet and some do not
    bound = float(np.median([ttft for *_, ttft in rows]))
    run_id, conc, per_gpu, _ = max((row for row in rows if row[3] <= bound), key=lambda row: row[2])
    result = compare_cli(workdir, "--slo", f"ttft_p99_ms={bound!r}", "--out", str(tmp_path / "p"))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # rich wraps long lines at 100 columns
    assert f"Best under ttft_p99_ms<={bound:g} (among measured rows)" in text
    assert f"at concurrency {conc} (measured on the simulated engine, not a GPU)" in text
    assert f"run {run_id}" in text and f"{per_gpu:.0f} tok/s per GPU" in text

    none = compare_cli(workdir, "--slo", "ttft_p99_ms=0.000001", "--no-plots")
    assert none.returncode == 0, none.stderr
    assert "Plots:" not in none.stdout and not list(workdir.glob("compare-*"))  # --no-plots: no PNGs
    assert "No valid configuration meets ttft_p99_ms<=1e-06" in " ".join(none.stdout.split())
    assert "Closest:" in none.stdout and "misses ttft_p99_ms<=1e-06 by" in " ".join(none.stdout.split())


@pytest.mark.slow
def test_selection_by_sweep_filter_and_experiment(store) -> None:
    workdir, sweeps, trials = store
    uri = f"sqlite:///{workdir / 'runs' / 'mlflow.db'}"
    a, b = sweeps["pp.size=1,2"], sweeps["pp.async_depth=0,4"]
    both = load_rows(uri, sweeps=[a, b[:8]])  # a unique prefix works too
    assert set(both["sweep_id"]) == {a, b} and set(both["kind"]) == {"predicted"}
    assert set(both["engine"]) == {"sim-predict"}
    one = load_rows(uri, sweeps=[a])
    assert set(one["overrides"]) == {"pp.size=1", "pp.size=2"}
    assert set(one["label"]) == {"pp.size=1", "pp.size=2"}  # one sweep: no id prefix needed
    assert set(one["gpus"]) == {1, 2}
    pp1 = load_rows(uri, experiment="parasweep", filter_string="params.`pp.size` = '1'")
    assert set(pp1["gpus"]) == {1} and set(pp1["run_id"]) == {
        r.info.run_id for r in trials if r.data.params["pp.size"] == "1"}
    # intersection: the filter within one sweep
    depth4 = load_rows(uri, sweeps=[b], filter_string="params.`pp.async_depth` = '4'")
    assert depth4["overrides"].unique().tolist() == ["pp.async_depth=4"]
    with pytest.raises(CompareError, match="empty selection"):
        load_rows(uri, sweeps=[b], filter_string="params.`pp.size` = '1'")
    trial_id = next(r.info.run_id for r in trials)
    with pytest.raises(CompareError, match="not a sweep"):
        load_rows(uri, sweeps=[trial_id])


@pytest.mark.slow
def test_bad_inputs_on_a_real_store(store, tmp_path: Path) -> None:
    workdir, sweeps, _ = store
    out = ["--out", str(tmp_path / "p")]
    cases = [
        (["--sweep", "0123456789abcdef0123456789abcdef"], "--sweep '0123456789abcdef0123456789abcdef'"),
        (["--experiment", "nope"], "no such experiment"),
        (["--filter", "params.`pp.size` = '64'"], "empty selection"),
        (["--filter", "this is not a filter"], "--filter"),
        (["--slo", "ttft_p42_ms=5"], "unknown metric 'ttft_p42_ms'"),
        (["--sweep", sweeps["pp.size=1,2"], "--slo", "energy=5"], "valid metrics here:"),
    ]
    for args, expected in cases:
        result = compare_cli(workdir, *args, *out)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr, result.stderr
        assert result.stdout == ""
    # an unreachable server fails within seconds, not after MLflow's minutes of retries
    result = compare_cli(workdir, "--tracking-uri", "http://127.0.0.1:9", *out)
    assert result.returncode == 2 and "cannot reach" in result.stderr
    assert not (tmp_path / "p").exists()
