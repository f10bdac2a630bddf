"""A disaggregated vLLM deployment: the launch per release (from each release's wheel as recorded), the
simulated engine's NIXL connector in its scheduler, on one clock (predictions) and through the real
vllm-router in front of live simulated servers (the slow tier)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config.disagg import validate_pd
from orchestrator.config.schema import ParasweepConf, worker_config
from orchestrator.engines.router import pd_launch
from orchestrator.engines.vllm_compat.command import build_args, vllm_argv
from orchestrator.engines.vllm_compat.versions import RECORDED, release
from orchestrator.errors import ConfigError
from orchestrator.process.server import free_port_block, group_alive
from simulator.entities import Request
from simulator.predict import load_config
from simulator.predict_disagg import load_layout
from simulator.vllm.cli import VLLMFlagError, parse
from simulator.vllm.disagg import VLLMDeployment
from simulator.vllm.nixl import transfer_params
from tests.conftest import NO_DRAWING, ROOT, kill_server_mid_point, run_cli
from vocab.hardware import load_hardware

MODEL = "qwen3-8b"
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def _cfg(engine: str = "vllm", **pd: object) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = engine
    cfg.model.name, cfg.model.path = MODEL, f"models/{MODEL}"
    cfg.hardware = load_hardware("h100-sxm-x8")
    cfg.tp.size = 1
    cfg.pd.enabled, cfg.pd.transfer_backend = True, "nixl"
    for key, value in pd.items():
        setattr(cfg.pd, key, value)
    return cfg


@pytest.mark.parametrize("version", RECORDED)
def test_each_server_s_kv_transfer_config_is_one_its_release_takes(version: str) -> None:
    cfg = _cfg()
    for role in ("prefill", "decode"):
        argv = vllm_argv(worker_config(cfg, role, 0), "python", 8000, version)
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == "NixlConnector"
        assert config["kv_role"] in release(version).kv_roles
        # kv_both up to 0.19; 0.34 deprecates it for a role per server
        split = {"prefill": "kv_producer", "decode": "kv_consumer"}
        expected = "kv_both" if version != "0.34.0" else split[role]
        assert config["kv_role"] == expected


def test_a_deployment_s_servers_each_get_a_side_channel_and_vllm_router_names_them_by_role() -> None:
    cfg = _cfg(prefill=_role(2), decode=_role(1))
    launch = pd_launch(cfg, lambda one, port: [str(port), one.pd.role], [101, 102, 103],
                       lambda offset, _: 7000 + offset, 200, 201, None)
    assert [(s.name, s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for s in launch.servers] == [
        ("prefill server 0", "7000"), ("prefill server 1", "7001"), ("decode server 0", "7002")]
    assert all(s.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1" and s.bootstrap_port is None
               for s in launch.servers)
    router = launch.router
    assert router[2] == "vllm_router.launch_router" and "--vllm-pd-disaggregation" in router
    pairs = [(router[i], router[i + 1]) for i, a in enumerate(router) if a in ("--prefill", "--decode")]
    assert pairs == [("--prefill", "http://127.0.0.1:101"), ("--prefill", "http://127.0.0.1:102"),
                     ("--decode", "http://127.0.0.1:103")]


def test_a_server_with_ranks_gets_a_side_channel_port_for_each_of_its_gpus() -> None:
    # vLLM's ranks of one server listen from its side channel's port up, offset by their DP rank (times
    # the TP size, plus the TP rank, in some releases): a block of one port per GPU of the server holds
    # either rule, and the next server's block starts after it
    from orchestrator.config.schema import PDRoleConf

    cfg = _cfg(prefill=PDRoleConf(workers=1, tp=2, dp=2), decode=PDRoleConf(workers=2, tp=2))
    cfg.dry_run = True
    validate_pd(cfg, "vllm")
    launch = pd_launch(cfg, lambda one, port: [str(port)], [101, 102, 103], lambda offset, _: 7000 + offset,
                       200, 201, None)
    assert [(s.gpus, s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for s in launch.servers] == [
        ("0,1,2,3", "7000"), ("4,5", "7004"), ("6,7", "7006")]
    # a trial's blocks: each free when handed out, none overlapping another or a port given before
    taken = {101, 102, 103}
    launch = pd_launch(cfg, lambda one, port: [str(port)], [101, 102, 103],
                       lambda _, width: free_port_block(width, taken), 200, 201, None)
    blocks = [range(int(s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]), int(s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + n)
              for s, n in zip(launch.servers, (4, 2, 2), strict=True)]
    ports = [p for block in blocks for p in block]
    assert len(set(ports)) == 8 and taken == {101, 102, 103, *ports}


def _role(workers: int) -> object:
    from orchestrator.config.schema import PDRoleConf

    return PDRoleConf(workers=workers)


def test_the_layouts_tried_around_an_aggregated_vllm_trial_include_nixl_deployments() -> None:
    from orchestrator.prediction.neighbourhood import layouts

    cfg = _cfg()
    cfg.pd.enabled, cfg.pd.transfer_backend = False, "mooncake"  # the schema's default, SGLang's
    cfg.tp.size = 2
    disaggregated = [c for c in layouts(cfg) if c.get("pd.enabled")]
    assert disaggregated and all(c["pd.transfer_backend"] == "nixl" for c in disaggregated)
    for change in disaggregated:  # each one a valid vLLM deployment
        one = _cfg(transfer_backend=change["pd.transfer_backend"])
        one.pd.prefill.workers = change["pd.prefill.workers"]
        one.pd.decode.workers = change["pd.decode.workers"]
        one.dry_run = True
        validate_pd(one, "sim-vllm")


@pytest.mark.parametrize(("key", "value", "words"), [
    ("transfer_backend", "mooncake", "pd.transfer_backend=mooncake: invalid (vLLM's KV connector"),
    ("bootstrap_port", 9000, "pd.bootstrap_port=9000: invalid (SGLang's bootstrap server"),
    ("reserved_decode_tokens", 256, "pd.reserved_decode_tokens=256: invalid (SGLang's"),
])
def test_sglang_s_own_pd_keys_are_refused_on_vllm_in_one_line(key: str, value: object, words: str) -> None:
    cfg = _cfg(**{key: value})
    cfg.dry_run = True
    with pytest.raises(ConfigError) as e:
        validate_pd(cfg, "sim-vllm")
    assert str(e.value).startswith(words) and "\n" not in str(e.value), str(e.value)


def test_a_kv_transfer_config_in_extra_args_is_refused_with_the_key_that_sets_it() -> None:
    cfg = _cfg()
    cfg.pd.enabled = False
    cfg.server.extra_args = {"kv-transfer-config": KV}
    with pytest.raises(ConfigError) as e:
        build_args(cfg, 8000)
    assert "set it with pd.enabled and pd.transfer_backend" in str(e.value)


@pytest.mark.parametrize(("config", "words"), [
    ('{"kv_connector":"NixlConnector"}', "Please specify kv_role when kv_connector is set"),
    ('{"kv_connector":"NixlConnector","kv_role":"kv_sender"}', "Unsupported kv_role: kv_sender"),
    ('{"kv_connector":"MooncakeConnector","kv_role":"kv_both"}', "is not modelled by the simulated engine"),
    ('["NixlConnector"]', "--kv-transfer-config .*: not a JSON object"),
])
def test_the_simulated_engine_refuses_a_kv_transfer_config_in_vllm_s_words(config: str, words: str) -> None:
    with pytest.raises(VLLMFlagError, match=words):
        parse(["serve", str(ROOT / "models" / MODEL), "--sim-hardware", "h100-sxm-x8", "--kv-transfer-config",
               config], exit_on_error=False)


@pytest.mark.parametrize("version", RECORDED)
def test_a_prefill_server_answers_with_the_keys_its_release_writes(version: str) -> None:
    req = Request("r", 100, 1, 0)
    params = transfer_params(version, req, "key", "engine", "127.0.0.1", 5600, 2, 1, 16, 0.0)
    assert tuple(params) == release(version).nixl_params  # the keys and their order, as the wheel writes
    blocks = params["remote_block_ids"]
    flat = blocks[0] if version >= "0.18" else blocks  # one list per KV-cache group from 0.18
    assert len(flat) == 7  # 100 tokens in blocks of 16


# -- the connector in vLLM's scheduler, on one clock ------------------------------------------------------


def _argv(*extra: str, release_: str = "0.18.0") -> list[str]:
    return ["serve", str(ROOT / "models" / MODEL), "--sim-hardware", "h100-sxm-x8", "--load-format", "dummy",
            "--sim-vllm-release", release_, "--kv-transfer-config", KV, *extra]


def _deployment(*extra: str) -> VLLMDeployment:
    layout = load_layout(_argv(*extra), _argv(*extra), 1, 1)
    dep = layout.build()
    assert isinstance(dep, VLLMDeployment)
    return dep


def _request(rid: str, n_in: int, n_out: int, seed: int = 1) -> tuple[Request, np.ndarray]:
    prompt = np.random.default_rng(seed).integers(0, 30000, n_in)
    return Request(rid, n_in, n_out, seed, stream=True, prompt=prompt), prompt


def test_one_request_s_ttft_is_the_prefill_the_read_and_one_decode_step() -> None:
    dep = _deployment()
    req, prompt = _request("a", 2048, 8)
    dep.submit(req, prompt)
    dep.sim.run_until(600.0)
    assert req.finished and len(req.output_ids) == 8
    pd = req.pd
    assert pd is not None and pd.prefill_start >= 0
    prefill, decode = dep.prefills[0].replica, dep.decodes[0].replica
    # the decode server computed no prompt chunk: the read brought the prompt, its last token went with
    # the decode steps (one query token each), and eight steps made the eight tokens
    assert decode.prompt_tokens_computed == 0 and prefill.prompt_tokens_computed == 2048
    assert decode.decode_steps == 8 and decode.prefill_steps == 0
    per_token = dep.per_token[0][0]
    assert pd.transfer_bytes == pytest.approx(2048 * per_token)  # nothing in the decode server's cache
    path = dep.paths[0][0]
    assert pd.transferred - pd.prefill_end == pytest.approx(dep.hop + 2048 * per_token / path.bandwidth
                                                            + path.latency, rel=0.05, abs=2e-4)
    assert pd.first_token > pd.transferred
    # the prefill server let go of the request's blocks once they were read
    assert prefill.admission.held == {} and prefill.admission.kv_used == 0


def test_a_prefill_server_keeps_a_finished_request_s_kv_until_it_has_been_read() -> None:
    dep = _deployment()
    req, prompt = _request("a", 4096, 4)
    dep.submit(req, prompt)
    prefill = dep.prefills[0].replica
    used_while_held: list[int] = []

    def watch() -> None:
        if prefill.admission.held:
            used_while_held.append(prefill.admission.held_tokens)
        if not req.finished:
            dep.sim.schedule(dep.sim.now + 1e-4, watch)

    dep.sim.schedule(0.0, watch)
    dep.sim.run_until(600.0)
    assert used_while_held and max(used_while_held) >= 4096 - 16  # the prompt's blocks, held
    assert prefill.admission.held_tokens == 0


def test_a_decode_server_short_of_kv_reads_a_request_only_once_the_blocks_are_free() -> None:
    # a decode server whose KV holds about one prompt: the second request's read waits for the first
    dep = _deployment("--max-model-len", "8192")
    decode = dep.decodes[0].replica
    decode.admission.kv_capacity = 6000
    first, p1 = _request("a", 4000, 64, 1)
    second, p2 = _request("b", 4000, 4, 2)
    dep.submit(first, p1)
    dep.submit(second, p2)
    dep.sim.run_until(600.0)
    assert first.finished and second.finished
    assert second.pd is not None and first.pd is not None
    assert second.pd.transferred > first.finish_time  # read after the first request's blocks were freed


def test_a_vllm_deployment_is_predicted_with_the_connector_s_flow() -> None:
    from simulator.predict_disagg import predict_pd_trial
    from vocab.load import LoadPoint, RequestSpec

    spec = RequestSpec(api="completions", input_len=1024, output_len=64)
    (point,) = predict_pd_trial(_argv(), _argv(), 1, 1, [LoadPoint(num_requests=16, concurrency=1)], spec)
    m = point.metrics
    assert m["pd_ttft_bootstrap_ms"] == 0.0  # no bootstrap on vLLM
    parts = sum(m[f"pd_ttft_{p}_ms"] for p in ("prefill_queue", "prefill", "transfer", "decode_first"))
    assert parts == pytest.approx(m["ttft_mean_ms"], rel=0.05)
    per_token = load_config(_argv()).cost.stages[0].kv_bytes_per_token
    assert m["pd_transfer_mb_per_gpu"] == pytest.approx(1024 * per_token / 1e6, rel=0.05)


# -- live: the real vllm-router in front of simulated vLLM servers ----------------------------------------

VLLM_PD_TRIAL = ["engine=vllm", "pd=1p1d", "pd.transfer_backend=nixl", f"model={MODEL}",
                 "hardware=h100-sxm-x8", "parallelism=tp1", *NO_DRAWING]


@pytest.mark.slow
def test_a_disaggregated_vllm_trial_reads_every_request_s_kv_through_vllm_router(tmp_path: Path) -> None:
    result = run_cli([*VLLM_PD_TRIAL, "workload=tiny", "workload.concurrency=[2]", "workload.output_len=32"],
                     tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (trial,) = [p.parent for p in tmp_path.glob("runs/outputs/**/records")]
    records = [json.loads(line) for line in (trial / "records" / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["error"] is None and r["output_tokens"] == 32 for r in records)
    server = trial / "server"
    router = json.loads((server / "router_argv.json").read_text())
    assert "--vllm-pd-disaggregation" in router
    assert "Creating v1 connector with name: NixlConnector" in (server / "server-prefill0.log").read_text()
    # every request's KV was read by the decode server (none computed again there), as its series say
    last = (trial / "telemetry" / "server_metrics.jsonl").read_text().splitlines()[-1]
    reads = re.search(r'vllm:nixl_xfer_time_seconds_count\{[^}]*\} ([0-9.]+)', last)
    prompts = re.search(r'vllm:prompt_tokens_total\{[^}]*\} ([0-9.]+)', last)
    assert reads is not None and prompts is not None, last[:2000]
    assert float(reads.group(1)) == len(records)  # one read per request the client sent
    # the TTFT's parts from each role's own histograms (no bootstrap on vLLM), the KV moved per request
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = [r for r in client.search_runs([client.get_experiment_by_name("parasweep").experiment_id])
              if r.data.tags.get("parasweep.kind") == "trial"]
    assert ("Disaggregated: 1 prefill server of tp=1 pp=1 ep=1 dp=1, 1 decode server of tp=1 pp=1 ep=1 dp=1; "
            "KV over nixl, vllm-router in PD mode in front") in run.data.tags["mlflow.note.content"]
    metrics = run.data.metrics
    stage = {p: metrics.get(f"c2/pd_stage_{p}_ms") for p in ("prefill_queue", "prefill", "transfer",
                                                             "decode_first")}
    assert all(v is not None and v >= 0 for v in stage.values()) and stage["prefill"] > 0, stage
    assert "c2/pd_stage_bootstrap_ms" not in metrics
    assert sum(stage.values()) <= metrics["c2/ttft_mean_ms"] + 1e-6  # the router's hops on top
    spec = json.loads((ROOT / "models" / MODEL / "config.json").read_text())
    per_token = spec["num_hidden_layers"] * spec["num_key_value_heads"] * spec["head_dim"] * 2 * 2
    prompt = sum(r["input_tokens"] for r in records) / len(records)
    assert metrics["c2/pd_transfer_mb_per_gpu"] == pytest.approx(prompt * per_token / 1e6, rel=0.01)


@pytest.mark.slow
def test_a_killed_prefill_server_fails_the_vllm_trial_in_one_line_and_nothing_is_left(
        tmp_path: Path) -> None:
    args = [*VLLM_PD_TRIAL, "workload.input_len=256", "workload.output_len=256", "workload.concurrency=[2]",
            "workload.requests_per_concurrency=200", "workload.warmup_requests=0", "workload.ci_target=null"]
    # decode server 0 speaks for the engine: its stats line says the point is running
    code, error = kill_server_mid_point(args, tmp_path, "Avg generation throughput", "server-prefill0.pgid")
    assert code != 0
    first = error.read_text().splitlines()[0]
    assert re.match(r"prefill server 0's engine exited with code -9 .*during point c2", first), first
    pgids = sorted((error.parent / "server").glob("*.pgid"))
    assert len(pgids) == 3 and not any(group_alive(int(p.read_text())) for p in pgids)


# -- aiconfigurator-core's disaggregated vLLM rows, replayed ---------------------------------------------


def test_the_served_disaggregated_vllm_rows_map_to_each_role_s_vllm_layout(tmp_path: Path) -> None:
    from orchestrator.fidelity.replay import plan
    from orchestrator.fidelity.silicon import Unreplayable, default_csv
    from orchestrator.fidelity.silicon_disagg import read_disagg
    from orchestrator.fidelity.silicon_vllm import to_vllm_disagg_entry

    rows, cleaning = read_disagg(default_csv(), "vllm")
    assert cleaning.rows == 17 and len(rows) == 17
    by_id = {r.id: r for r in rows}
    # Qwen3-32B, H100: eight TP1 prefill servers and two TP4 decode servers, a decode batch of 224 each
    (dense,) = [r for r in rows if r.id.startswith("qwen3_32b_")]
    shape = (dense.prefill.workers, dense.prefill.gpus, dense.decode.workers, dense.decode.gpus)
    assert shape == (8, 1, 2, 4) and dense.concurrency == 224 * 2
    entry, _ = to_vllm_disagg_entry(dense)
    assert entry.nodes == 2 and entry.parasweep["engine"] == "vllm"
    p = plan(entry, tmp_path)
    assert p.roles is not None and (p.roles.prefill_workers, p.roles.decode_workers) == (8, 2)
    for argv, tp in ((p.roles.prefill_argv, "1"), (p.roles.decode_argv, "4")):
        assert argv[argv.index("--tensor-parallel-size") + 1] == tp
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector"] == "NixlConnector"
    # Qwen3-235B's prefill servers: four DP ranks of TP1 each, the experts sharded over them (no EP given)
    moe = next(r for r in rows if r.id.startswith("qwen3_235b") and r.decode.attention == 8)
    p = plan(to_vllm_disagg_entry(moe)[0], tmp_path)
    assert p.roles is not None
    argv = p.roles.prefill_argv
    assert argv[argv.index("--data-parallel-size") + 1] == "4" and "--enable-expert-parallel" not in argv
    # Kimi-K2.5 on GB200 racks: no hardware profile
    kimi = by_id["kimik2_5_gb200_vllm_fp4_disagg_1024x1024_c256_cfg697"]
    with pytest.raises(Unreplayable, match="gb200"):
        to_vllm_disagg_entry(kimi)
