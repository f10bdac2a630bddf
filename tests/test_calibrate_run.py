"""Calibration from a run, closed loop: a sweep the simulated engine produced with known constants
perturbed is calibrated from the model's defaults, and the fit recovers the perturbed constants. Plus
the one-line errors for input it cannot use."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from orchestrator.calibrate import RUN_METRICS, fit_run, main, read_run, run_calibration
from orchestrator.config.schema import ParasweepConf
from orchestrator.store.tracking import Tracker
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan
from orchestrator.trial.run import TrialRunSettings, execute_trial
from simulator.calibration import load_calibration
from tests.conftest import sqlite_store
from vocab.hardware import load_hardware
from vocab.status import RunKind, Tag

pytestmark = pytest.mark.slow  # dozens of rounds of predictions

TRUE = {"eta_mem": 0.6, "sched_base_us": 1200.0}  # the defaults are 0.75 and 300


def trial_cfg(tmp_path: Path, pp: int, calibrated: bool) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.predict = True
    cfg.model.name, cfg.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    cfg.hardware = load_hardware("h100-sxm-x8")
    cfg.simulator.step_costs = "roofline"  # the constants perturbed below are the roofline's
    cfg.pp.size = pp
    cfg.workload.concurrency = [1, 8]
    cfg.workload.input_len, cfg.workload.output_len = 128, 32
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 2, 1
    # each round of the fit predicts every point again as the trial ran it: 10 s of the engine's
    # virtual time rather than the default 60 (a fit evaluates dozens of rounds)
    cfg.workload.predicted.budget_s = 10.0
    cfg.tracking.uri = sqlite_store(tmp_path / "mlflow.db")
    if calibrated:
        cfg.calibration.name, cfg.calibration.hardware = "perturbed", "h100-sxm-x8"
        cfg.calibration.params = {k: {"value": v, "source": "test"} for k, v in TRUE.items()}
    return cfg


def make_sweep(tmp_path: Path, calibrated: bool = True) -> tuple[str, str]:
    uri = sqlite_store(tmp_path / "mlflow.db")
    tracker = Tracker(uri, "calibrate")
    sweep = tracker.start_run("sweep", {Tag.KIND: RunKind.SWEEP.value})
    for num, pp in enumerate((1, 2)):
        cfg = trial_cfg(tmp_path, pp, calibrated)
        ident = TrialIdentity(num, f"pp.size={pp}", tmp_path / f"trial{num}", (f"pp.size={pp}",))
        settings = TrialRunSettings(uri, "calibrate", parent_run_id=sweep, own_progress_view=False)
        outcome = execute_trial(make_plan(cfg, checked_engine(cfg), ident), settings)
        assert outcome.status.succeeded, outcome.error
    return uri, sweep


def test_calibrate_recovers_perturbed_constants(tmp_path: Path) -> None:
    uri, sweep = make_sweep(tmp_path)
    trials = read_run(sweep, uri)
    assert len(trials) == 2 and all(set(t.measured) == {"c1", "c8"} for t in trials)
    # the recorded configs carry the perturbed profile: start from the model's defaults instead
    for t in trials:
        t.cfg.calibration.name, t.cfg.calibration.params = None, {}
    # c8 is held out: fitted on the single-stream points only, checked on c8. scale_gemm only scales
    # measured kernel times, which these roofline trials have none of: the points cannot identify it
    fit = fit_run(trials, ["eta_mem", "sched_base_us", "scale_gemm"], holdout=frozenset({"c8"}))
    assert fit.start == {"eta_mem": 0.75, "sched_base_us": 300.0, "scale_gemm": 1.0}
    for name, value in TRUE.items():
        assert fit.fitted[name] == pytest.approx(value, rel=0.05), fit.fitted
    assert set(fit.unidentified) == {"scale_gemm"} and fit.fitted["scale_gemm"] == 1.0
    assert fit.unidentified["scale_gemm"].startswith("a 10 % change moves the fitted predictions by 0.000 %")
    cal = run_calibration(fit, trials, sweep, "recovered")
    assert "scale_gemm" not in cal.params and "scale_gemm" in cal.fit["not_identified"]
    assert cal.fit["mape_after_pct"] < 1.0 < cal.fit["mape_before_pct"]
    assert cal.fit["heldout_mape_after_pct"] < 2.0 < cal.fit["heldout_mape_before_pct"]
    assert {r["set"] for r in cal.fit["rows"] if r["point"] == "c8"} == {"held-out"}
    # nothing is fitted to a held-out point: doubling its measurements changes no fitted value
    for t in trials:
        t.measured["c8"] = {k: 2 * v for k, v in t.measured["c8"].items()}
    again = fit_run(trials, ["eta_mem", "sched_base_us", "scale_gemm"], holdout=frozenset({"c8"}))
    assert again.fitted == pytest.approx(fit.fitted, rel=1e-9)
    assert all(sweep in entry["source"] for entry in cal.params.values())


def test_the_command_writes_a_profile_and_says_what_it_fitted(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    uri, sweep = make_sweep(tmp_path, calibrated=False)
    # "measured" 20 % slower than the model's defaults predict: the memory efficiency must come down
    client = MlflowClient(uri)
    for run in client.search_runs([client.get_run(sweep).info.experiment_id],
                                  f"tags.`{Tag.PARENT}` = '{sweep}'"):
        for key, value in run.data.metrics.items():
            point, _, name = key.partition("/")
            if point in ("c1", "c8") and name in RUN_METRICS:
                slower = value / 1.2 if name == "output_tok_s" else value * 1.2
                client.log_metric(run.info.run_id, key, slower)
    out = tmp_path / "cal.yaml"
    assert main(["--run", sweep, "--tracking-uri", uri, "--params", "eta_mem", "--max-evaluations", "20",
                 "--out", str(out), "--name", "mine"]) == 0
    cal = load_calibration(out)
    assert cal.name == "mine" and cal.hardware == "h100-sxm-x8"
    assert 0.5 < cal.params["eta_mem"]["value"] < 0.7
    assert cal.fit["mape_after_pct"] < cal.fit["mape_before_pct"]
    printed = capsys.readouterr().out
    assert "MAPE" in printed and "eta_mem" in printed


def test_a_fit_no_better_than_the_start_is_reported_and_not_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a sweep the model already predicts exactly (it produced it with its defaults): no constant can do
    # better, and sched_base_us may not run off to zero chasing noise (it stays within its bounds)
    uri, sweep = make_sweep(tmp_path, calibrated=False)
    out = tmp_path / "cal.yaml"
    assert main(["--run", sweep, "--tracking-uri", uri, "--params", "eta_mem,sched_base_us",
                 "--max-evaluations", "20", "--out", str(out)]) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert "the fit is no better than the start on the fitted points" in err and "no profile written" in err


def test_input_it_cannot_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = sqlite_store(tmp_path / "mlflow.db")
    tracker = Tracker(uri, "calibrate")
    empty = tracker.start_run("sweep", {Tag.KIND: RunKind.SWEEP.value})  # no trials, no metrics
    assert main(["--run", empty, "--tracking-uri", uri]) == 2
    assert "no trial with per-point metrics" in capsys.readouterr().err
    assert main(["--run", "0123456789abcdef", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "no such run" in err and err.count("\n") == 1
    assert main(["--tables", str(tmp_path)]) == 2
    assert "--tables needs --hardware" in capsys.readouterr().err
