"""A trial with attention data parallelism on the simulated engine, through real HTTP: each rank's
running and waiting requests and KV use recorded per rank in MLflow, SGLang's balance series
summarised, and a rank whose scheduler fails mid-point failing the trial in one line that names it,
with nothing left running."""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlflow
import pytest

from orchestrator.process.server import group_alive
from tests.conftest import NO_DRAWING, run_cli

pytestmark = pytest.mark.slow

TRIAL = ["model=deepseek-v3", "hardware=h200-nvlink-x8", "parallelism=tp8-dpa8", *NO_DRAWING,
         "workload=tiny", "workload.concurrency=[8]", "workload.requests_per_concurrency=4",
         "workload.output_len=32", "telemetry.metrics_period_s=0.2"]


def test_each_rank_is_recorded_on_its_own(tmp_path: Path) -> None:
    result = run_cli(TRIAL, tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list",
                                filter_string="tags.`parasweep.kind` = 'trial'")
    metrics = run.data.metrics
    ranks = {int(m.group(1)) for k in metrics if (m := re.fullmatch(r"c8/dp(\d)_running_mean", k))}
    assert ranks == set(range(8))  # every rank's own series, from its log lines and dp_rank gauges
    assert all(f"c8/dp{r}_kv_token_usage_max" in metrics for r in ranks)
    assert metrics["c8/dp_running_imbalance"] >= 1.0
    # SGLang's own balance series (0.5.23), which the simulated engine exports as SGLang does
    assert 0.0 <= metrics["c8/dp_attention_imbalance_frac"] < 1.0
    assert 0.0 <= metrics["c8/dp_attention_idle_steps_frac"] <= 1.0
    assert 1.0 <= metrics["c8/dp_attention_imbalance_ratio_mean"] <= 8.0
    assert metrics["c8/dp_attention_sync_wait_ms_mean"] > 0.0
    argv = json.loads(next(tmp_path.glob("runs/outputs/**/server/argv.json")).read_text())
    assert argv[argv.index("--attn-dp-size") + 1] == "8"


def test_a_rank_that_fails_fails_the_trial_and_nothing_is_left(tmp_path: Path) -> None:
    result = run_cli([*TRIAL, "engine.sim_faults.crash_after_requests=4"], tmp_path, timeout=300)
    assert result.returncode != 0
    (error,) = tmp_path.glob("runs/outputs/**/error.txt")
    first = error.read_text().splitlines()[0]
    pattern = (r"engine exited with code -9 \(SIGKILL\) \(scheduler DP4 TP4 EP4 hit an exception\) "
               r"during point c8")
    assert re.match(pattern, first), first
    pgids = list((error.parent / "server").glob("*.pgid"))
    assert pgids and not any(group_alive(int(p.read_text())) for p in pgids)
