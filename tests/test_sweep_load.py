"""Fifty short live trials in one sweep on 8 declared GPUs: every run closed, every artifact present,
nothing left running. (How the driver's memory behaves over such a sweep is measured by
benchmarks/sweep_load.py, with the numbers in docs/benchmarks.md.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import NO_DRAWING, run_cli
from tests.servers import processes_mentioning

pytestmark = pytest.mark.slow

TRIALS = 50
NEEDED = ("records/requests.parquet", "config/resolved.yaml", "diagnosis.json", "server/server.log",
          "env.json")


def test_fifty_trials_all_close_with_their_artifacts(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    out = run_cli(["-m", "model=tiny-test", "parallelism=tp1", "workload=tiny", "workload.concurrency=[2]",
                   "engine.time_scale=20", "telemetry.gpu_hz=2", "ray.num_gpus=8", "ray.num_cpus=8",
                   *NO_DRAWING, f"workload.seed=range(0,{TRIALS})"], tmp_path, timeout=900, store=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{TRIALS} trial(s), status ok" in out.stdout
    assert "Report: not written (report.html=false" in out.stdout  # NO_DRAWING reached the driver

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("parasweep")
    trials = client.search_runs([exp.experiment_id], "tags.`parasweep.kind` = 'trial'", max_results=1000)
    sweeps = client.search_runs([exp.experiment_id], "tags.`parasweep.kind` = 'sweep'")
    assert len(trials) == TRIALS and len(sweeps) == 1
    assert {r.data.params["workload.seed"] for r in trials} == {str(i) for i in range(TRIALS)}
    for run in [*trials, *sweeps]:
        assert run.info.status == "FINISHED" and run.data.tags["parasweep.status"] == "ok", run.info.run_name
    for run in trials:
        names = {f.path for f in client.list_artifacts(run.info.run_id)}
        for folder in ("records", "config", "server"):
            names |= {f.path for f in client.list_artifacts(run.info.run_id, folder)}
        missing = [need for need in NEEDED if need not in names]
        assert not missing, (run.info.run_name, missing)
        assert run.data.metrics["c2/completed"] == run.data.metrics["c2/num_requests"] > 0
    # the driver's guardian notices the driver's exit within a few seconds, and then exits too
    deadline = time.monotonic() + 20
    while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(tmp_path)) == []
