"""Each trial stage on its own, without Hydra: plan, virtual engine session, load driver, recorder
(against a real sqlite MLflow store), and the whole composition in virtual time. The live session
(a real engine process) is in tests/test_trial_live_session.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError
from orchestrator.launcher.sweep_jobs import SweepSettings
from orchestrator.progress import ProgressWriter
from orchestrator.store.tracking import Tracker
from orchestrator.trial.load_driver import drive_load
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan, trial_label
from orchestrator.trial.recorder import TrialPaths, TrialRecorder
from orchestrator.trial.run import TrialRunSettings, execute_trial
from orchestrator.trial.session import VirtualSession
from tests.conftest import sqlite_store
from vocab.findings import Finding
from vocab.hardware import load_hardware
from vocab.load import LoadPoint
from vocab.records import PointResult, read_records
from vocab.status import RunKind, Tag, TrialStatus


def tiny_cfg(tmp_path: Path, **pp: int) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    cfg.pp.size, cfg.pp.async_depth = pp.get("size", 2), pp.get("async_depth", 0)
    cfg.workload.concurrency = [1, 4]
    cfg.workload.input_len, cfg.workload.output_len = 32, 8
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 2, 1
    # predicted points stop at 0.3 virtual seconds: these tests are about a trial's stages and its
    # summary, not how sure a prediction is (tests/test_predicted_points.py)
    cfg.workload.predicted.budget_s = 0.3
    cfg.tracking.uri = sqlite_store(tmp_path / "mlflow.db")
    return cfg


def plan_for(cfg: ParasweepConf, tmp_path: Path, label: str = "pp.async_depth=0"):
    return make_plan(cfg, checked_engine(cfg), TrialIdentity(3, label, tmp_path / "trial", (label,)))


# -- plan ------------------------------------------------------------------------------------------
def test_plan_builds_points_spec_argv_and_identity(tmp_path: Path) -> None:
    plan = plan_for(tiny_cfg(tmp_path), tmp_path)
    assert [p.label for p in plan.points] == ["c1", "c4"]
    # max(8, requests_per_concurrency x C) measured requests, plus the warm-up
    assert [p.num_requests for p in plan.points] == [8, 8]
    assert plan.spec.vocab_size == 1024  # read from models/tiny-test/config.json
    argv = plan.argv(31234)
    assert argv[argv.index("--port") + 1] == "31234" and argv[argv.index("--pp-size") + 1] == "2"
    assert plan.identity.run_name == "#3 pp.async_depth=0"
    assert len(plan.config_hash) == 16


def test_config_hash_changes_with_what_is_measured_only(tmp_path: Path) -> None:
    base = plan_for(tiny_cfg(tmp_path), tmp_path).config_hash
    deeper = plan_for(tiny_cfg(tmp_path, async_depth=1), tmp_path).config_hash
    elsewhere = tiny_cfg(tmp_path)
    elsewhere.tracking.uri = "sqlite:////somewhere/else.db"  # where results go does not change them
    assert deeper != base
    assert plan_for(elsewhere, tmp_path).config_hash == base


def test_a_bad_job_is_refused_by_the_plan_stage(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, size=8)  # tiny-test has 4 layers
    with pytest.raises(ConfigError, match=r"pp.size=8: invalid .*valid: 1..4"):
        checked_engine(cfg)


def test_labels_name_what_varies_never_sweep_wide_settings_or_secrets() -> None:
    common = frozenset({"model=tiny-test", "tracking.uri=http://u:pw@host:5000"})
    label = trial_label(["model=tiny-test", "pp.async_depth=4", "tracking.uri=http://u:pw@host:5000",
                         "ray.num_gpus=8", "+server.extra_args.api_key=sk-123"], common)
    assert label == "pp.async_depth=4 +server.extra_args.api_key=***"
    assert trial_label(["tracking.experiment=x", "resume=false"]) == "defaults"


def test_sweep_wide_settings_must_agree_between_trials(tmp_path: Path) -> None:
    a, b = tiny_cfg(tmp_path), tiny_cfg(tmp_path)
    b.tracking.experiment = "other"
    with pytest.raises(ConfigError, match=r"^tracking.experiment=other,parasweep: invalid .*one value for"):
        SweepSettings.of([a, b])
    settings = SweepSettings.of([a, tiny_cfg(tmp_path)])
    assert settings.experiment == "parasweep" and settings.tracking_uri == a.tracking.uri


# -- virtual session + load driver -----------------------------------------------------------------
def test_virtual_session_and_load_driver_stream_records_per_point(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path)
    cfg.predict = True
    plan = plan_for(cfg, tmp_path)
    records = tmp_path / "trial" / "records" / "requests.jsonl"
    seen: list[str] = []
    with VirtualSession(plan) as session:
        assert session.server_info["pp_size"] == 2 and "max_running_requests" in session.resolved
        results = drive_load(session, plan.points, plan.spec, records, ProgressWriter(tmp_path, "t"),
                             lambda r: seen.append(r.point.label))
    assert seen == ["c1", "c4"]  # each point handed on as soon as it is known
    assert all(r.metrics["output_tok_s"] > 0 and r.end > r.start for r in results)
    # closed loop at C=4 keeps more requests in flight than at C=1
    assert results[1].metrics["achieved_concurrency"] > results[0].metrics["achieved_concurrency"]
    on_disk = list(read_records(records))
    assert len(on_disk) == sum(len(r.records) for r in results)
    # in virtual time a point runs until its numbers are known, not for the plan's count
    assert all(len(r.records) > p.total_requests for r, p in zip(results, plan.points, strict=True))
    assert all(r.metrics["budget_hit"] in (0.0, 1.0) for r in results)
    assert {r.point for r in on_disk} == {"c1", "c4"}


# -- recorder --------------------------------------------------------------------------------------
def test_recorder_logs_metric_families_and_redacts_once_at_the_door(tmp_path: Path) -> None:
    secret = "sk-very-secret-123"
    config = {"server": {"extra_args": {"api_key": secret}}, "pp": {"async_depth": 4}}
    paths = TrialPaths(tmp_path / "trial")
    tracker = Tracker(sqlite_store(tmp_path / "mlflow.db"), "stages")
    rec = TrialRecorder(tracker, paths, config)
    tags = {Tag.OVERRIDES: f"+server.extra_args.api_key={secret}"}
    run_id = rec.open(f"#0 key={secret}", RunKind.TRIAL, tags, config, parent_run_id=None)
    rec.save_argv(["python", "-m", "simulator", "--api-key", secret, "--port", "1"])
    paths.server_log.write_text(f"starting with api key {secret}\n")
    rec.log_point(PointResult(LoadPoint(concurrency=8, num_requests=8), {"output_tok_s": 12.5, "valid": 1}))
    rec.log_point(PointResult(LoadPoint(rate=2.5, num_requests=8), {"output_tok_s": 3.0}))
    rec.save_server_files()
    saved = rec.save_findings([Finding("pp_bubble", "warning", "t", "e", "s")], TrialStatus.FAILED, "boom")
    rec.close(TrialStatus.FAILED)

    run = tracker.client.get_run(run_id)
    assert run.data.params["server.extra_args.api_key"] == "***"
    assert run.data.params["pp.async_depth"] == "4"
    assert secret not in run.info.run_name and secret not in run.data.tags[Tag.OVERRIDES]
    assert run.data.tags[Tag.STATUS] == "failed" and run.data.tags[Tag.KIND] == "trial"
    assert run.data.metrics["c8/output_tok_s"] == 12.5 and run.data.metrics["r2.5/output_tok_s"] == 3.0
    steps = {m.step for m in tracker.client.get_metric_history(run_id, "output_tok_s")}
    assert steps == {8}  # closed-loop series: step = concurrency
    assert {m.step for m in tracker.client.get_metric_history(run_id, "open/output_tok_s")} == {2500}
    argv = json.loads((paths.root / "server" / "argv.json").read_text())
    assert secret not in argv and "***" in argv
    uploaded = Path(tracker.client.download_artifacts(run_id, "server/server.log", str(tmp_path / "dl")))
    assert secret not in uploaded.read_text() and secret in paths.server_log.read_text()
    assert [f["id"] for f in saved] == ["trial_failed", "pp_bubble"]


# -- the composition -------------------------------------------------------------------------------
def test_execute_trial_in_virtual_time_without_hydra(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path)
    cfg.predict = True
    plan = plan_for(cfg, tmp_path)
    outcome = execute_trial(plan, TrialRunSettings(cfg.tracking.uri, "stages", own_progress_view=False))
    assert outcome.status is TrialStatus.OK, outcome.error
    run = Tracker(cfg.tracking.uri, "stages").client.get_run(outcome.run_id)
    assert run.data.tags[Tag.KIND] == "prediction" and run.data.tags[Tag.STATUS] == "ok"
    assert run.data.tags[Tag.ENGINE] == "sim-predict"
    assert {"c1/output_tok_s", "c4/output_tok_s", "trial/total_s"} <= set(run.data.metrics)
    assert run.data.params["resolved.pp_size"] == "2"
    trial_dir = tmp_path / "trial"
    assert (trial_dir / "records" / "requests.parquet").exists()
    assert isinstance(json.loads((trial_dir / "diagnosis.json").read_text()), list)
    assert "predicted in virtual time" in run.data.tags[Tag.NOTE]


def test_execute_trial_records_a_failure_and_closes_the_run(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path)
    cfg.engine.startup_timeout_s = 5.0
    plan = plan_for(cfg, tmp_path)
    plan.engine.python = lambda _cfg: "/nonexistent/python"  # type: ignore[method-assign]
    outcome = execute_trial(plan, TrialRunSettings(cfg.tracking.uri, "stages", own_progress_view=False))
    assert outcome.status is TrialStatus.FAILED and outcome.error
    run = Tracker(cfg.tracking.uri, "stages").client.get_run(outcome.run_id)
    assert run.data.tags[Tag.STATUS] == "failed" and run.info.status == "FAILED"
    findings = json.loads((tmp_path / "trial" / "diagnosis.json").read_text())
    assert findings[0]["id"] == "trial_failed"
