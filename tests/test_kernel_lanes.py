"""Each engine's steps are priced by its own kernels' tables: the simulated engine playing vLLM reads
aiconfigurator-core's vLLM tables (its attention, MoE and all-reduce implementations, at the version
nearest the release it plays), SGLang's where vLLM has none of that name, and SGLang's block-FP8 GEMM
(the same DeepGEMM kernel, measured without vLLM's eager wrapper). The expected rows are read from the
Parquet files here, independently of ``kernel_tables.py``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from simulator.costs import decode_shape
from simulator.kernel_lanes import LANES
from simulator.kernel_tables import find_table, kernel_tables, systems_dir
from simulator.predict import load_config

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = systems_dir()
pytestmark = pytest.mark.skipif(SYSTEMS is None, reason="aiconfigurator-core is not installed here (its "
                                "wheels are Linux x86-64 only): the measured step costs cannot be tested")
H200 = "h200_sxm"


def rows(framework: str, version: str, family: str, name: str, system: str = H200,
         **keys: object) -> list[dict]:
    path = SYSTEMS / "data" / system / family / framework / version / f"{name}.parquet"  # type: ignore[operator]
    return pq.read_table(path, filters=[(k, "=", v) for k, v in keys.items()]).to_pylist()


def test_vllm_tables_are_read_at_the_version_nearest_the_release_played() -> None:
    assert find_table(H200, "moe", "moe_perf", "0.19.0", "vllm").version == "0.19.0"  # type: ignore[union-attr]
    assert find_table(H200, "moe", "moe_perf", "0.34.0", "vllm").version == "0.24.0"  # type: ignore[union-attr]
    # older than every vLLM table: the oldest
    assert find_table(H200, "moe", "moe_perf", "0.11.2", "vllm").version == "0.19.0"  # type: ignore[union-attr]
    # vLLM's MLA tables are whole modules under other names: SGLang's kernel tables stand in
    mla = find_table(H200, "mla", "context_mla_perf", "0.19.0", "vllm")
    assert mla is not None and mla.framework == "sglang"


def test_vllm_attention_moe_and_allreduce_come_from_vllm_s_own_kernels() -> None:
    tables = kernel_tables(H200, "0.19.0", "vllm")
    # Llama-3.1-70B at TP8: 8 query heads, 1 KV head of 128 per GPU; FA3 on Hopper is vLLM's
    # vllm_flash_attn_fa3 lane
    surface = tables.attention("generation", 8, 1, 128, "bfloat16", "fa3")
    assert surface is not None
    measured = rows("vllm", "0.24.0", "attention", "generation_attention_perf", num_heads=8,
                    num_key_value_heads=1, head_dim=128, kv_cache_dtype="bfloat16", window_size=0,
                    kernel_source="vllm_flash_attn_fa3", batch_size=16)
    assert measured
    for r in measured[:5]:
        assert surface(16, r["step"]) == pytest.approx(r["latency"] * 1e-3, rel=1e-12)
    # MiniMax-M2.5's experts over TP4: vLLM 0.19's Triton fused MoE (its choice on Hopper for TP)
    curve = tables.moe("fp8_block", 3072, 1536, 8, 256, 4, 1, "power_law_1.01")
    moe = rows("vllm", "0.19.0", "moe", "moe_perf", moe_dtype="fp8_block", hidden_size=3072, inter_size=1536,
               topk=8, num_experts=256, moe_tp_size=4, moe_ep_size=1, distribution="power_law_1.01")
    assert curve is not None and moe and {r["kernel_source"] for r in moe} == {"vllm_fused_moe"}
    for r in moe[:5]:
        assert curve(r["num_tokens"]) == pytest.approx(r["latency"] * 1e-3, rel=1e-12)
    # the all-reduce: vLLM's custom all-reduce replayed from a CUDA graph, the 0.19 table
    reduce = rows("vllm", "0.19.0", "comm", "custom_allreduce_perf", num_gpus=8, backend="vllm_graph",
                  allreduce_dtype="bfloat16")
    points = tables.allreduce_points(8, True)
    assert points and points == {float(r["message_size"]): r["latency"] * 1e-3 for r in reduce}


MINIMAX_EXPERTS = dict(moe_dtype="fp8_block", hidden_size=3072, inter_size=1536, topk=8, num_experts=256,
                       distribution="power_law_1.01")


def _held_to(curve, measured: list[dict]) -> None:  # type: ignore[no-untyped-def]
    """``curve`` passes through the measured points (a point measured twice: the row read last)."""
    points = {r["num_tokens"]: r["latency"] * 1e-3 for r in measured}
    assert curve is not None and points
    for tokens, seconds in points.items():
        assert curve(tokens) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("system", ["b200_sxm", "b300_sxm"])
def test_vllm_s_block_fp8_experts_run_the_kernels_moe_backend_names(system: str) -> None:
    """--moe-backend flashinfer_trtllm: FlashInfer's TensorRT-LLM kernels, which only 0.24's tables timed;
    triton (or the environment switching FlashInfer and DeepGEMM off): Triton's, from 0.19's tables, or
    SGLang's measurement of the same kernel where no vLLM table of the GPU has it; auto: the nearest
    version's own kernels (the simulated vLLM names the oracle's choice itself where it prices it)."""
    shape = ("fp8_block", 3072, 1536, 8, 256, 2, 1, "power_law_1.01")
    trtllm = rows("vllm", "0.24.0", "moe", "moe_perf", system, moe_tp_size=2, moe_ep_size=1,
                  **MINIMAX_EXPERTS)
    monolithic = "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic"
    assert {r["kernel_source"] for r in trtllm} == {monolithic}
    flashinfer = kernel_tables(system, "0.19.0", "vllm", "flashinfer_trtllm").moe(*shape)
    _held_to(flashinfer, trtllm)
    triton = kernel_tables(system, "0.19.0", "vllm", "triton").moe(*shape)
    auto = kernel_tables(system, "0.19.0", "vllm").moe(*shape)
    if system == "b200_sxm":
        measured = rows("vllm", "0.19.0", "moe", "moe_perf", system, moe_tp_size=2, moe_ep_size=1,
                        **MINIMAX_EXPERTS)
        _held_to(triton, measured)
        _held_to(auto, measured)  # the nearest version, 0.19, timed Triton's only
    else:  # no vLLM table of B300 measured Triton's: SGLang's measurement of the same kernel stands in
        _held_to(triton, rows("sglang", "0.5.14", "moe", "moe_perf", system, moe_tp_size=2, moe_ep_size=1,
                              **MINIMAX_EXPERTS))
        _held_to(auto, trtllm)  # the nearest version, 0.24, timed FlashInfer's only
    assert triton(256) > flashinfer(256)  # type: ignore[misc]  # FlashInfer's kernels are the faster


def test_vllm_s_block_fp8_experts_on_hopper_read_the_named_kernels() -> None:
    spread = rows("vllm", "0.24.0", "moe", "moe_perf", moe_tp_size=1, moe_ep_size=4, **MINIMAX_EXPERTS)
    assert {r["kernel_source"] for r in spread} == {"vllm_fp8moe_flashinfer_cutlass_flashinferexperts"}
    named = kernel_tables(H200, "0.19.0", "vllm", "flashinfer_cutlass")
    _held_to(named.moe("fp8_block", 3072, 1536, 8, 256, 1, 4, "power_law_1.01"), spread)
    auto = kernel_tables(H200, "0.19.0", "vllm").moe("fp8_block", 3072, 1536, 8, 256, 1, 4, "power_law_1.01")
    _held_to(auto, rows("vllm", "0.19.0", "moe", "moe_perf", moe_tp_size=1, moe_ep_size=4, **MINIMAX_EXPERTS))
    # SGLang's tables are read as they were: its Triton kernel, whatever the layout
    sglang = kernel_tables(H200, "0.5.23", "sglang").moe("fp8_block", 3072, 1536, 8, 256, 1, 4,
                                                         "power_law_1.01")
    _held_to(sglang, rows("sglang", "0.5.14", "moe", "moe_perf", moe_tp_size=1, moe_ep_size=4,
                          **MINIMAX_EXPERTS))


def test_vllm_s_block_fp8_gemm_is_priced_by_the_deepgemm_kernel_sglang_measured() -> None:
    vllm, sglang = kernel_tables(H200, "0.19.0", "vllm"), kernel_tables(H200, "0.5.23", "sglang")
    assert vllm.gemm("fp8_block") is not None
    assert vllm.gemm("fp8_block")(64, 4096, 4096) == sglang.gemm("fp8_block")(64, 4096, 4096)  # type: ignore[misc]
    # why: vLLM's own table of that kernel times its eager wrapper, flat near 80 us up to 1,024 tokens
    wrapped = rows("vllm", "0.24.0", "gemm", "gemm_perf", gemm_dtype="fp8_block", n=4096, k=4096,
                   kernel_source="DeepGemmFp8BlockScaledMMKernel")
    small = [r["latency"] * 1e-3 for r in wrapped if r["m"] <= 1024]
    assert small and min(small) > 5 * sglang.gemm("fp8_block")(64, 4096, 4096)  # type: ignore[misc]
    # the per-tensor FP8 GEMM is vLLM's own CUTLASS kernel
    cutlass = rows("vllm", "0.24.0", "gemm", "gemm_perf", gemm_dtype="fp8", n=8192, k=8192, m=64)
    assert {r["kernel_source"] for r in cutlass} == {"CutlassFP8ScaledMMLinearKernel"}
    assert vllm.gemm("fp8")(64, 8192, 8192) == pytest.approx(cutlass[0]["latency"] * 1e-3, rel=1e-12)  # type: ignore[misc]


def test_the_simulated_vllm_says_whose_tables_priced_it() -> None:
    cfg = load_config(["serve", str(REPO / "models" / "llama-3.1-70b"), "--tensor-parallel-size", "8",
                       "--sim-hardware", "h200-nvlink-x8", "--sim-vllm-release", "0.19.0"])
    label = cfg.step_costs.label()
    assert "h200_sxm, vLLM 0.19.0/0.24.0" in label and "SGLang 0.5.14 for mla" in label
    assert cfg.step_costs.fallbacks() == []
    sglang = load_config(["--model-path", str(REPO / "models" / "llama-3.1-70b"), "--tp-size", "8",
                          "--sim-hardware", "h200-nvlink-x8"])
    assert sglang.step_costs.label().endswith("h200_sxm, SGLang 0.5.14)")
    # the same step, two engines' kernels: not the same price
    assert cfg.cost.source.tables.lanes is LANES["vllm"]
    assert sglang.cost.source.tables.lanes is LANES["sglang"]
    shape = decode_shape([1024] * 16)
    assert cfg.cost.gpu_time(0, shape) != pytest.approx(sglang.cost.gpu_time(0, shape), rel=1e-3)


def test_a_distrusted_vllm_table_gives_way_to_the_next_version_of_the_same_kernel() -> None:
    # Kimi K2's INT4 experts at TP8: vLLM 0.19's Marlin rows are 2-3x 0.24's (and SGLang's): 0.24's read
    curve = kernel_tables(H200, "0.19.0", "vllm").moe("int4_wo", 7168, 2048, 8, 384, 8, 1, "power_law_1.01")
    keys = dict(moe_dtype="int4_wo", hidden_size=7168, inter_size=2048, topk=8, num_experts=384,
                moe_tp_size=8, moe_ep_size=1, distribution="power_law_1.01")
    newer = rows("vllm", "0.24.0", "moe", "moe_perf", **keys)
    older = rows("vllm", "0.19.0", "moe", "moe_perf", **keys)
    assert curve is not None and newer and older
    at = {r["num_tokens"]: r["latency"] * 1e-3 for r in newer}
    for tokens, seconds in list(at.items())[:5]:
        assert curve(tokens) == pytest.approx(seconds, rel=1e-12)
    assert min(r["latency"] for r in older if r["num_tokens"] == 64) > 2 * 1e3 * at[64]


def test_a_shape_the_nearest_version_lacks_is_read_from_another() -> None:
    # Qwen3-235B-A22B's experts at TP8 (moe_tp 8): SGLang 0.5.14's table has no such rows, 0.5.10's has
    keys = dict(moe_dtype="fp8_block", hidden_size=4096, inter_size=1536, topk=8, num_experts=128,
                moe_tp_size=8, moe_ep_size=1, distribution="power_law_1.01")
    assert not rows("sglang", "0.5.14", "moe", "moe_perf", **keys)
    older = {r["num_tokens"]: r["latency"] * 1e-3 for r in rows("sglang", "0.5.10", "moe", "moe_perf",
                                                                   **keys)
             if r["kernel_source"] == "sglang_fused_moe_triton"}
    assert older
    for engine, version in (("sglang", "0.5.23"), ("vllm", "0.19.0")):  # vLLM has none: SGLang's stand in
        tables = kernel_tables(H200, version, engine)
        curve = tables.moe("fp8_block", 4096, 1536, 8, 128, 8, 1, "power_law_1.01")
        assert curve is not None
        for tokens, seconds in list(older.items())[:5]:
            assert curve(tokens) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize(("release", "system", "tp", "mib"), [
    ("0.19.0", "b200_sxm", 8, 1.0), ("0.19.0", "h200_sxm", 8, 0.5), ("0.19.0", "b300_sxm", 8, 2.0),
    ("0.19.0", "b200_sxm", 4, 32.0), ("0.17.0", "b300_sxm", 8, 0.0),  # 10.3 has a size from 0.19
    ("0.16.0", "b200_sxm", 8, 1.0),  # asked for before 0.17: 0.17's sizes
    ("0.34.0", "b300_sxm", 8, 4.0), ("0.19.0", "b200_sxm", 1, 0.0), ("0.19.0", "b200_sxm", 3, 0.0),
])
def test_a_fused_all_reduce_asked_for_takes_the_release_s_size_limit(release: str, system: str, tp: int,
                                                                      mib: float) -> None:
    from simulator.vllm.releases import played

    assert played(release).fused_allreduce_bytes(system, tp, True) == int(mib * 2**20)
    assert played(release).fused_allreduce_bytes(system, tp, None) == 0  # vLLM's default: not priced


def test_a_fused_all_reduce_is_priced_by_tensorrt_llm_s_kernel_up_to_its_size() -> None:
    """Asked for on 8 B200s (vLLM 0.19), each TP all-reduce of up to 1 MiB is FlashInfer's fused all-reduce
    (TensorRT-LLM's fusion kernel, from its table); a larger one, or one not asked for, the custom one."""
    def config(*flags: str):  # type: ignore[no-untyped-def]
        return load_config(["serve", str(REPO / "models" / "llama-3.1-70b"), "--tensor-parallel-size", "8",
                            "--sim-hardware", "b200-sxm-x8", "--sim-vllm-release", "0.19.0", *flags])

    fused = {r["message_size"]: r["latency"] * 1e-3
             for r in rows("trtllm", "1.3.0rc20", "comm", "custom_allreduce_perf", "b200_sxm", num_gpus=8,
                           allreduce_dtype="bfloat16")}
    custom = {r["message_size"]: r["latency"] * 1e-3
              for r in rows("vllm", "0.19.0", "comm", "custom_allreduce_perf", "b200_sxm", num_gpus=8,
                            allreduce_dtype="bfloat16", backend="vllm_graph")}
    source = config("-cc", '{"pass_config": {"fuse_allreduce_rms": true}}').cost.source
    wait = source.roofline.allreduce_wait()
    assert source.allreduce(16, True) == pytest.approx(fused[16 * 8192] + wait, rel=1e-12)  # 256 KiB
    assert source.allreduce(64, True) == pytest.approx(fused[64 * 8192] + wait, rel=1e-12)  # 1 MiB: fused
    assert source.allreduce(128, True) == pytest.approx(custom[128 * 8192] + wait, rel=1e-12)
    assert fused[16 * 8192] < 0.5 * custom[16 * 8192]  # 7.9 us against the custom all-reduce's 26
    unasked = config().cost.source
    assert unasked.allreduce(16, True) == pytest.approx(custom[16 * 8192] + wait, rel=1e-12)
