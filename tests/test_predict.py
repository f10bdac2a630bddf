"""`predict=true`: the simulator's model in virtual time, no engine launched, the same metric names."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli
from tests.test_sweep_e2e import CONTRACT_METRICS


def test_predict_sweep_logs_prediction_runs(tmp_path: Path) -> None:
    result = run_cli(["predict=true", "-m", "model=tiny-test", "parallelism=pp2", "workload=tiny",
                      "pp.async_depth=0,2"], tmp_path, timeout=120)
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
            assert 0 < run.data.metrics[f"c{c}/sim_stage_busy_mean"] <= 1
        assert run.data.metrics["c4/output_tok_s"] > run.data.metrics["c1/output_tok_s"]
        assert int(run.data.params["resolved.max_running_requests"]) >= 1
    # nothing was launched: no engine log anywhere, no Ray session started by this command
    assert not list((tmp_path / "runs").rglob("server.log"))
    assert "Ray" not in result.stderr
