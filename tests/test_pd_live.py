"""The real router (the pinned ``smg``) in PD mode in front of simulated prefill and decode servers:
every request answered through it, one request at a time its TTFT made of the parts the model predicts,
the router's own PD metrics recorded, and a decode server killed mid-point failing the trial in one line
with nothing left running."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.router import pd_launch
from orchestrator.engines.sim import SimEngine
from orchestrator.engines.virtual import virtual_trials
from orchestrator.process.replicas import ReplicaGroup, Worker
from orchestrator.process.server import free_port, free_port_block, group_alive
from tests.conftest import NO_DRAWING, ROOT, kill_server_mid_point, run_cli
from vocab.hardware import load_hardware
from vocab.load import LoadPoint, RequestSpec

pytestmark = pytest.mark.slow

PD_TRIAL = ["pd=1p1d", "model=llama-3.1-8b", "hardware=h100-sxm-x8", "parallelism=tp1", *NO_DRAWING]


def test_a_disaggregated_trial_answers_every_request_through_the_router_and_records_both_roles(
        tmp_path: Path) -> None:
    # outputs long enough that the window holds GPU samples of both servers
    result = run_cli([*PD_TRIAL, "workload=tiny", "workload.concurrency=[2]", "workload.output_len=128"],
                     tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (trial,) = [p.parent for p in tmp_path.glob("runs/outputs/**/records")]
    records = [json.loads(line) for line in (trial / "records" / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["error"] is None and r["output_tokens"] == 128 for r in records)
    server = trial / "server"
    router = json.loads((server / "router_argv.json").read_text())
    assert "--pd-disaggregation" in router and "--prefill" in router and "--decode" in router
    assert "Prefill batch" in (server / "server-prefill0.log").read_text()
    assert "Decode batch" in (server / "server.log").read_text()  # decode server 0 speaks for the engine
    scrapes = (trial / "telemetry" / "router_metrics.jsonl").read_text()
    assert "smg_pd_prefill_duration_seconds" in scrapes
    assert (trial / "telemetry" / "server_metrics-prefill0.jsonl").exists()
    # each response's account of its TTFT, averaged per point as a prediction's
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = [r for r in client.search_runs([client.get_experiment_by_name("parasweep").experiment_id])
              if r.data.tags.get("parasweep.kind") == "trial"]
    metrics = run.data.metrics
    assert metrics["c2/pd_ttft_prefill_ms"] > 0 and metrics["c2/pd_ttft_transfer_ms"] > 0
    parts = sum(metrics[f"c2/pd_ttft_{p}_ms"] for p in ("bootstrap", "prefill_queue", "prefill", "transfer",
                                                           "decode_first"))
    assert parts <= metrics["c2/ttft_mean_ms"] + 1e-6  # the router's and the client's share on top
    # the same parts from the servers' own histograms (what a real SGLang deployment gives): every part
    # counted, and the prefill's (the same for every request of one length, alone) as the responses say
    stage = {p: metrics.get(f"c2/pd_stage_{p}_ms") for p in ("bootstrap", "prefill_queue", "prefill",
                                                             "transfer", "decode_first")}
    assert all(v is not None and v >= 0 for v in stage.values()), stage
    assert stage["prefill"] == pytest.approx(metrics["c2/pd_ttft_prefill_ms"], rel=0.25)
    # the KV each request moved, from the prefill server's histogram: every prompt token's K and V of
    # every layer (Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 x 2 bytes), all on its one GPU
    spec = json.loads((ROOT / "models" / "llama-3.1-8b" / "config.json").read_text())
    per_token = spec["num_hidden_layers"] * spec["num_key_value_heads"] * 128 * 2 * 2
    prompt = sum(r["input_tokens"] for r in records) / len(records)
    assert metrics["c2/pd_transfer_mb_per_gpu"] == pytest.approx(prompt * per_token / 1e6, rel=0.01)
    # both roles' GPUs sampled (one TP1 server each): each role's busy share, as a prediction has it
    assert 0 < metrics["c2/pd_decode_util_pct"] <= 100 and 0 < metrics["c2/pd_prefill_util_pct"] <= 100
    pgids = sorted(p.name for p in server.glob("*.pgid"))
    assert pgids == ["router.pgid", "server-prefill0.pgid", "server.pgid"]
    assert not any(group_alive(int((server / p).read_text())) for p in pgids)


def _cfg(trial_dir: Path) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "llama-3.1-70b", "models/llama-3.1-70b"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    cfg.tp.size = 4
    cfg.pd.enabled = True
    cfg.workload.input_len, cfg.workload.output_len = 3000, 4
    SimEngine().prepare(cfg, trial_dir)
    return cfg


class _Logs:
    def __init__(self, root: Path) -> None:
        self.root = root

    def replica_log(self, rank: int) -> Path:
        return self.root / f"server-{rank}.log"

    @property
    def router_log(self) -> Path:
        return self.root / "router.log"


def test_one_request_at_a_time_its_ttft_is_the_predicted_parts(tmp_path: Path) -> None:
    """Llama-3.1-70B, a TP4 prefill server and a TP4 decode server on one H200 node, 3000-token prompts
    one at a time through the real router. On the engines' clocks the prefill takes exactly the model's
    time; the transfer takes at least the model's (the two servers' messages cross real sockets); the
    client's TTFT covers the decode server's parts and the router's forwarding."""
    cfg = _cfg(tmp_path)
    spec = RequestSpec(input_len=3000, output_len=4)
    predicted = virtual_trials(cfg, tmp_path / "predict")().run_point(
        LoadPoint(concurrency=1, num_requests=2), spec).metrics
    sim = SimEngine()
    ports = [free_port(), free_port()]
    port, prometheus = free_port(), free_port()
    taken = {*ports, port, prometheus}
    launch = pd_launch(cfg, lambda one, p: sim.argv(one, p, tmp_path), ports,
                       lambda _, width: free_port_block(width, taken), port, prometheus, None)
    group = ReplicaGroup(_Logs(tmp_path), stop_grace_s=5.0)
    try:
        group.start_workers([Worker(s.name, s.argv, s.port, dict(os.environ), tmp_path / f"{s.role}.log")
                             for s in launch.servers], 120)
        router = group.start_router(launch.router, port, 120)
        parts_seen = []
        for i in range(3):
            body = {"input_ids": [(7 * i + k) % 5000 + 10 for k in range(3000)], "stream": True,
                    "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
            request = urllib.request.Request(router.url + "/generate", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
            sent = time.monotonic()
            first = None
            with urllib.request.urlopen(request, timeout=60) as resp:
                events = []
                for line in resp:
                    if line.startswith(b"data: {"):
                        first = first if first is not None else time.monotonic() - sent
                        events.append(json.loads(line[6:]))
            meta = events[-1]["meta_info"]
            assert events[-1]["output_ids"] and len(events[-1]["output_ids"]) == 4
            parts = {k[len("sim_pd_"):-2]: v for k, v in meta.items()
                     if k.startswith("sim_pd_") and k.endswith("_s")}
            parts_seen.append(parts)
            assert first is not None and first >= sum(parts.values()) - 1e-6
            assert parts["prefill"] * 1e3 == pytest.approx(predicted["pd_ttft_prefill_ms"], rel=1e-6)
            assert parts["transfer"] * 1e3 >= predicted["pd_ttft_transfer_ms"] - 1e-6
            assert meta["sim_pd_transfer_bytes"] == pytest.approx(predicted["pd_transfer_mb_per_gpu"] * 1e6)
        assert len(parts_seen) == 3
        with urllib.request.urlopen(f"http://127.0.0.1:{prometheus}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert re.search(r"smg_pd_prefill_duration_seconds_count\{[^}]*\} 3", metrics), metrics[:2000]
    finally:
        group.stop()
    assert not any(server.proc is not None and server.proc.poll() is None for server in group.replicas)


def test_a_killed_decode_server_fails_the_trial_in_one_line_and_nothing_is_left(tmp_path: Path) -> None:
    args = [*PD_TRIAL, "workload.input_len=256", "workload.output_len=256", "workload.concurrency=[2]",
            "workload.requests_per_concurrency=200", "workload.warmup_requests=0", "workload.ci_target=null"]
    code, error = kill_server_mid_point(args, tmp_path, "Decode batch", "server.pgid")
    assert code != 0
    first = error.read_text().splitlines()[0]
    assert re.match(r"decode server 0's engine exited with code -9 .*during point c2", first), first
    server = error.parent / "server"
    pgids = sorted(server.glob("*.pgid"))
    assert len(pgids) == 3 and not any(group_alive(int(p.read_text())) for p in pgids)


def test_a_decode_server_with_attention_dp_serves_through_the_router_on_every_rank(tmp_path: Path) -> None:
    """The decode server of a disaggregated pair runs two attention-DP ranks (Llama-3.1-8B, TP2): every
    request is answered through the router, its KV fetched by the rank it was dealt to, and both ranks
    report their own batches."""
    result = run_cli(["pd=1p1d", "model=llama-3.1-8b", "hardware=h100-sxm-x8", "parallelism=tp1", *NO_DRAWING,
                      "pd.decode.tp=2", "pd.decode.attention=2", "workload=tiny", "workload.concurrency=[4]",
                      "workload.output_len=64"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (trial,) = [p.parent for p in tmp_path.glob("runs/outputs/**/records")]
    records = [json.loads(line) for line in (trial / "records" / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["error"] is None and r["output_tokens"] == 64 for r in records)
    argv = json.loads((trial / "server" / "argv.json").read_text())  # decode server 0's
    assert argv[argv.index("--attn-dp-size") + 1] == "2"
    log = (trial / "server" / "server.log").read_text()
    assert re.search(r"DP0 TP0\] Decode batch", log) and re.search(r"DP1 TP1\] Decode batch", log)
