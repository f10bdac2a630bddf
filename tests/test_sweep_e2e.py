"""The spine end to end: a Hydra sweep on a real local Ray, the simulated engine over real HTTP, and
a real sqlite MLflow store, checked against the MLflow layout in docs/mlflow-layout.md."""

from __future__ import annotations

import math
import re

import pytest

from analysis.report import MAX_WIDTH
from orchestrator.process.server import group_alive
from tests.conftest import run_cli
from vocab.metric_keys import CONTRACT_METRICS

pytestmark = pytest.mark.slow  # Ray, engines, MLflow

# fast but honest: a tiny MoE model in PP2 on the simulated RTX PRO node, two load points
SMALL = ["model=tiny-test", "parallelism=pp2", "workload=tiny", "ray.num_cpus=2"]
CONTRACT_ARTIFACTS = ["config/resolved.yaml", "config/overrides.yaml", "server/server.log",
                      "server/server_info.json", "server/argv.json", "records/requests.parquet",
                      "diagnosis.json"]


def _artifacts(client, run_id: str, path: str = "") -> list[str]:
    out = []
    for item in client.list_artifacts(run_id, path or None):
        out += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("sweep")
    # a 100-column terminal: the end-of-sweep summary must fit it (test_summary_of_a_real_sweep)
    result = run_cli(["-m", *SMALL, "pp.async_depth=0,2"], workdir, timeout=600, env={"COLUMNS": "100"})
    return workdir, result


def test_sweep_completes_and_prints_summary(sweep) -> None:
    _workdir, result = sweep
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "2 trial(s), status ok" in out
    # labels name what varies between trials, never what they share or sweep-wide settings
    assert "#0 pp.async_depth=0" in out and "#1 pp.async_depth=2" in out
    table = out.split("Run this instead")[0]
    assert "ray.num_cpus" not in table and "model=tiny-test parallelism" not in table
    # what to run instead is the whole command: the trial's own overrides, not the sweep-wide settings
    if "Run this instead: " in out and "Run this instead: nothing" not in out:
        line = next(x for x in out.splitlines() if x.startswith("  python run.py "))
        assert line.startswith("  python run.py model=tiny-test parallelism=pp2 workload=tiny ")
        assert "ray.num_cpus" not in out
    assert "pp.async_depth=0" in out and "pp.async_depth=2" in out
    assert "mlflow ui --backend-store-uri sqlite:///" in out and "--host 127.0.0.1" in out
    assert "#/experiments/" in out and "workflowType=machine_learning" in out
    assert "tok/s (pred)" in out  # the measurement with the simulator's prediction in brackets


def test_summary_of_a_real_sweep_fits_100_columns_and_explains(sweep) -> None:
    _workdir, result = sweep
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    too_wide = [line for line in out.splitlines() if len(line) > MAX_WIDTH]
    assert not too_wide, f"lines over {MAX_WIDTH} columns: {too_wide}"
    assert re.search(r"^Simulated engine \(engine=auto: [^)]*\): the simulator's numbers, not measured$",
                     out, re.M), out
    assert re.search(r"^    played at 4x real time \(engine.time_scale\) and timed on its own clock: every "
                     r"time and rate is in\n    the engine's seconds$", out, re.M), out
    # what priced those numbers, in the header and in the summary
    assert re.search(r"^\[parasweep\] step costs: (measured \(aiconfigurator-core [\d.]+: "
                     r"rtx_pro_6000_server|roofline \()", out, re.M), out
    assert re.search(r"^Step costs: (measured|roofline) \(", out, re.M), out
    # each point is judged: "*" the best trial beyond the noise of both, or "within noise" where none
    # is, and "!" a point whose client fell behind (the load generator shares the machine with the
    # engines; on a busy machine it can fall behind)
    assert "tok/s (pred)" in out
    assert "* best of the trials" in out or "within noise, no trial marked" in out or "!" in out
    # which trials differ in throughput, and what became of the gaps the model predicted (its
    # predictions are logged with their intervals); a point whose client fell behind is judged by none
    apart = re.search(r"^c\d+ tok/s(: no two trials apart beyond noise$| apart beyond noise: #)", out, re.M)
    model = re.search(r"^c\d+ tok/s(, the model's gaps: #\d > #\d [+-]\d+ % (confirmed|reversed|not)"
                      r"|: the model predicts no gap beyond its noise between these trials$)", out, re.M)
    assert (apart and model) or "!" in out, out
    # the micro-batch finding, once for both trials, then the change and what it is predicted to do
    found = re.search(r"^(CRITICAL|warning): all 2 trials: .*micro-batch.*\n(  → .*\n(    .*\n)*)", out, re.M)
    assert found, out
    body = " ".join(found.group(2).split())
    assert re.search(r"set (\S+=\S+ )*\S+=\S+: predicted \d+ → \d+ tok/s \(\+\d+%\)", body), out
    assert "workload.concurrency" not in body.split("more load, not a fix")[0]  # load is never the fix
    assert "mlflow ui --backend-store-uri sqlite:///runs/mlflow.db" in out


def test_mlflow_layout(sweep) -> None:
    workdir, result = sweep
    assert result.returncode == 0, result.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("parasweep")
    assert exp is not None
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI's training view
    assert exp.artifact_location.startswith("file://") and "runs/artifacts" in exp.artifact_location
    runs = client.search_runs([exp.experiment_id])
    sweeps = [r for r in runs if r.data.tags.get("parasweep.kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("parasweep.kind") == "trial"]
    assert len(sweeps) == 1 and len(trials) == 2
    parent = sweeps[0]
    assert parent.data.tags["parasweep.status"] == "ok" and parent.info.status == "FINISHED"
    # what the runs table shows before anything is expanded: a name saying what was swept, a
    # description with every trial, roll-up metrics
    assert parent.info.run_name == "sweep pp.async_depth=0,2"
    assert "| #0 pp.async_depth=0 | ok |" in parent.data.tags["mlflow.note.content"]
    assert parent.data.metrics["best/c4/output_tok_s"] > 0 and parent.data.metrics["trials_ok"] == 2

    depths = set()
    for run in trials:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        depth = params["pp.async_depth"]
        assert run.info.run_name == f"#{tags['parasweep.trial_num']} pp.async_depth={depth}"
        assert "| c4 |" in tags["mlflow.note.content"]
        assert tags["parasweep.status"] == "ok" and run.info.status == "FINISHED"
        assert tags["parasweep.engine"] == "sim"
        # why, as the sweep's driver decided it and passed it to the trial
        assert tags["parasweep.engine_reason"].startswith("engine=auto: ")
        # engine=auto plays the simulated engine at 4x real time, timed on its own clock: said per trial
        assert tags["parasweep.sim_time_scale"] == "4"
        assert tags["parasweep.engine_version"] and tags["parasweep.engine_version"] != "unknown"
        assert len(tags["parasweep.config_hash"]) == 16
        depths.add(params["pp.async_depth"])
        assert params["pp.size"] == "2" and params["model.name"] == "tiny-test"
        assert int(params["resolved.max_running_requests"]) >= 1
        cap = int(params["resolved.pp_max_micro_batch_size"])
        assert cap == max(int(params["resolved.max_running_requests"]) // 2, 1)
        for c in (1, 4):
            for name in CONTRACT_METRICS:
                assert f"c{c}/{name}" in metrics, f"c{c}/{name} missing"
            assert metrics[f"c{c}/errors"] == 0
            assert metrics[f"c{c}/output_tok_s"] > 0
            assert not math.isnan(metrics[f"c{c}/ttft_p99_ms"])
        # the same metrics as step series against load (step = concurrency)
        history = client.get_metric_history(run.info.run_id, "output_tok_s")
        assert sorted(m.step for m in history) == [1, 4]
        # the simulator's prediction for the same config, logged next to the measurement
        assert metrics["pred/c4/output_tok_s"] > 0 and "pred/c1/ttft_p99_ms" in metrics
        # more concurrency, more throughput, on any sane engine: in the prediction (virtual time); the
        # live tiny model's steps take microseconds, so on a busy machine its live numbers are the
        # host's (the live engine's own throughput test: test_simulator_live_vs_predicted.py)
        assert metrics["pred/c4/output_tok_s"] > metrics["pred/c1/output_tok_s"]
        assert metrics["c4/output_tok_s"] > 0 and metrics["c1/output_tok_s"] > 0
        arts = _artifacts(client, run.info.run_id)
        for name in CONTRACT_ARTIFACTS:
            assert name in arts, f"{name} missing from {arts}"
        assert any(a.startswith("telemetry/") and a.endswith(".parquet") for a in arts)
        assert any(a.startswith("plots/") and a.endswith(".png") for a in arts)
    assert depths == {"0", "2"}


def test_records_and_diagnosis_content(sweep) -> None:
    import json

    import pandas as pd

    workdir, _ = sweep
    trial_dirs = sorted(p.parent for p in (workdir / "runs" / "multirun").glob("*/*/*/progress.json"))
    assert len(trial_dirs) == 2
    for d in trial_dirs:
        df = pd.read_parquet(d / "records" / "requests.parquet")
        measured = df[~df["warmup"]]
        # workload=tiny: max(8, 2 x C) requests at C=1 and C=4, plus one warm-up request per point
        assert len(measured) == 16
        assert (measured["output_tokens"] == 8).all()
        # the engine's own queue time of each request (/generate's meta_info, metrics on)
        assert measured["server_queue_s"].notna().all() and (measured["server_queue_s"] >= 0).all()
        # exactly one engine per trial, stopped before the trial ended (its group is gone)
        log = (d / "server" / "server.log").read_text()
        assert log.count("The server is fired up and ready to roll!") == 1
        assert "address already in use" not in log
        assert not group_alive(int((d / "server" / "server.pgid").read_text()))
        findings = json.loads((d / "diagnosis.json").read_text())
        # PP2 with the default micro-batch cap (max_running_requests // 2) puts all 4 requests of
        # c4 in one micro-batch: the diagnosis must say so
        assert "too_few_microbatches" in {f["id"] for f in findings}, findings
        for f in findings:
            assert set(f) == {"id", "severity", "title", "evidence", "suggestion", "point", "change",
                              "alternatives", "predicted_effect", "goal", "more_load"}
            if f["change"]:  # every suggested change was predicted before it was made
                assert f["predicted_effect"]["verdict"] == "helps", f
        # GPU telemetry of the simulated engine, named as such, on the load's clock
        for d in trial_dirs:
            gpu = pd.read_parquet(d / "telemetry" / "gpu.parquet")
            assert set(gpu["gpu"]) == {0, 1} and set(gpu["pp"]) == {0, 1}
            assert (gpu["uuid"].str.startswith("sim-")).all()
            assert gpu["energy_j"].is_monotonic_increasing or gpu.groupby("gpu")["energy_j"].apply(
                lambda s: s.is_monotonic_increasing).all()


def test_the_simulated_engine_passes_the_first_gpu_node_check(sweep, tmp_path) -> None:
    # the check scripts/gpu_first_node.sh runs on real SGLang: the stand-in must pass it, and a trial
    # directory that lacks what the adapter reads must fail it, one line per difference
    import json
    import shutil

    from orchestrator.engines.sglang_compat.trial_check import check_trial, main, trial_dirs

    workdir, _ = sweep
    trials = trial_dirs([workdir / "runs"])
    assert len(trials) == 2
    for trial in trials:
        ok, differ = check_trial(trial)
        assert differ == [] and len(ok) >= 15, differ
    assert main([str(workdir / "runs")]) == 0
    broken = shutil.copytree(trials[0], tmp_path / "trial")
    info = json.loads((broken / "server" / "server_info.json").read_text())
    del info["internal_states"][0]["pp_max_micro_batch_size"]
    (broken / "server" / "server_info.json").write_text(json.dumps(info))
    metrics = broken / "telemetry" / "server_metrics.jsonl"
    # each scrape is kept as its exposition text, JSON-quoted: pp_rank=\"1\"
    metrics.write_text(metrics.read_text().replace('pp_rank=\\"1\\"', 'pp_rank=\\"0\\"'))
    _, differ = check_trial(broken)
    assert any("internal_states[0] has no pp_max_micro_batch_size" in d for d in differ), differ
    assert any("pp_rank [0] of 2" in d for d in differ), differ
    assert main([str(tmp_path)]) == 1 and main([str(tmp_path / "nothing")]) == 2
