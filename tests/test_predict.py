"""`predict=true`: the simulator's model in virtual time, no engine launched, the same metric names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import NO_DRAWING, run_cli
from tests.test_sweep_e2e import CONTRACT_METRICS
from vocab.telemetry import STAGE_ACTIVITY_MEAN

pytestmark = pytest.mark.slow  # runs the real entry point in a subprocess


def test_predict_sweep_logs_prediction_runs(tmp_path: Path) -> None:
    result = run_cli(["predict=true", "-m", "model=tiny-test", "parallelism=pp2", "workload=tiny",
                      "pp.async_depth=0,2", *NO_DRAWING], tmp_path, timeout=120, store=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "prediction (virtual time, simulated engine)" in result.stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("parasweep")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("parasweep.kind") == "sweep"]
    assert parent.data.tags["parasweep.mode"] == "prediction"
    preds = [r for r in runs if r.data.tags.get("parasweep.kind") == "prediction"]
    assert len(preds) == 2 and not [r for r in runs if r.data.tags.get("parasweep.kind") == "trial"]
    for run in preds:
        assert run.data.tags["parasweep.status"] == "ok"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        for c in (1, 4):
            for name in CONTRACT_METRICS:
                assert f"c{c}/{name}" in run.data.metrics
            assert run.data.metrics[f"c{c}/output_tok_s"] > 0
            assert 0 < run.data.metrics[f"c{c}/{STAGE_ACTIVITY_MEAN}"] <= 1
        assert run.data.metrics["c4/output_tok_s"] > run.data.metrics["c1/output_tok_s"]
        assert int(run.data.params["resolved.max_running_requests"]) >= 1
    # nothing was launched: no engine log anywhere, no Ray session started by this command
    assert not list((tmp_path / "runs").rglob("server.log"))
    assert "Ray" not in result.stderr


def test_reproduce_a_trial_and_a_sweep(tmp_path: Path) -> None:
    """reproduce=<RUN_ID> re-composes a trial from its recorded overrides (or a sweep from its command)."""
    from mlflow.tracking import MlflowClient

    base = ["predict=true", "model=tiny-test", "parallelism=pp2", "workload=tiny", *NO_DRAWING]
    first = run_cli(["-m", *base, "pp.async_depth=0,2"], tmp_path, timeout=120, store=True)
    assert first.returncode == 0, first.stdout + first.stderr
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("parasweep")

    def runs(kind: str) -> list:
        return client.search_runs([exp.experiment_id], f"tags.`parasweep.kind` = '{kind}'",
                                  order_by=["attributes.start_time ASC"])

    trial = next(r for r in runs("prediction") if r.data.params["pp.async_depth"] == "2")
    again = run_cli([f"reproduce={trial.info.run_id}"], tmp_path, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    new = runs("prediction")[-1]
    assert new.data.tags["parasweep.reproduces"] == trial.info.run_id
    assert new.data.params["pp.async_depth"] == "2" and new.data.params["model.name"] == "tiny-test"
    assert new.data.tags["parasweep.config_hash"] == trial.data.tags["parasweep.config_hash"]
    assert "parasweep.reproduce_warning" not in new.data.tags
    # overrides on top are applied, and the changed config is reported, not hidden
    changed = run_cli([f"reproduce={trial.info.run_id}", "workload.output_len=4"], tmp_path, timeout=120)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "differs from the original's" in changed.stdout
    # a whole sweep: its recorded command again, nothing reused
    sweep = runs("sweep")[0]
    redo = run_cli([f"reproduce={sweep.info.run_id}"], tmp_path, timeout=120)
    assert redo.returncode == 0, redo.stdout + redo.stderr
    assert "2 trial(s), status ok" in redo.stdout and "skipping" not in redo.stdout
    # each trial is put side by side with its namesake in the original sweep (virtual time: no change)
    summaries = [line for line in redo.stdout.splitlines() if line.startswith("reproduction: ")]
    assert len(summaries) == 2 and all(line.startswith("reproduction: tok/s +0.0%") for line in summaries)
    # an unknown id is one line
    bad = run_cli(["reproduce=0123456789abcdef"], tmp_path, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("parasweep: reproduce=0123456789abcdef: no such")
