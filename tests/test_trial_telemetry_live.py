"""A live trial on the simulated engine over real HTTP: GPU samples and stage series cover every load
point, share the request records' clock, and the per-point summaries logged to MLflow are the ones the
series give."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.telemetry import point_telemetry
from orchestrator.config.schema import ParasweepConf
from orchestrator.store.tracking import Tracker
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan
from orchestrator.trial.run import TrialRunSettings, execute_trial
from tests.conftest import sqlite_store
from vocab.hardware import load_hardware
from vocab.metric_keys import point_metrics
from vocab.records import read_records
from vocab.status import Tag, TrialStatus
from vocab.telemetry import ENERGY_J, J_PER_TOKEN, POWER_FRAC_MEAN, STAGE_ACTIVITY_MEAN, engine_layout
from workloads.clock import now

pytestmark = pytest.mark.slow


def live_cfg(tmp_path: Path) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    cfg.tp.size, cfg.pp.size = 2, 2
    cfg.workload.concurrency = [1, 8]
    cfg.workload.input_len, cfg.workload.output_len = 64, 48
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 2, 1
    cfg.telemetry.gpu_hz = 20.0
    cfg.tracking.uri = sqlite_store(tmp_path / "mlflow.db")
    return cfg


def test_series_cover_every_point_on_the_clients_clock(tmp_path: Path) -> None:
    cfg = live_cfg(tmp_path)
    plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(0, "live", tmp_path / "trial", ()))
    marker_before = now()  # the client's clock, before the engine starts
    outcome = execute_trial(plan, TrialRunSettings(cfg.tracking.uri, "telemetry", own_progress_view=False))
    marker_after = now()
    assert outcome.status is TrialStatus.OK, outcome.error
    run = Tracker(cfg.tracking.uri, "telemetry").client.get_run(outcome.run_id)
    assert run.data.tags[Tag.GPU_TELEMETRY] == "simulated"
    assert "simulated GPU telemetry, not measured" in run.data.tags[Tag.NOTE]

    trial = tmp_path / "trial"
    gpu = pd.read_parquet(trial / "telemetry" / "gpu.parquet")
    stages = pd.read_parquet(trial / "telemetry" / "stage_series.parquet")
    windows = json.loads((trial / "telemetry" / "point_windows.json").read_text())
    records = list(read_records(trial / "records" / "requests.jsonl"))
    assert set(windows) == {"c1", "c8"}

    # one clock: every sample lies between the two markers, and so does every request
    assert marker_before < gpu["ts"].min() and gpu["ts"].max() < marker_after
    assert all(marker_before < r.send_time < r.end_time < marker_after for r in records)
    # every point is covered on both sides by samples of every GPU (2 stages x 2 TP ranks)
    assert set(gpu["gpu"]) == {0, 1, 2, 3} and set(gpu["pp"]) == {0, 1}
    for start, end in windows.values():
        for _, g in gpu.groupby("gpu"):
            assert g["ts"].min() <= start and g["ts"].max() >= end
    # the stage series: log lines (millisecond stamps) and scraped gauges, for both stages
    assert set(stages["source"]) == {"log", "metrics"} and set(stages["pp"]) == {0, 1}
    assert (stages["ts"] % 1).nunique() > 1

    # the logged summaries are the series' summaries over each point's window
    logged = {str(p): m for p, m in point_metrics(run.data.metrics).items()}
    for label, (start, end) in windows.items():
        tokens = int(logged[label]["output_tokens"])
        expect = point_telemetry(gpu, stages, start, end, tokens, cfg.hardware.idle_power_w,
                                 engine_layout(2, 2))
        for name in (POWER_FRAC_MEAN, ENERGY_J, J_PER_TOKEN, STAGE_ACTIVITY_MEAN):
            assert logged[label][name] == pytest.approx(expect[name], rel=1e-9), (label, name)
    # energy per token falls as the GPUs are shared by more requests (the tiny model's power barely
    # moves with load, so power itself is not compared)
    assert logged["c8"][J_PER_TOKEN] < logged["c1"][J_PER_TOKEN]
