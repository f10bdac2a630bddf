"""A real router (the pinned ``smg`` package) in front of two simulated-engine replicas, swept over its
two policies on shared-prefix groups, one request at a time: round-robin alternates the replicas, so
each computes every group's system prompt; cache-aware sends each group's requests where its prompt is
already cached, so each prompt is computed once. One at a time, what is cached when a request arrives
does not depend on timing, so the hit rates measured through the real router must equal the simulated
router's prediction of the same points exactly (as measured: the ``pred/`` column's points run longer,
until their numbers are known). Every process the trials started is gone afterwards.

(Many in flight on a pool too small for every group, the real router's placement of each group's first
request depends on the replicas' load at that instant, and with it how far a thrashing pool's hit rate
falls: docs/simulator.md has such runs; they are not a test.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from orchestrator.calibrate import predict_trial_points
from orchestrator.config.validate import typed_config
from orchestrator.process.server import group_alive
from tests.conftest import NO_DRAWING, run_cli

pytestmark = pytest.mark.slow

SWEEP = ["-m", "model=llama-3.1-8b", "hardware=h100-sxm-x8", "parallelism=tp1", "ray.num_cpus=2", *NO_DRAWING,
         "workload=shared-prefix", "workload.concurrency=[1]", "workload.requests_per_concurrency=64",
         "workload.shared_prefix.groups=8",
         "workload.shared_prefix.prompts_per_group=8", "workload.shared_prefix.system_len=2000",
         "workload.shared_prefix.question_len=64", "workload.shared_prefix.output_len=4",
         "dp.size=2", "dp.router_impl=smg", "dp.router=round_robin,cache_aware"]


def test_the_real_router_keeps_groups_together_where_round_robin_splits_them(tmp_path: Path) -> None:
    result = run_cli(SWEEP, tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("parasweep")
    assert exp is not None
    trials = {r.data.params["dp.router"]: r for r in client.search_runs([exp.experiment_id])
              if r.data.tags.get("parasweep.kind") == "trial"}
    hit = {policy: run.data.metrics["c1/cache_hit_rate"] for policy, run in trials.items()}
    predicted = {}
    for policy, run in trials.items():  # each trial's own config, as it recorded it
        resolved = Path(run.data.tags["parasweep.trial_dir"]) / "config" / "resolved.yaml"
        cfg = typed_config(OmegaConf.create(yaml.safe_load(resolved.read_text())))
        predicted[policy] = predict_trial_points(cfg, ["c1"])["c1"]["cache_hit_rate"]
        assert "pred/c1/cache_hit_rate" in run.data.metrics
    offered = trials["cache_aware"].data.metrics["c1/offered_hit_rate"]
    assert hit == pytest.approx(predicted, abs=1e-9)
    # cache-aware: every system prompt computed once, as by one replica; round-robin: on both replicas
    assert hit["cache_aware"] == pytest.approx(offered, abs=1e-9)
    assert hit["round_robin"] < hit["cache_aware"] - 0.03
    for policy, run in trials.items():
        m = run.data.metrics
        assert m["c1/dp0_request_share"] + m["c1/dp1_request_share"] == pytest.approx(1.0)
        assert 0.0 <= m["c1/dp0_cache_hit_rate"] <= 1.0 and 0.0 <= m["c1/dp1_cache_hit_rate"] <= 1.0
        trial_dir = Path(run.data.tags["parasweep.trial_dir"])
        server = trial_dir / "server"
        argv = json.loads((server / "router_argv.json").read_text())
        assert argv[argv.index("--policy") + 1] == policy
        assert "Prefill batch" in (server / "server-dp1.log").read_text()  # both replicas served
        pgids = sorted(server.glob("*.pgid"))
        assert [p.name for p in pgids] == ["router.pgid", "server-dp1.pgid", "server.pgid"]
        assert not any(group_alive(int(p.read_text())) for p in pgids)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "server")}
        assert "server/router_argv.json" in artifacts
        assert "behind the router package (smg==1.13.0" in run.data.tags["mlflow.note.content"]
        env = json.loads((trial_dir / "env.json").read_text())
        assert "1.13.0" in json.dumps(env)  # the router's version in the environment fingerprint
    assert "c1/router_tree_match_frac" in trials["cache_aware"].data.metrics
    summary = " ".join(result.stdout.split())  # its lines wrapped at the terminal's width
    assert "Prefix cache" in summary and "behind the router, replica 0: " in summary


def test_a_replica_that_crashes_fails_the_trial_and_nothing_is_left(tmp_path: Path) -> None:
    # every replica carries the fault: the first to serve three requests crashes mid-point
    result = run_cli(["model=tiny-test", "hardware=h200-nvlink-x8", "parallelism=tp1", "dp.size=2",
                      "dp.router_impl=smg", "dp.router=cache_aware", "workload=tiny",
                      "workload.concurrency=[1]", "engine.sim_faults.crash_after_requests=3"],
                     tmp_path, timeout=300)
    assert result.returncode != 0
    (error,) = tmp_path.glob("runs/outputs/**/error.txt")  # the trial directory's (not MLflow's copy)
    first = error.read_text().splitlines()[0]
    pattern = r"DP replica [01]'s engine exited with code -?\d+ .*during point c1 after \d+ of"
    assert re.match(pattern, first), first
    server = error.parent / "server"
    pgids = sorted(server.glob("*.pgid"))
    assert len(pgids) == 3 and not any(group_alive(int(p.read_text())) for p in pgids)
