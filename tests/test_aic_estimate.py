"""AIConfigurator's own agg estimate (orchestrator/fidelity/aic.py), through real calls into the installed
aiconfigurator-core: the call path must reproduce the numbers the core's estimator gives."""

from __future__ import annotations

import math

import pytest

from orchestrator.fidelity.aic import AicEstimate, estimate_agg

pytest.importorskip("aiconfigurator_core")


def llama_8b(model_path: str, batch_size: int) -> AicEstimate:
    return estimate_agg(model_path, "h100_sxm", 1024, 1024, batch_size, tp=1, pp=1, attention_dp=1, moe_tp=1,
                        moe_ep=1, gemm_quant=None, moe_quant=None, backend_version=None)


# Llama-3.1-8B, BF16, TP1 on h100_sxm, 1024 in / 1024 out, as aiconfigurator-core 0.12.0 prices it with its
# meta-llama/Meta-Llama-3.1-8B config and SGLang 0.5.14 tables: a decode step of 6.62 ms and a prefill step
# of 22.8 ms at batch 1, whose TTFT is 1.9 prefill steps (the queueing factor of a batch admitted in one
# step); at batch 128 an agg TPOT of 18.0 ms and a TTFT of 141.2 ms.
@pytest.mark.parametrize(("batch_size", "ttft_ms", "tpot_ms"), [(1, 43.35, 6.62), (128, 141.2, 18.0)])
def test_llama_8b_on_h100_gives_the_cores_numbers(batch_size: int, ttft_ms: float, tpot_ms: float) -> None:
    got = llama_8b("meta-llama/Meta-Llama-3.1-8B", batch_size)
    assert got.why_none == ""
    assert got.version == "0.5.14"  # no version asked: the system's current SGLang tables
    assert got.ttft_ms == pytest.approx(ttft_ms, rel=0.02)
    assert got.tpot_ms == pytest.approx(tpot_ms, rel=0.02)


def test_an_instruct_id_without_a_bundled_config_is_priced_as_its_base_checkpoint() -> None:
    assert llama_8b("meta-llama/Llama-3.1-8B-Instruct", 1) == llama_8b("meta-llama/Meta-Llama-3.1-8B", 1)


def test_a_csv_row_on_a_version_the_core_refuses_falls_back_to_its_current_tables() -> None:
    # dsr1_h200_sglang_fp8_agg_1024x1024_c16_cfg81 as the CSV gives it (measured on SGLang 0.5.9: TTFT
    # 285.9 ms, TPOT 16.63 ms). aiconfigurator-core 0.12.0 serves only 0.5.14 and 0.5.16 and prices the row
    # at 168.0 / 20.83 ms on 0.5.14: a prefill step of 63.4 ms times the queueing factor 2.65 of a batch of
    # 16 admitted one prompt per step, and mostly decode-only steps of 20.3 ms.
    got = estimate_agg("deepseek-ai/DeepSeek-V3", "h200_sxm", 1024, 1024, 16.0, 8.0, 1.0, 1.0, 8.0, 1.0,
                       "fp8", "fp8_block", "0.5.9")
    assert got.version == "0.5.14"
    assert got.ttft_ms == pytest.approx(168.0, rel=0.02)
    assert got.tpot_ms == pytest.approx(20.83, rel=0.02)


def test_empty_cells_take_the_defaults_the_accuracy_tool_leaves_to_the_core() -> None:
    # the Qwen and Llama rows leave attention_dp_size empty, which reads as 1; the quantization and
    # version cells of some rows are empty too (the checkpoint's own quantization, the current tables)
    nan = math.nan
    got = estimate_agg("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", 1024, 1024, 1.0, 1.0, 1.0, nan, 1.0, 1.0,
                       nan, "", nan)
    assert got == llama_8b("meta-llama/Meta-Llama-3.1-8B", 1)


@pytest.mark.parametrize(("model_path", "system", "tp", "gemm_quant", "isl", "reason"), [
    # as the CSV's NVL72 rows (gb200, TP72) are refused: MLA's 128 heads do not split 72 ways
    ("deepseek-ai/DeepSeek-R1", "h200_sxm", 72, "fp8", 1024, "num_heads 128 should be divisible by tp_size"),
    ("example/Not-A-Model", "h100_sxm", 1, None, 1024, "no config for example/Not-A-Model is bundled"),
    ("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", 1, "fp6", 1024, "unknown name 'fp6'"),
    ("meta-llama/Meta-Llama-3.1-8B", "no_such_gpu", 1, None, 1024, "no sglang tables for system"),
    ("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", 1, None, "many", "a size is not a number"),
])
def test_what_the_core_refuses_comes_back_as_a_reason(model_path: str, system: str, tp: int,
                                                       gemm_quant: str | None, isl: int, reason: str) -> None:
    got = estimate_agg(model_path, system, isl, 1024, 16, tp, 1, 1, tp, 1, gemm_quant, None, None)
    assert (got.ttft_ms, got.tpot_ms) == (None, None)
    assert reason in got.why_none
    assert "\n" not in got.why_none


def test_a_model_that_does_not_fit_is_out_of_memory() -> None:
    # DeepSeek-R1 in FP8 (~640 GiB of weights) on four 141 GiB H200s
    got = estimate_agg("deepseek-ai/DeepSeek-R1", "h200_sxm", 1024, 1024, 16, 4, 1, 1, 4, 1, "fp8",
                       "fp8_block", "0.5.9")
    assert got.ttft_ms is None
    assert got.why_none.startswith("out of memory")
    assert got.version == "0.5.14"
