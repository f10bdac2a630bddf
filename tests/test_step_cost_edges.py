"""The measured step costs at the edges of their tables, and the elementwise work priced from the model's
own shapes. The tables are aiconfigurator-core's (installed with parasweep on Linux x86-64).

A held-out check on a real H200 found one more token of context costing 16-18 % more per decode step of
Llama-3.1-8B where the context crossed the decode-attention table's last row (the roofline took over):
no step may cost more than 5 % more for one more token of context, at any edge of the table."""

from __future__ import annotations

import pytest

from simulator.costs import decode_shape, prefill_shape
from simulator.kernel_tables import systems_dir
from simulator.model_spec import BF16_BYTES
from simulator.predict import load_config

pytestmark = pytest.mark.skipif(systems_dir() is None, reason="aiconfigurator-core is not installed here")


def _cfg(model: str = "llama-3.1-8b", *flags: str):  # type: ignore[no-untyped-def]
    return load_config(["--model-path", f"models/{model}", "--sim-hardware", "h200-nvlink-x8",
                        "--sim-step-costs", "measured", *flags])


def _edges(surface) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    """Every (batch, last measured length) of the table's rows, and the largest batch at a short length."""
    out = [(int(b), int(c.xs[-1])) for b, c in zip(surface.xs, surface.curves, strict=True)]
    return [*out, (int(surface.xs[-1]) + 1, 1024)]


def test_one_more_token_of_context_never_costs_more_than_5_percent_at_a_table_edge() -> None:
    cfg = _cfg()
    table = cfg.cost.source._attn_kernels["generation"]
    edges = _edges(table)
    assert (128, 4095) in edges or any(c == 4095 for _, c in edges)  # the edge the H200 check crossed
    for batch, ctx in edges:
        before = cfg.cost.stage_time(0, decode_shape([ctx] * batch))
        after = cfg.cost.stage_time(0, decode_shape([ctx + 1] * batch))
        assert after / before < 1.05, (batch, ctx, after / before)
    # and the edge is met on the same trend the roofline's work follows: twice the context past the
    # edge costs more, not less
    b, c = edges[0]
    assert cfg.cost.stage_time(0, decode_shape([2 * c] * b)) > cfg.cost.stage_time(0, decode_shape([c] * b))
    assert any("beyond the measured points" in f for f in cfg.step_costs.fallbacks())


def test_one_more_prompt_token_never_costs_more_than_5_percent_at_the_prefill_tables_edge() -> None:
    cfg = _cfg()
    table = cfg.cost.source._attn_kernels["context"]
    for batch, isl in _edges(table)[:-1]:
        if batch * isl > 64_000:
            continue
        before = cfg.cost.stage_time(0, prefill_shape([(isl, 0)] * batch))
        after = cfg.cost.stage_time(0, prefill_shape([(isl + 1, 0)] * batch))
        assert after / before < 1.05, (batch, isl, after / before)


def test_elementwise_bytes_come_from_the_models_shapes() -> None:
    cfg = _cfg()
    src, spec = cfg.cost.source, cfg.spec
    h, d = spec.hidden, spec.qk_head_dim
    # two fused add-norms (read and write hidden and residual), rotary on q and k, the KV store
    assert src._attn_elementwise == 2 * 4 * h + 2 * (32 + 8) * d + 2 * (2 * 8 * d)
    # silu_and_mul moves 3 x T x intermediate (14,336 for this model), not 2 x T x hidden
    tokens = 65_536
    act = src._elementwise_time(tokens, 1, 3 * spec.dense_inter)
    bandwidth = cfg.cost.p.eta_mem * cfg.hw.mem_bw_gbs * 1e9
    assert act == pytest.approx(3 * tokens * 14_336 * BF16_BYTES / bandwidth)
    shape = prefill_shape([(tokens, 0)])
    dense = src.family_times(0, shape)["dense_mlp"]
    gemms = sum(src._gemm_time(g, tokens) for g in src._dense_gemms)
    assert dense == pytest.approx(spec.num_layers * (gemms + act))
    # under TP each GPU moves its share of the width
    tp4 = _cfg("llama-3.1-70b", "--tp-size", "4").cost.source
    assert tp4._attn_elementwise == 2 * 4 * 8192 + 2 * (16 + 2) * 128 + 2 * (2 * 2 * 128)


def test_an_fp8_model_reads_the_attention_tables_of_its_kv_dtype() -> None:
    cfg = _cfg("deepseek-v3", "--tp-size", "8")
    assert cfg.cost.source.coverage.priced["attention.context"] == "measured"
    assert cfg.cost.source.coverage.priced["attention.generation"] == "measured"
