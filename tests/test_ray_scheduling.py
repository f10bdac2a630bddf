"""Ray placement by GPU demand on a real local Ray with declared GPUs: side by side on disjoint GPU
sets, isolation of a crashing trial, and resume of a finished sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import NO_DRAWING, run_cli

pytestmark = pytest.mark.slow  # a real local Ray


def _client(workdir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{workdir / 'runs' / 'mlflow.db'}")


def _trials(workdir: Path, sweep_index: int = -1) -> list:
    client = _client(workdir)
    exp = client.get_experiment_by_name("parasweep")
    sweeps = client.search_runs([exp.experiment_id], "tags.`parasweep.kind` = 'sweep'",
                                order_by=["attributes.start_time ASC"])
    parent = sweeps[sweep_index]
    return client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")


def _schedule(workdir: Path) -> list[dict]:
    (path,) = sorted((workdir / "runs" / "multirun").glob("*/*/schedule.json"))[-1:]
    return json.loads(path.read_text())


def test_trials_run_side_by_side_on_disjoint_gpus(tmp_path: Path) -> None:
    # a dense 8B model that fits one GPU: world sizes 1, 2 and 4 fit the 8 declared GPUs together
    result = run_cli(["-m", "model=llama-3.1-8b", "parallelism=tp1,tp2,tp4", "ray.num_gpus=8", *NO_DRAWING,
                      "workload.concurrency=[1]", "workload.requests_per_point=4",
                      "workload.warmup_requests=0", "workload.input_len=32", "workload.output_len=200"],
                     tmp_path, timeout=300, store=True)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = _trials(tmp_path)
    assert len(runs) == 3
    devices = {r.data.params["tp.size"]: r.data.tags["parasweep.cuda_visible_devices"] for r in runs}
    sets = {tp: set(cvd.split(",")) for tp, cvd in devices.items()}
    assert {tp: len(s) for tp, s in sets.items()} == {"1": 1, "2": 2, "4": 4}
    assert not (sets["1"] & sets["2"] or sets["1"] & sets["4"] or sets["2"] & sets["4"]), devices
    # where each ran: this host, the one Ray node of the local cluster, no physical GPU (simulated)
    import socket

    nodes = {r.data.tags["parasweep.ray_node_id"] for r in runs}
    assert len(nodes) == 1 and len(nodes.pop()) == 56  # Ray's hex node id
    assert {r.data.tags["parasweep.host"] for r in runs} == {socket.gethostname()}
    assert {r.data.tags["parasweep.gpu_uuids"] for r in runs} == {"none (the simulated engine uses no GPU)"}
    assert f"Where: every trial on host {socket.gethostname()}, Ray node " in result.stdout
    assert "Ran on host " in runs[0].data.tags["mlflow.note.content"]
    # side by side: the driver handed all three to Ray before any came back. (Whether their loads
    # overlapped on the clock is the machine's pace: beside two CPU burners Ray's three workers
    # started 10 s apart, longer than the TP4 trial's whole run.)
    rows = _schedule(tmp_path)
    submitted = [r["submitted"] for r in rows]
    finished = [r["finished"] for r in rows]
    assert max(submitted) < min(finished), rows
    assert all(r["submitted"] <= r["timings"]["load_start"] < r["timings"]["load_end"] <= r["finished"]
               for r in rows), rows


@pytest.fixture(scope="module")
def crash_then_resume(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("resume")
    base = ["-m", "model=tiny-test", "parallelism=pp2", "workload=tiny", "ray.num_cpus=4", *NO_DRAWING]
    # trial 1 models a GPU with almost no memory: the engine refuses to start
    first = run_cli([*base, "hardware.memory_gb=102.6,0.001"], workdir, timeout=300, store=True)
    second = run_cli([*base, "hardware.memory_gb=102.6,0.001"], workdir, timeout=300)
    third = run_cli([*base, "hardware.memory_gb=102.6", "resume=false"], workdir, timeout=300)
    return workdir, first, second, third


def test_crashing_trial_does_not_stop_the_sweep(crash_then_resume) -> None:
    workdir, first, _, _ = crash_then_resume
    assert first.returncode == 1, first.stdout + first.stderr
    runs = {r.data.tags["parasweep.trial_num"]: r for r in _trials(workdir, 0)}
    assert runs["0"].data.tags["parasweep.status"] == "ok"
    failed = runs["1"].data.tags
    assert failed["parasweep.status"] == "failed"
    assert "engine exited with code" in failed["parasweep.error"]
    assert "mem_fraction_static" in failed["parasweep.error"]  # the log tail names the problem
    assert "failed #1" in first.stdout and "status failed" in first.stdout


def test_second_run_resumes(crash_then_resume) -> None:
    workdir, first, second, _ = crash_then_resume
    ok_run = next(r for r in _trials(workdir, 0) if r.data.tags["parasweep.status"] == "ok")
    assert "skipping #0" in second.stdout and ok_run.info.run_id in second.stdout
    runs = {r.data.tags["parasweep.trial_num"]: r for r in _trials(workdir, 1)}
    reused = runs["0"].data
    assert reused.tags["parasweep.status"] == "skipped"
    assert reused.tags["parasweep.reused_run_id"] == ok_run.info.run_id
    assert reused.metrics["c4/output_tok_s"] == ok_run.data.metrics["c4/output_tok_s"]
    assert runs["1"].data.tags["parasweep.status"] == "failed"  # failed trials run again
    assert "parasweep.reused_run_id" not in runs["1"].data.tags
    assert "skipping" not in first.stdout


def test_resume_false_reruns(crash_then_resume) -> None:
    workdir, _, _, third = crash_then_resume
    assert third.returncode == 0, third.stdout + third.stderr
    assert "skipping" not in third.stdout
    (run,) = _trials(workdir, 2)
    assert run.data.tags["parasweep.status"] == "ok" and "parasweep.reused_run_id" not in run.data.tags
