"""The end of a sweep when something in it is broken: ``finish()`` still closes the sweep run with its
status and keeps the exit code, says in one line what it could not show, and never ends in a
traceback; one trial that cannot be drawn costs only its own plots.

Runs are written into a temp sqlite store with the tracker the trials use; nothing is mocked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator import cli, sweep
from orchestrator.cli import finish
from orchestrator.store.tracking import Tracker
from tests.conftest import sqlite_store
from vocab.status import RunKind, Tag

# finish() draws every plot of the sweep and its HTML report (matplotlib): a second or two a test
pytestmark = pytest.mark.slow

EXPERIMENT = "finish"
CURVE = [("c1/output_tok_s", 10.0, 1), ("c1/tpot_p50_ms", 5.0, 1),
         ("c4/output_tok_s", 30.0, 4), ("c4/tpot_p50_ms", 8.0, 4)]


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with its tables and experiment made once (MLflow's migrations take most of a second);
    each test works on its own copy."""
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    Tracker(sqlite_store(path), EXPERIMENT)
    return path


@pytest.fixture(autouse=True)
def _own_store(empty_store: Path, tmp_path: Path) -> None:
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")


def _sweep(tmp_path: Path) -> tuple[Tracker, str]:
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", EXPERIMENT)
    sweep_id = tracker.start_run("sweep x=1,2", {Tag.KIND: RunKind.SWEEP.value, Tag.MODE: "measure",
                                                 Tag.STATUS: "running"})
    return tracker, sweep_id


def _trial(tracker: Tracker, sweep_id: str, name: str, tags: dict[str, str], engine: str = "sim") -> str:
    run_id = tracker.start_run(name, {Tag.KIND: RunKind.TRIAL.value, Tag.ENGINE: engine, **tags}, sweep_id)
    tracker.log_metrics(run_id, CURVE)
    return run_id


def _activate(monkeypatch: pytest.MonkeyPatch, tracker: Tracker, sweep_id: str, tmp_path: Path) -> None:
    state = sweep.SweepState(tracker.uri, EXPERIMENT, str(tmp_path / "sweep"), True, "measure", sweep_id,
                             tracker.experiment_id)
    monkeypatch.setattr(sweep, "ACTIVE", state)
    monkeypatch.chdir(tmp_path)


def _one_liners(err: str) -> list[str]:
    """stderr's lines, each checked to be one of ours (MLflow's own INFO lines on creating a store
    are left out)."""
    lines = [line for line in err.splitlines() if " INFO mlflow." not in line]
    assert "Traceback" not in err
    assert all(line.startswith("parasweep: could not ") for line in lines), lines
    return lines


def test_a_broken_trial_still_closes_the_sweep_with_its_status(tmp_path: Path, monkeypatch, capsys) -> None:
    tracker, sweep_id = _sweep(tmp_path)
    # a status no version of parasweep writes, and a trial number that is not one
    _trial(tracker, sweep_id, "x=1", {Tag.STATUS: "exploded", Tag.TRIAL_NUM: "one"})
    _trial(tracker, sweep_id, "x=2", {Tag.STATUS: "ok", Tag.TRIAL_NUM: "1"})
    _activate(monkeypatch, tracker, sweep_id, tmp_path)
    assert finish(0) == 1  # an unknown status is not a success
    out, err = capsys.readouterr()
    _one_liners(err)
    assert "Browse the runs in the MLflow UI" in out  # the rest of the end is still shown
    run = tracker.client.get_run(sweep_id)
    assert run.data.tags[Tag.STATUS] == "failed" and run.info.status == "FAILED"


def test_interrupted_sweep_keeps_its_code_when_trials_are_broken(tmp_path: Path, monkeypatch, capsys) -> None:
    tracker, sweep_id = _sweep(tmp_path)
    left = _trial(tracker, sweep_id, "x=1", {Tag.STATUS: "running", Tag.TRIAL_NUM: "0"})
    _trial(tracker, sweep_id, "x=2", {Tag.STATUS: "", Tag.TRIAL_NUM: "1"})
    _activate(monkeypatch, tracker, sweep_id, tmp_path)
    assert finish(130) == 130
    _one_liners(capsys.readouterr().err)
    assert tracker.client.get_run(sweep_id).data.tags[Tag.STATUS] == "killed"
    assert tracker.client.get_run(left).data.tags[Tag.STATUS] == "killed"  # closed for its worker


def test_a_trial_whose_worker_died_outright_keeps_its_records(tmp_path: Path, monkeypatch, capsys) -> None:
    # the signal reached the trial's worker before Ray's soft cancel: it never saved its files, but the
    # records it streamed as they finished are in its directory, and the sweep's end uploads them
    from vocab.records import RecordWriter, RequestRecord

    trial_dir = tmp_path / "trial"
    (trial_dir / "records").mkdir(parents=True)
    with RecordWriter(trial_dir / "records" / "requests.jsonl") as writer:
        for i in range(3):
            writer.write(RequestRecord("c4", i, send_time=1.0, end_time=2.0, output_tokens=8,
                                       server_queue_s=0.1))
    tracker, sweep_id = _sweep(tmp_path)
    left = _trial(tracker, sweep_id, "x=1", {Tag.STATUS: "running", Tag.TRIAL_NUM: "0",
                                             Tag.TRIAL_DIR: str(trial_dir)})
    _activate(monkeypatch, tracker, sweep_id, tmp_path)
    assert finish(130) == 130
    _one_liners(capsys.readouterr().err)
    assert tracker.client.get_run(left).data.tags[Tag.STATUS] == "killed"
    assert (trial_dir / "records" / "requests.parquet").exists()
    assert [a.path for a in tracker.client.list_artifacts(left, "records")] == ["records/requests.parquet"]


@pytest.mark.parametrize(("code", "kept"), [(0, 1), (1, 1), (130, 130)])
def test_a_store_that_cannot_be_read_is_one_line(tmp_path: Path, monkeypatch, capsys, code: int,
                                                 kept: int) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # a file where the store's folder should be: sqlite cannot open it
    state = sweep.SweepState(f"sqlite:///{blocker / 'mlflow.db'}", EXPERIMENT, str(tmp_path), True,
                             "measure", "0123456789abcdef", "0")
    monkeypatch.setattr(sweep, "ACTIVE", state)
    assert finish(code) == kept
    out, err = capsys.readouterr()
    lines = _one_liners(err)
    assert len(lines) == 1 and "read the trials of sweep run 0123456789abcdef" in lines[0]
    assert out == ""


def _plots(tracker: Tracker, run_id: str) -> set[str]:
    return {Path(a.path).name for a in tracker.client.list_artifacts(run_id, "plots")}


def test_one_trial_that_cannot_be_drawn_costs_only_its_own_plots(tmp_path: Path, monkeypatch,
                                                                 capsys) -> None:
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    tracker, sweep_id = _sweep(tmp_path)
    broken_dir = tmp_path / "0"
    (broken_dir / "telemetry").mkdir(parents=True)
    (broken_dir / "telemetry" / "point_windows.json").write_text('{"c1": [1.0,')  # cut short
    broken = _trial(tracker, sweep_id, "x=1", {Tag.TRIAL_NUM: "0", Tag.TRIAL_DIR: str(broken_dir)})
    # two later trials with the same name and no directory of their own (drawn in scratch space)
    twins = [_trial(tracker, sweep_id, "x=2", {Tag.TRIAL_NUM: str(n)}) for n in (1, 2)]
    runs = tracker.children(sweep_id)
    cli._log_plots(tracker, sweep_id, runs, tmp_path / "sweep")
    lines = _one_liners(capsys.readouterr().err)
    assert len(lines) == 1 and "draw the plots of trial #0 x=1" in lines[0]
    assert "telemetry" not in " ".join(_plots(tracker, broken))
    for run_id in twins:
        assert _plots(tracker, run_id) == {"throughput.png", "latency.png"}
    assert "sweep.png" in _plots(tracker, sweep_id)
    assert list(scratch.iterdir()) == []  # the scratch space is gone


@pytest.mark.parametrize("plots,html", [(True, True), (False, False)])
def test_the_sweep_end_draws_and_writes_what_report_asks_for(tmp_path: Path, monkeypatch, capsys,
                                                           plots: bool, html: bool) -> None:
    # report.plots / report.html: a sweep that needs only its numbers (CI) ends without drawing
    tracker, sweep_id = _sweep(tmp_path)
    trial = _trial(tracker, sweep_id, "x=1", {Tag.STATUS: "ok", Tag.TRIAL_NUM: "0"})
    _activate(monkeypatch, tracker, sweep_id, tmp_path)
    monkeypatch.setattr(sweep.ACTIVE, "plots", plots)
    monkeypatch.setattr(sweep.ACTIVE, "html", html)
    assert finish(0) == 0
    out = capsys.readouterr().out
    assert "1 trial(s), status ok" in out  # the summary table either way
    assert (_plots(tracker, trial) == {"throughput.png", "latency.png"}) is plots
    assert ("sweep.png" in _plots(tracker, sweep_id)) is plots
    assert (tmp_path / "sweep" / "report.html").exists() is html
    assert ("report.html" in {a.path for a in tracker.client.list_artifacts(sweep_id)}) is html
    if not html:
        assert f"Report: not written (report.html=false; python -m analysis report {sweep_id})" in out


def test_trials_sharing_a_name_keep_their_own_line_on_the_sweep_chart(tmp_path: Path, monkeypatch) -> None:
    import analysis.plots

    drawn: dict[str, object] = {}
    real = analysis.plots.plot_sweep

    def keep(trials, *args, **kwargs):  # type: ignore[no-untyped-def]
        drawn.update(trials)
        return real(trials, *args, **kwargs)

    monkeypatch.setattr(analysis.plots, "plot_sweep", keep)
    tracker, sweep_id = _sweep(tmp_path)
    for n in (0, 1):
        _trial(tracker, sweep_id, "x=2", {Tag.TRIAL_NUM: str(n)})
    cli._log_plots(tracker, sweep_id, tracker.children(sweep_id), tmp_path / "sweep")
    assert sorted(drawn) == ["#0 x=2", "#1 x=2"]


def _png_title(path: Path) -> str:
    from PIL import Image

    with Image.open(path) as image:
        return str(image.text.get("Title", ""))


@pytest.mark.parametrize(("engine", "simulated"), [("sim", True), ("sim-predict", True), ("sglang", False)])
def test_plots_of_simulated_numbers_say_so(tmp_path: Path, engine: str, simulated: bool) -> None:
    import pandas as pd

    tracker, sweep_id = _sweep(tmp_path)
    trial_dir = tmp_path / "0"
    (trial_dir / "telemetry").mkdir(parents=True)
    # per-stage series but no GPU samples: a live simulated trial run with telemetry.gpu_hz=0
    pd.DataFrame({"ts": [1.0, 2.0, 3.0], "source": "log", "kind": "decode", "dp": 0, "pp": 0, "tp": 0,
                  "running": [1, 2, 1], "queue": [0, 1, 0]}).to_parquet(
        trial_dir / "telemetry" / "stage_series.parquet")
    _trial(tracker, sweep_id, "x=1", {Tag.TRIAL_NUM: "0", Tag.TRIAL_DIR: str(trial_dir),
                                      Tag.GPU_TELEMETRY: "none"}, engine)
    cli._log_plots(tracker, sweep_id, tracker.children(sweep_id), tmp_path / "sweep")
    titles = {name: _png_title(trial_dir / "plots" / name)
              for name in ("throughput.png", "latency.png", "stage_queues.png")}
    titles["sweep.png"] = _png_title(tmp_path / "sweep" / "plots" / "sweep.png")
    for name, title in titles.items():
        assert title, name
        assert ("simulated engine" in title) is simulated, (name, title)
