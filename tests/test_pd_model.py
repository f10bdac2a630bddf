"""The disaggregated deployment in virtual time: a request's KV transfer from first principles (a GQA and
an MLA model, across nodes and within one), the TTFT as the sum of its parts, decode KV pressure holding
prefills back, and the fake backend's decode server alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.disagg.deployment import Deployment
from simulator.entities import Request
from simulator.predict import load_config, predict_trial
from simulator.predict_disagg import predict_pd_trial
from vocab.assets import model_dir
from vocab.hardware import place_servers, resolve_hardware_path
from vocab.load import LoadPoint, RequestSpec


def flags(model: str | Path, hardware: str, tp: int, *extra: str) -> list[str]:
    path = model if isinstance(model, Path) else model_dir(model)
    # the roofline prices the steps: what is checked here does not depend on them, and the measured
    # kernel tables take seconds to load
    return ["--model-path", str(path), "--tp-size", str(tp), "--sim-hardware",
            str(resolve_hardware_path(hardware)), "--sim-step-costs", "roofline", *extra]


def one_request(dep: Deployment, prompt_len: int, out: int = 4) -> Request:
    prompt = (np.arange(prompt_len, dtype=np.int64) % 1000) + 7
    req = Request("r", prompt_len, out, 1, stream=True, prompt=prompt)
    dep.submit(req, prompt)
    while dep.sim.peek() is not None:
        dep.sim.run_until(dep.sim.peek() + 1.0)
    assert req.finished and len(req.output_ids) == out
    return req


def profile(name: str) -> dict:
    return yaml.safe_load(resolve_hardware_path(name).read_text())


def test_a_gqa_request_moves_its_kv_per_gpu_over_the_network_in_bytes_over_bandwidth() -> None:
    """Llama-3.1-70B, TP8 prefill on one H100 node, TP8 decode on the other: each GPU sends its 8/8 KV
    head's K and V of all 80 layers in BF16 for every prompt token, over its 400 Gb/s port."""
    config = json.loads((model_dir("models/llama-3.1-70b") / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_gpu = config["num_hidden_layers"] * 2 * (config["num_key_value_heads"] // 8) * head_dim * 2
    assert per_gpu * 8 == 327_680  # 320 KiB per token over the whole server
    hw = profile("h100-sxm-x8-2nodes-ib")
    cfg = load_config(flags("models/llama-3.1-70b", "h100-sxm-x8-2nodes-ib", 8))
    dep = Deployment([cfg], [cfg])
    assert dep.nodes == [0, 1]
    tokens = 3000  # one chunk (SGLang's default chunk on this GPU is larger)
    req = one_request(dep, tokens)
    expected = tokens * per_gpu / (hw["internode_bw_gbs"] * 1e9) + hw["internode_latency_us"] * 1e-6
    assert req.pd is not None
    assert req.pd.transferred - req.pd.prefill_end == pytest.approx(expected, rel=1e-9)
    assert req.pd.transfer_bytes == tokens * per_gpu


def test_an_mla_request_moves_the_whole_latent_from_every_tp_rank_over_the_gpu_link(tmp_path: Path) -> None:
    """DeepSeek-V3's config, cut to 8 layers so two TP4 servers fit one H200 node: MLA keeps the latent
    vector (kv_lora_rank + qk_rope_head_dim) whole on every TP rank, so a GPU moves it all per layer,
    over the node's GPU link."""
    config = json.loads((model_dir("models/deepseek-v3") / "config.json").read_text())
    config["num_hidden_layers"] = 8
    (tmp_path / "config.json").write_text(json.dumps(config))
    per_gpu = 8 * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 2
    hw = profile("h200-nvlink-x8")
    cfg = load_config(flags(tmp_path, "h200-nvlink-x8", 4))
    dep = Deployment([cfg], [cfg])
    assert dep.nodes == [0, 0]
    tokens = 2000
    req = one_request(dep, tokens)
    expected = tokens * per_gpu / (hw["link_bw_gbs"] * 1e9) + hw["link_latency_us"] * 1e-6
    assert req.pd is not None
    assert req.pd.transferred - req.pd.prefill_end == pytest.approx(expected, rel=1e-9)


def test_servers_fill_nodes_in_order_each_within_one_node() -> None:
    assert place_servers([4, 4, 4, 4], 8) == [0, 0, 1, 1]  # 1P3D of TP4 on two nodes: P and D0 share node 0
    assert place_servers([8, 8], 8) == [0, 1]
    assert place_servers([2, 4, 4], 8) == [0, 0, 1]  # the second TP4 does not fit the 2 GPUs left


def test_one_requests_ttft_is_the_sum_of_its_parts_and_the_prefill_alone_as_aggregated() -> None:
    """On an idle deployment the prefill takes as long as the aggregated server's, and the client's TTFT
    is bootstrap + queue + prefill + transfer + decode's first step, to the microsecond."""
    prefill = flags("models/llama-3.1-70b", "h100-sxm-x8-2nodes-ib", 8, "--disaggregation-mode", "prefill")
    decode = flags("models/llama-3.1-70b", "h100-sxm-x8-2nodes-ib", 8, "--disaggregation-mode", "decode")
    spec = RequestSpec(input_len=1500, output_len=32)
    point = LoadPoint(concurrency=1, num_requests=3, warmup_requests=1)
    pd = predict_pd_trial(prefill, decode, 1, 1, [point], spec)[0]
    agg = predict_trial(flags("models/llama-3.1-70b", "h100-sxm-x8-2nodes-ib", 8), [point], spec)[0]
    parts = {k: v for k, v in pd.metrics.items() if k.startswith("pd_ttft_")}
    assert set(parts) == {f"pd_ttft_{p}_ms" for p in ("bootstrap", "prefill_queue", "prefill", "transfer",
                                                       "decode_first")}
    assert pd.metrics["ttft_mean_ms"] == pytest.approx(sum(parts.values()), abs=1e-3)
    assert parts["pd_ttft_prefill_ms"] == pytest.approx(agg.metrics["ttft_mean_ms"], rel=1e-6)
    assert parts["pd_ttft_transfer_ms"] > 0 and parts["pd_ttft_bootstrap_ms"] == 0


def test_a_full_decode_pool_holds_prefills_back_in_the_bootstrap_queue() -> None:
    """A decode server whose KV holds few prompts: later requests wait for its pre-allocation before the
    prefill server may compute them (SGLang's early policy), so their TTFT grows by a bootstrap wait."""
    common = flags("models/llama-3.1-8b", "h100-sxm-x8", 1)
    prefill = [*common, "--disaggregation-mode", "prefill"]
    roomy = [*common, "--disaggregation-mode", "decode"]
    tight = [*roomy, "--max-total-tokens", "12000"]  # three 3000-token prompts with their 512 reserves
    spec = RequestSpec(input_len=3000, output_len=256)
    point = LoadPoint(concurrency=8, num_requests=32, warmup_requests=0)
    free = predict_pd_trial(prefill, roomy, 1, 1, [point], spec)[0].metrics
    held = predict_pd_trial(prefill, tight, 1, 1, [point], spec)[0].metrics
    assert free["pd_ttft_bootstrap_ms"] < 1.0
    assert held["pd_ttft_bootstrap_ms"] > 100.0
    assert held["ttft_mean_ms"] > free["ttft_mean_ms"] + held["pd_ttft_bootstrap_ms"] / 2


def test_the_fake_backend_runs_a_decode_server_alone_with_nothing_moved() -> None:
    decode = flags("models/llama-3.1-8b", "h100-sxm-x8", 1, "--disaggregation-mode", "decode",
                   "--disaggregation-transfer-backend", "fake")
    spec = RequestSpec(input_len=1000, output_len=16)
    result = predict_pd_trial([], decode, 0, 1, [LoadPoint(concurrency=2, num_requests=6)], spec)[0]
    assert result.metrics["output_tokens"] > 0
    assert result.metrics["pd_transfer_mb_per_gpu"] == 0
    assert result.metrics["pd_ttft_prefill_ms"] == 0 and result.metrics["pd_ttft_transfer_ms"] == 0


def test_a_prefill_server_refuses_the_fake_backend_as_sglang_does() -> None:
    with pytest.raises(ValueError, match="Prefill server does not support 'fake' as the transfer backend"):
        load_config(flags("models/llama-3.1-8b", "h100-sxm-x8", 1, "--disaggregation-mode", "prefill",
                          "--disaggregation-transfer-backend", "fake"))
