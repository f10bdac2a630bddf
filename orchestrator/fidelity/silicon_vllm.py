"""The served vLLM rows of aiconfigurator-core's silicon CSV as entries the replay runs on the simulated
engine playing vLLM: the model folder each maps to, its launch (the vLLM flags of its source's script,
vLLM's defaults where none is published) and the same client as the SGLang rows (``silicon.client_workload``:
InferenceX's benchmark_serving closed loop, or the gap-analysis harness). docs/fidelity.md, "Served vLLM
runs", restates the sources."""

from __future__ import annotations

import json

from orchestrator.fidelity.corpus import Entry
from orchestrator.fidelity.silicon import (
    GPU_NAMES,
    NO_PROFILE,
    PREDICTED_SOURCE,
    SYSTEMS,
    SiliconRow,
    Unreplayable,
    client_workload,
    measured_on,
    model_for,
)
from orchestrator.fidelity.silicon_disagg import DisaggRow, RoleShape, placed

# (pattern on the CSV's model_path, why the simulated engine does not price it)
UNMODELLED = (
    (r"gpt-oss", "gpt-oss's MXFP4 experts and its attention sinks are not modelled by the simulated engine"),
)
# (pattern on model_path, precision, folder under models/, --quantization, what the mapping assumes)
MODELS = (
    (
        r"llama-3\.1-70b",
        "fp8",
        "llama-3.1-70b",
        "fp8",
        "Llama-3.1-70B in FP8 priced as the BF16 checkpoint quantized to FP8 at load (--quantization fp8): "
        "the checkpoint is not recorded",
    ),
    (
        r"llama-3\.1-8b",
        "fp8",
        "llama-3.1-8b",
        "fp8",
        "NVIDIA's FP8 Llama-3.1-8B priced as the BF16 checkpoint quantized to FP8 at load "
        "(--quantization fp8)",
    ),
    (r"qwen3-235b-a22b-fp8", "fp8", "qwen3-235b-a22b-fp8", None, ""),
    (r"qwen3-32b$", "bf16", "qwen3-32b", None, ""),
    (r"qwen3-32b$", "fp8", "qwen3-32b", "fp8",
     "FP8 priced as the BF16 checkpoint quantized to FP8 at load (--quantization fp8): the checkpoint is "
     "not recorded"),
    (r"minimax-m2\.5", "fp8", "minimax-m2.5", None, ""),
    (r"minimax-m2\.5", "fp4", "minimax-m2.5-nvfp4", None, "NVIDIA's NVFP4 MiniMax-M2.5 (its config)"),
    (
        r"kimi-k2\.5",
        "int4",
        "kimi-k2",
        None,
        "Kimi-K2.5's language model priced as Kimi-K2-Thinking's: the same architecture and INT4 experts",
    ),
    (r"kimi-k2\.5", "fp4", "kimi-k2.5-nvfp4", None, "NVIDIA's NVFP4 Kimi-K2.5 (its config)"),
)


def launch_flags(row: SiliconRow) -> tuple[dict[str, object], list[str]]:
    """The vLLM flags the row's source launched it with (vLLM's dest names), and what is assumed:
    InferenceX's scripts (SemiAnalysisAI/InferenceX, ``benchmarks/``) at the commit in effect on the row's
    date; vLLM's defaults where the source publishes none (the gap-analysis runs, Kimi-K2.5)."""
    notes: list[str] = []
    args: dict[str, object] = {"enable_prefix_caching": False}  # the prompts share no prefix either way
    model, day = row.model.lower(), measured_on(row)
    if row.cohort == "gap-analysis":
        notes.append("launch not published: vLLM's defaults for the layout")
        return args, notes
    if "llama-3.1-70b" in model:
        # benchmarks/70b_fp8_*.sh and 70b_fp4_b200_docker.sh (last state c198b20e, 2025-10-30), vLLM 0.10.2:
        # --gpu-memory-utilization 0.9, a config with fp8 KV, async scheduling, 8192 batched tokens
        args |= {
            "gpu_memory_utilization": 0.9,
            "kv_cache_dtype": "fp8",
            "async_scheduling": True,
            "max_num_batched_tokens": 8192,
            "max_num_seqs": 512 if row.system == "b200_sxm" else row.concurrency,
            "max_model_len": 10240
            if row.system == "h100_sxm"
            else row.isl + row.osl + (20 if row.isl + row.osl <= 2048 else 200),
        }
        if row.system == "b200_sxm":
            # 70b_fp8_b200_docker.sh: FlashInfer's all-reduce fusion, full graphs for decode steps only
            args["compilation_config"] = json.dumps({
                "pass_config": {"enable_fi_allreduce_fusion": True, "enable_attn_fusion": True,
                                "enable_noop": True},
                "custom_ops": ["+quant_fp8", "+rms_norm"], "cudagraph_mode": "FULL_DECODE_ONLY",
                "splitting_ops": []})
            notes.append("B200: the script's VLLM_FLASHINFER_ALLREDUCE_FUSION_THRESHOLDS_MB (8 MB at TP8) "
                         "is not read: the fused all-reduce up to vLLM's own size for the GPU")
        notes.append(
            "InferenceX ran NVIDIA's Llama-3.3-70B-Instruct FP8/FP4 checkpoints (Llama-3.1-70B's "
            "architecture) on vLLM 0.10.2, played as the oldest recorded release"
        )
    elif "minimax-m2.5" in model and row.system == "h100_sxm":
        # minimaxm2.5_fp8_h100.sh (ac0d2a85, 2026-03-02): 0.90 of the GPU, 256 sequences, piecewise graphs
        args |= {"gpu_memory_utilization": 0.9, "max_num_seqs": 256, "max_model_len": row.isl + row.osl + 256}
    elif "minimax-m2.5" in model and row.system == "h200_sxm":
        # minimaxm2.5_fp8_h200.sh (a3634633, 2026-03-01; experts spread from 5e2c705d, 2026-03-13)
        args |= {"gpu_memory_utilization": 0.95, "max_model_len": row.isl + row.osl + 256}
    elif "minimax-m2.5" in model and row.system in ("b200_sxm", "b300_sxm"):
        # minimaxm2.5_{fp8,fp4}_b200.sh (f342df18, 2026-03-11; from bddbf403, 2026-04-03: fp8 KV, 2 x ISL
        # batched tokens, graphs to 2048)
        args |= {"max_model_len": row.isl + row.osl + 256}
        if row.precision == "fp8":
            args["block_size"] = 32
        if day and day >= "2026-04-03":
            args |= {
                "gpu_memory_utilization": 0.9,
                "kv_cache_dtype": "fp8",
                "max_num_batched_tokens": 2 * row.isl,
                "max_cudagraph_capture_size": 2048,
            }
        else:
            args["gpu_memory_utilization"] = 0.95
            if row.precision == "fp8":
                # VLLM_USE_FLASHINFER_MOE_FP8=0 and VLLM_MOE_USE_DEEP_GEMM=0 until bddbf403: Triton's MoE
                args["moe_backend"] = "triton"
                notes.append("the script's VLLM_USE_FLASHINFER_MOE_FP8=0 and VLLM_MOE_USE_DEEP_GEMM=0 as "
                             "--moe-backend triton (the kernels they leave)")
        if row.system == "b300_sxm":
            notes.append("B300: the B200 script's flags (the B300 script is not restated)")
    else:
        notes.append("launch flags not restated for this model: vLLM's defaults for the layout")
    if "minimax-m2.5" in model and day and day < "2026-03-27":
        args["enable_prefix_caching"] = True  # on by default until the scripts turned it off (0f78cf4e)
    return args, notes


def expert_parallel_always(row: SiliconRow) -> bool:
    """InferenceX's MiniMax-M2.5 scripts for H200 (from 5e2c705d, 2026-03-13) and B200 (f342df18,
    2026-03-11, until bddbf403, 2026-04-03) passed --enable-expert-parallel whenever ``EP_SIZE -ge 1``,
    which every run's EP size (1 or more) is: the experts were spread over the TP group on every row."""
    if "minimax-m2.5" not in row.model.lower():
        return False
    day = measured_on(row)
    if row.system == "h200_sxm":
        return bool(day) and day >= "2026-03-13"
    if row.system in ("b200_sxm", "b300_sxm"):
        return bool(day) and "2026-03-11" <= day < "2026-04-03"
    return False


def to_vllm_entry(row: SiliconRow) -> tuple[Entry, list[str]]:
    """A vLLM ``row`` as a replayable entry and what its mapping assumes; raises :class:`Unreplayable`."""
    folder, quant, model_note = model_for(row, MODELS, UNMODELLED)
    if row.system not in SYSTEMS:
        raise Unreplayable(f"GPU system {row.system}: {NO_PROFILE}")
    args, notes = launch_flags(row)
    tp, dp = row.tp, 1
    ep = row.ep if row.ep > 1 else 1
    if row.dp > 1:
        if row.dp != row.tp:
            raise Unreplayable(f"attention DP {row.dp} with TP {row.tp}: InferenceX's vLLM scripts run one "
                               "DP rank per GPU")
        # InferenceX's scripts with DP_ATTENTION=true: --tensor-parallel-size=1 --data-parallel-size=$TP
        # --enable-expert-parallel, on TP GPUs (the CSV's moe_ep_size holds TP x DP)
        tp, dp, ep = 1, row.tp, row.tp
        notes.append(f"attention DP {row.dp} on {row.tp} GPUs: vLLM's --tensor-parallel-size 1 "
                     f"--data-parallel-size {row.tp} --enable-expert-parallel (InferenceX's DP_ATTENTION)")
    elif ep == 1 and row.tp > 1 and expert_parallel_always(row):
        ep = row.tp
        notes.append("--enable-expert-parallel on whatever the row's moe_ep says: the script's test "
                     "(EP_SIZE -ge 1) was true for every run")
    if quant:
        args["quantization"] = quant
    notes = [n for n in (model_note, *notes) if n]
    if row.apart:
        notes.append(f"scored apart: {row.apart}")
    workload, client_notes = client_workload(row)
    entry = Entry.model_validate(
        {
            "id": row.id,
            "source_url": f"{PREDICTED_SOURCE}: {row.source}",
            "model": row.model,
            "gpu": GPU_NAMES[row.system],
            "gpu_count": tp * dp,
            "vllm_version": row.version or "0.19.0",
            "parallelism": {"tp": tp, "dp": dp, "ep": ep},
            "server_args": args,
            "workload": workload,
            "measured": {"mean_ttft_ms": row.ttft_ms, "mean_tpot_ms": row.tpot_ms},
            "parasweep": {"model": folder, "hardware": SYSTEMS[row.system], "engine": "vllm"},
        }
    )
    return entry, [*notes, *client_notes]


def to_vllm_disagg_entry(row: DisaggRow) -> tuple[Entry, list[str]]:
    """A disaggregated vLLM ``row`` as a replayable entry (each role's servers: ``tp`` every GPU of a
    server, ``attention`` its DP ranks) and what its mapping assumes; raises :class:`Unreplayable`."""
    folder, quant, model_note = model_for(row, MODELS, UNMODELLED)
    if row.system not in SYSTEMS:
        raise Unreplayable(f"GPU system {row.system}: {NO_PROFILE}")
    nodes, streams = placed(row)
    notes = [n for n in (model_note,) if n]
    notes.append("launch not published (AIConfigurator's runs of Dynamo's vLLM runtime): vLLM's defaults "
                 "for each role's layout, KV over NIXL, each request prefilled first then read by its "
                 "decode server (vllm-router's order)")
    for name, role in (("prefill", row.prefill), ("decode", row.decode)):
        if role.attention > 1:
            notes.append(f"{name}: {role.attention} DP ranks of TP{role.gpus // role.attention} "
                         "(--data-parallel-size), the experts "
                         + ("spread (--enable-expert-parallel)" if role.ep > 1 else "sharded over them"))
    notes.append(streams)
    workload, client_notes = client_workload(row)

    def role(shape: RoleShape) -> dict[str, object]:
        return {"workers": shape.workers, "tp": shape.gpus, "ep": shape.ep, "attention": shape.attention}

    entry = Entry.model_validate({
        "id": row.id, "source_url": f"{PREDICTED_SOURCE}: {row.source}", "model": row.model,
        "gpu": GPU_NAMES[row.system], "gpu_count": row.gpus, "nodes": nodes,
        "vllm_version": row.version or "0.19.0", "server_args": {"quantization": quant} if quant else {},
        "disaggregation": {"transfer_backend": "nixl", "prefill": role(row.prefill),
                           "decode": role(row.decode)},
        "workload": workload,
        "measured": {"mean_ttft_ms": row.ttft_ms, "mean_tpot_ms": row.tpot_ms},
        "parasweep": {"model": folder, "hardware": SYSTEMS[row.system], "engine": "vllm"}})
    return entry, [*notes, *client_notes]
