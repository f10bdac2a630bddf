"""DeepSeek-V3's shared expert folded into the routed experts' kernel, as SGLang does by default for
``DeepseekV3ForCausalLM`` with its 256 routed experts: one more expert every token picks, and no second
stream beside the routed ones (the way Kimi K2's 384-expert layers still run theirs)."""

from __future__ import annotations

import pytest

from simulator.costs import decode_shape
from simulator.kernel_tables import systems_dir
from simulator.measured_costs import ELEMENTWISE_KERNELS_PER_MOE_LAYER
from simulator.predict import load_config

pytestmark = pytest.mark.skipif(systems_dir() is None, reason="aiconfigurator-core is not installed here")


def _source(model: str, *flags: str):  # type: ignore[no-untyped-def]
    return load_config(["--model-path", f"models/{model}", "--sim-hardware", "h200-nvlink-x8",
                        "--tp-size", "8", "--sim-step-costs", "measured", *flags]).cost.source


def _moe_parts(src, tokens: int) -> tuple[float, float, float, float]:  # type: ignore[no-untyped-def]
    router, *shared = src._moe_gemms
    return (src._gemm_time(router, tokens), sum(src._gemm_time(g, tokens) for g in shared),
            src._moe_time(tokens), src._elementwise_time(tokens, ELEMENTWISE_KERNELS_PER_MOE_LAYER))


def test_deepseek_v3_folds_its_shared_expert_into_the_routed_kernel() -> None:
    fused = _source("deepseek-v3")
    shape = decode_shape([2048] * 32)
    router, shared, routed, elementwise = _moe_parts(fused, 32)
    moe_layer = fused.family_times(0, shape)["moe"] / fused.roofline.stages[0].moe_layers
    assert moe_layer == pytest.approx(router + routed * 9 / 8 + elementwise)
    # --disable-shared-experts-fusion: the shared expert on its own stream beside the routed ones
    apart = _source("deepseek-v3", "--disable-shared-experts-fusion")
    moe_layer = apart.family_times(0, shape)["moe"] / apart.roofline.stages[0].moe_layers
    assert moe_layer == pytest.approx(router + max(shared, routed) + elementwise)


def test_kimi_k2_keeps_its_second_stream() -> None:
    src = load_config(["--model-path", "models/kimi-k2", "--sim-hardware", "h200-nvlink-x8", "--tp-size", "8",
                       "--sim-step-costs", "measured"]).cost.source
    assert not src._fused_shared and src._dual_stream
