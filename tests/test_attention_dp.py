"""Attention data parallelism in the simulated engine: each GPU's memory from the model's config.json,
SGLang's own checks, and the ranks' lockstep (simulator/attention_dp/, simulator/lockstep.py)."""

from __future__ import annotations

import json

import pytest

from simulator.predict import load_config, predict_point
from tests.conftest import ROOT
from vocab.load import LoadPoint, RequestSpec

DSV3 = ["--model-path", str(ROOT / "models" / "deepseek-v3"), "--sim-hardware", "h200-nvlink-x8",
        "--tp-size", "8", "--mem-fraction-static", "0.85", "--random-seed", "1"]
FP8_BLOCK = 1 + 4 / (128 * 128)  # one byte a weight, one FP32 scale per 128x128 block


def test_kv_capacity_follows_from_the_config_replicated_against_split() -> None:
    """TP8 keeps every request's MLA latent on every GPU; attention DP 8 keeps each rank's own requests'
    only, and pays for it with the attention weights and the embedding on every GPU. Both, with the same
    memory fraction, from DeepSeek-V3's config.json alone."""
    c = json.loads((ROOT / "models" / "deepseek-v3" / "config.json").read_text())
    h, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    latent = c["kv_lora_rank"] + c["qk_rope_head_dim"]
    per_token = latent * 2 * layers  # BF16 latent and rope key, one vector a token a layer
    q_head = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    attention = (h * c["q_lora_rank"] + c["q_lora_rank"] * heads * q_head + h * latent
                 + c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"])
                 + heads * c["v_head_dim"] * h)
    replicated = (layers * attention * FP8_BLOCK + c["vocab_size"] * h * 2) * (1 - 1 / 8)

    tp = load_config(DSV3)
    dp = load_config([*DSV3, "--attn-dp-size", "8"])
    for cfg in (tp, dp):
        st = cfg.stages[0]
        assert st.kv_bytes / st.token_capacity == pytest.approx(per_token)
    assert dp.stages[0].weight_bytes - tp.stages[0].weight_bytes == pytest.approx(replicated, rel=1e-9)
    budget = tp.hw.memory_gb * 1e9 * 0.85
    free_tp, free_dp = budget - tp.stages[0].weight_bytes, budget - dp.stages[0].weight_bytes
    assert tp.max_total_num_tokens == int(free_tp // per_token)
    assert dp.max_total_num_tokens == int(free_dp // per_token)  # each rank's pool
    ratio = 8 * dp.max_total_num_tokens / tp.max_total_num_tokens
    assert ratio == pytest.approx(8 * free_dp / free_tp, rel=1e-4)
    assert 5 < ratio < 8  # far more tokens in all, fewer than eight times as many


def test_sglang_reports_the_ranks_and_their_shares() -> None:
    dp = load_config([*DSV3, "--attn-dp-size", "8", "--max-running-requests", "1024",
                      "--chunked-prefill-size", "16384"])
    info = dp.server_info()
    assert (info["attn_dp_size"], info["dp_size"], info["enable_dp_attention"]) == (8, 1, True)
    assert len(info["internal_states"]) == 8
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 1024 // 8
    assert dp.chunked_prefill_size == 16384 // 8
    assert "DP attention is enabled. chunked prefill size is adjusted from 16384 to 2048." in dp.warnings
    # the deprecated spelling: --dp-size then counts attention-DP ranks, and says so
    old = load_config([*DSV3, "--dp-size", "8", "--enable-dp-attention"])
    assert (old.dp, old.attn_dp, old.max_total_num_tokens) == (1, 8, load_config(
        [*DSV3, "--attn-dp-size", "8"]).max_total_num_tokens)
    assert any("--enable-dp-attention is deprecated" in w for w in old.warnings)


@pytest.mark.parametrize(("flags", "message"), [
    (["--attn-dp-size", "0"], "--attn-dp-size must be positive (got 0)."),
    (["--attn-dp-size", "8", "--dp-size", "2", "--tp-size", "4"],
     "--dp-size 2 with --attn-dp-size 8: data-parallel replicas combined with attention data "
     "parallelism are not supported."),
    (["--attn-dp-size", "3"], "Invalid attention topology: tp_size=8, attn_dp_size=3, attn_cp_size=1."),
    (["--attn-dp-size", "8", "--moe-dense-tp-size", "2"],
     "moe_dense_tp_size only supports None, 1, or tp_size currently"),
    (["--enable-dp-lm-head"], "Please enable dp attention when setting enable_dp_lm_head."),
    (["--attn-dp-size", "8", "--moe-a2a-backend", "mooncake"],
     "--moe-a2a-backend mooncake is not modelled by the simulated engine (modelled: none, deepep)"),
    (["--attn-dp-size", "4", "--pp-size", "2"],
     "pipeline parallelism (--pp-size > 1) is not modelled by the simulated engine with attention DP"),
])
def test_what_sglang_refuses_and_what_is_not_modelled_is_one_line(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError) as e:
        load_config([*DSV3, *flags])
    assert str(e.value) == message


def _point(flags: list[str], concurrency: int, requests: int) -> dict[str, float]:
    return predict_point([*DSV3, *flags], LoadPoint(concurrency=concurrency, num_requests=requests),
                         RequestSpec(input_len=512, output_len=256)).metrics


def test_the_ranks_run_in_lockstep_an_idle_rank_padded() -> None:
    """One request keeps all eight GPUs busy: the seven idle ranks run padded batches through the
    experts with it, so a token at concurrency 1 costs what it costs at 8, one request on each rank
    (round-robin); with TP8 the eight requests share one rank's batch."""
    one = _point(["--attn-dp-size", "8"], 1, 4)
    eight = _point(["--attn-dp-size", "8"], 8, 32)
    assert one["itl_p50_ms"] == pytest.approx(eight["itl_p50_ms"], rel=0.03)
    assert eight["sim_peak_running_reqs"] == 1  # the most any rank ran at once
    assert _point([], 8, 32)["sim_peak_running_reqs"] == 8
    utils = [one[f"gpu{g}_util_mean_pct"] for g in range(8)]
    assert min(utils) == pytest.approx(max(utils)) and min(utils) > 90


def test_a_kv_bound_mla_deployment_runs_more_requests_with_attention_dp() -> None:
    """At 768 streams of 512 + 256 tokens TP8's pool holds fewer requests than are sent, attention
    DP 8's ranks hold all of theirs: more of them decode at once, and more tokens come out."""
    args = ["--max-total-tokens", "120000"]
    tp = _point(args, 768, 1536)
    dp = _point([*args, "--attn-dp-size", "8"], 768, 1536)
    assert tp["sim_peak_running_reqs"] < 768 * 0.25
    assert dp["sim_peak_running_reqs"] == 768 // 8
    assert dp["output_tok_s"] > 1.5 * tp["output_tok_s"]
