"""``python -m analysis report``: one self-contained HTML file per sweep or trial, read back from a
real MLflow store; bad input is one line and exit 2, fast; a headless browser opens the file cleanly.

The fast tests fill a real sqlite store through MLflow's client (a sweep with a failed trial that has
no metrics or artifacts); the slow ones run real sweeps (the simulated engine live over HTTP, and a
prediction) through ``run.py`` and report them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.report_html import build_report, main
from analysis.store import default_tracking_uri
from tests.conftest import run_cli, sqlite_store

IMG = "data:image/png;base64,"
# any src= or href= that would make a browser fetch from the network
REMOTE_REF = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _store(path: Path) -> tuple[str, object]:
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments()  # an empty but real store
    return uri, client


def _one_line_exit_2(argv: list[str], capfd: pytest.CaptureFixture[str]) -> str:
    capfd.readouterr()  # drop what making the store printed
    assert main(argv) == 2
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert out == ""
    return lines[0]


# ---------------------------------------------------------------------------------------------------
# fast: bad input


def test_default_uri_matches_the_orchestrator(tmp_path: Path) -> None:
    from orchestrator.store.tracking import tracking_uri

    assert default_tracking_uri() == tracking_uri(None)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve() / 'runs' / 'mlflow.db'}"


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri, _client = _store(tmp_path_factory.mktemp("empty"))
    return uri


def test_unknown_run_id(empty_store: str, capfd: pytest.CaptureFixture[str]) -> None:
    uri = empty_store
    line = _one_line_exit_2(["0123456789abcdef", "--tracking-uri", uri], capfd)
    assert "0123456789abcdef" in line and "no such run" in line


def test_empty_store(empty_store: str, capfd: pytest.CaptureFixture[str]) -> None:
    uri = empty_store
    line = _one_line_exit_2(["--tracking-uri", uri], capfd)
    assert "no sweep run" in line
    line = _one_line_exit_2(["--tracking-uri", uri, "--experiment", "nope"], capfd)
    assert "--experiment 'nope'" in line and "Default" in line


def test_missing_or_foreign_file_is_not_a_store(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "runs" / "mlflow.db"
    line = _one_line_exit_2(["--tracking-uri", f"sqlite:///{missing}"], capfd)
    assert "no MLflow store" in line and str(missing) in line
    assert not missing.exists()  # nothing created at a mistyped path
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 20)
    line = _one_line_exit_2(["--tracking-uri", str(text)], capfd)
    assert "not an MLflow store" in line
    line = _one_line_exit_2(["--tracking-uri", str(tmp_path)], capfd)
    assert "holds no MLflow store" in line
    line = _one_line_exit_2(["--bogus"], capfd)
    assert "--bogus" in line


def test_unreachable_server_fails_fast(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    line = _one_line_exit_2(["--tracking-uri", "http://user:hunter22@127.0.0.1:9"], capfd)
    elapsed = time.monotonic() - start
    assert "cannot reach" in line and "127.0.0.1:9" in line and "hunter22" not in line
    assert elapsed < 10, f"took {elapsed:.1f} s"  # MLflow's own client would retry for minutes
    assert not list(tmp_path.glob("*.html"))


# ---------------------------------------------------------------------------------------------------
# fast: a sweep whose trials failed still gets a report


def _finding(point: str, idle: int) -> dict:
    effect = {"change": {"workload.concurrency": [8]}, "point": point, "predicted_at": "c8",
              "verdict": "helps", "change_pct": {"output_tok_s": 60.0, "itl_p99_ms": 1.0},
              "source": "simulated engine in virtual time (a prediction, not a measurement)"}
    return {"id": "pp_bubble", "severity": "warning", "title": f"Pipeline stages idle {idle}% at {point}",
            "evidence": f"stage activity {100 - idle}% <simulated>", "suggestion": "more load",
            "point": point, "change": {"workload.concurrency": [8]}, "alternatives": [],
            "predicted_effect": effect}


@pytest.mark.slow  # draws a whole report's plots: about two seconds
def test_failed_trials_are_tolerated(tmp_path: Path) -> None:
    uri, client = _store(tmp_path)
    exp = client.create_experiment("parasweep", artifact_location=(tmp_path / "artifacts").as_uri())
    sweep = client.create_run(exp, run_name="sweep pp.async_depth=0,1,2", tags={
        "parasweep.kind": "sweep", "parasweep.status": "failed", "parasweep.mode": "measure",
        "parasweep.command": "python run.py -m pp.async_depth=0,1,2"})
    sid = sweep.info.run_id
    labels = ["pp.async_depth=0", "pp.async_depth=1 <b>x</b>", "pp.async_depth=2"]
    runs = []
    for num, label in enumerate(labels):
        run = client.create_run(exp, run_name=f"#{num} {label}", tags={
            "mlflow.parentRunId": sid, "parasweep.kind": "trial", "parasweep.trial_num": str(num),
            "parasweep.overrides": label, "parasweep.engine": "sglang", "parasweep.gpu_telemetry": "nvml",
            "parasweep.status": "failed" if num == 0 else "ok"})
        client.log_param(run.info.run_id, "pp.async_depth", str(num))
        client.log_param(run.info.run_id, "model.name", "tiny-test")
        runs.append(run.info.run_id)
    # trial 0 failed before its first point: an error, no metrics, no artifacts
    client.set_tag(runs[0], "parasweep.error", "RuntimeError: engine exited with code 1 before /health")
    client.set_terminated(runs[0], "FAILED")
    for num, rid in enumerate(runs[1:], start=1):
        for key, value in {"c4/output_tok_s": 100.0 * num, "c4/ttft_p99_ms": 12.5, "c4/itl_p99_ms": 3.25,
                           "c4/valid": 1.0, "c4/j_per_output_token": 0.5,
                           "pred/c4/output_tok_s": 120.0 * num, "c1/output_tok_s": 40.0,
                           "c1/valid": 0.0}.items():
            client.log_metric(rid, key, value)
        diag = tmp_path / f"d{num}" / "diagnosis.json"
        diag.parent.mkdir()
        stall = {"id": "prefill_interference", "severity": "warning", "title": "Prefills stall decodes",
                 "evidence": "ITL p99 9.7x ITL p50", "suggestion": "mixed chunks", "point": "c4",
                 "change": {"server.chunked_prefill_size": 512}, "alternatives": [], "goal": "itl_p99_ms",
                 "predicted_effect": {**_finding("c4", 0)["predicted_effect"], "goal": "itl_p99_ms",
                                      "change": {"server.chunked_prefill_size": 512}, "predicted_at": "c4",
                                      "change_pct": {"ttft_p99_ms": 13.0, "itl_p99_ms": -74.0}}}
        diag.write_text(json.dumps([_finding("c4", 90 + num), stall]))
        client.log_artifact(rid, str(diag))
    client.set_terminated(sid, "FAILED")

    out = build_report(sid, uri, out=tmp_path / "out" / "report.html")
    page = out.read_text()
    assert out.parent.name == "out"
    assert "Sweep report: sweep pp.async_depth=0,1,2" in page
    assert "no results" in page and "engine exited with code 1" in page
    # the same finding (numbers aside) in the two trials that have a diagnosis: shown once, merged
    assert page.count("<code>pp_bubble</code>") == 1
    # merged by id and point as the terminal summary merges them, the title's numbers as a range
    assert ("#1 pp.async_depth=1 &lt;b&gt;x&lt;/b&gt;, #2 pp.async_depth=2: Pipeline stages idle 91–92% at c4"
            in page)
    assert "stage activity 9% &lt;simulated&gt;" in page and "stage activity 8% &lt;simulated&gt;" in page
    assert "helps (tok/s +60%, ITL p99 +1%)" in page and "c4 → c8" in page
    # a latency finding's change is judged on its latency, and the report says which
    assert "helps (TTFT p99 +13%, ITL p99 -74%), judged on ITL p99" in page
    # the change as the terminal (analysis.diagnose.overrides_text) writes it
    assert "predicted effect of workload.concurrency=[8] at c4 → c8" in page
    assert "<b>x</b>" not in page  # escaped everywhere
    assert "Measured on SGLang" in page and "SIMULATED" not in page
    assert "200.0" in page and "240.0 (+20%)" in page  # trial 2: measured, and the prediction beside it
    assert "NO: the client fell behind or the point was cut short" in page
    assert page.count(IMG) >= 3  # throughput, latency, energy; predicted vs measured
    assert not REMOTE_REF.search(page)
    # a single trial of that sweep: its own page, with the sweep's command in the header
    single = build_report(runs[2], uri, out=tmp_path / "one.html").read_text()
    assert "Trial report: #2 pp.async_depth=2" in single and "python run.py -m pp.async_depth=0,1,2" in single
    assert "#1 pp.async_depth=1" not in single


# ---------------------------------------------------------------------------------------------------
# slow: real sweeps


LIVE = ["-m", "model=tiny-test", "workload=tiny", "parallelism=pp2", "ray.num_cpus=2", "pp.async_depth=0,1"]
PREDICT = ["-m", "predict=true", "model=tiny-test", "workload=tiny", "parallelism=pp2",
           "tracking.experiment=predictions", "pp.async_depth=0,1"]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A live simulated sweep (experiment parasweep), then a prediction sweep (experiment predictions),
    in one store."""
    from mlflow.tracking import MlflowClient

    workdir = tmp_path_factory.mktemp("report")
    for args in (LIVE, PREDICT):
        result = run_cli(args, workdir, timeout=600, store=True)
        assert result.returncode == 0, result.stdout + result.stderr
    uri = default_tracking_uri(workdir)
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    by_kind: dict[str, list] = {}
    for run in runs:
        by_kind.setdefault(run.data.tags["parasweep.kind"], []).append(run)
    live = next(r for r in by_kind["sweep"] if r.data.tags["parasweep.mode"] == "measure")
    pred = next(r for r in by_kind["sweep"] if r.data.tags["parasweep.mode"] == "prediction")
    return {"workdir": workdir, "uri": uri, "live": live, "pred": pred, "trials": by_kind["trial"]}


@pytest.mark.slow
def test_live_sweep_report(sweeps: dict) -> None:
    out = build_report(None, sweeps["uri"], out=sweeps["workdir"] / "live.html", experiment="parasweep")
    page = out.read_text()
    assert f"Sweep report: {sweeps['live'].info.run_name}" in page
    assert "SIMULATED, NOT MEASURED" in page
    assert sweeps["live"].data.tags["parasweep.command"] in page
    trials = sweeps["trials"]
    assert len(trials) == 2
    pictures = 0
    for trial in trials:
        tags, metrics = trial.data.tags, trial.data.metrics
        assert f"#{tags['parasweep.trial_num']} {tags['parasweep.overrides']}" in page
        assert trial.info.run_id in page and tags["parasweep.trial_dir"] in page
        # the numbers the store holds, as the table prints them
        assert f"{metrics['c4/output_tok_s']:,.1f}" in page
        assert f"{metrics['pred/c4/output_tok_s']:,.1f}" in page
        assert f"{metrics['c4/j_per_output_token']:,.3f}" in page
        findings = json.loads((Path(tags["parasweep.trial_dir"]) / "diagnosis.json").read_text())
        assert findings, "the tiny PP2 sweep is expected to give findings"
        for finding in findings:
            assert f"<code>{finding['id']}</code>" in page
        pictures += sum((Path(tags["parasweep.trial_dir"]) / "plots" / name).is_file()
                        for name in ("gpu_timeline.png", "stage_queues.png"))
    assert pictures >= 2
    assert "all 2 trials" in page  # the same PP finding in both trials, merged
    # our plots (throughput, latency, energy, predicted vs measured) plus every telemetry picture
    assert page.count(IMG) >= 4 + pictures
    assert "Each dot is one trial at one load point" in page  # predicted vs measured, as pred/ exists
    assert not REMOTE_REF.search(page)
    assert len(out.read_bytes()) < 3_000_000


@pytest.mark.slow
def test_prediction_sweep_is_the_latest(sweeps: dict) -> None:
    proc = subprocess.run([sys.executable, "-m", "analysis", "report"], cwd=sweeps["workdir"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path == sweeps["workdir"] / f"report-{sweeps['pred'].info.run_id[:8]}.html"
    page = path.read_text()
    assert "Prediction sweep report" in page and "SIMULATED, NOT MEASURED" in page
    assert "virtual time" in page and "predicted tok/s" not in page  # no measurement to set it beside
    # how far the model's numbers go: its error on published runs of this family (a PP model here)
    assert "The model&#39;s error on published runs like these: ±" in page or \
        "The model's error on published runs like these: ±" in page
    assert "published pp runs" in page
    assert "#0 pp.async_depth=0" in page and "#1 pp.async_depth=1" in page
    assert IMG in page and not REMOTE_REF.search(page)


@pytest.mark.slow
def test_single_trial_report(sweeps: dict) -> None:
    trial = sweeps["trials"][0]
    page = build_report(trial.info.run_id, sweeps["uri"], out=sweeps["workdir"] / "t.html").read_text()
    label = f"#{trial.data.tags['parasweep.trial_num']} {trial.data.tags['parasweep.overrides']}"
    assert f"Trial report: {label}" in page and sweeps["live"].info.run_name in page
    assert page.count(IMG) >= 3


def _browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@pytest.mark.slow
def test_opens_cleanly_in_headless_chromium(sweeps: dict, tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip(f"no headless browser on PATH (looked for {', '.join(BROWSERS)})")
    out = build_report(sweeps["live"].info.run_id, sweeps["uri"], out=tmp_path / "report.html")
    proc = subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
                           "--v=1", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    problems = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not problems, problems
    dom = proc.stdout
    assert 'id="results-table"' in dom and "#0 pp.async_depth=0" in dom
    assert dom.count(IMG) == out.read_text().count(IMG) > 0  # the browser kept every embedded picture
