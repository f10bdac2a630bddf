"""Validate the launch flags and compute SGLang's auto defaults from memory arithmetic: memory tiers,
``mem_fraction_static``, KV capacity per PP stage, ``max_running_requests``, ``pp_max_micro_batch_size``,
the attention backend (docs/simulator.md, "Memory auto-defaults").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
from pathlib import Path

from simulator import SGLANG_COMPAT_VERSION
from simulator.attention_dp.costs import LockstepCosts
from simulator.attention_dp.layout import (
    AttentionDP,
    AttentionDPError,
    extra_weight_bytes,
    resolve_attention_dp,
)
from simulator.calibration import CalibrationError, load_calibration
from simulator.costs import CostModel, CostParams, Parallel
from simulator.kernel_tables import kernel_tables
from simulator.model_spec import (
    KV_CACHE_DTYPES,
    ONLINE_FP8,
    ModelConfigError,
    ModelSpec,
    load_model_spec,
    quantized_online,
)
from simulator.nodes import split_address
from simulator.schedule_policy import POLICIES
from simulator.sim_config import MIB, SimConfig, StageMemory, page_size_for
from simulator.speculative.acceptance import AcceptanceError
from simulator.speculative.decoding import build_spec_decoding, load_draft
from simulator.speculative.params import SPEC_MAX_RUNNING_REQUESTS, SpecFlagError, resolve_spec
from simulator.step_costs import StepCosts, StepCostsError, apply_step_costs
from vocab.hardware import HardwareConf, HardwareError, load_hardware, resolve_hardware_path

# SGLang's memory tiers by total GPU memory (MiB thresholds): chunked_prefill_size, decode graph max bs
# for tp<4 and tp>=4 (the table in docs/simulator.md, "Memory auto-defaults").
_TIERS = [
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 4096, 48, 160),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (float("inf"), 16384, 512, 512),
]


class FlagError(ValueError):
    """The launch flags describe a configuration SGLang would refuse (the server prints it and exits 1)."""


def _tier(gpu_mem_mib: float) -> tuple[int, int, int]:
    for limit, chunk, bs_small_tp, bs_large_tp in _TIERS:
        if gpu_mem_mib < limit:
            return chunk, bs_small_tp, bs_large_tp
    raise AssertionError("unreachable")


def _default_attention_backend(spec: ModelSpec, hw: HardwareConf) -> str:
    gpu = hw.gpu.upper()
    hopper = "H100" in gpu or "H200" in gpu or "H800" in gpu or "H20" in gpu
    sm100 = "B200" in gpu or "B300" in gpu or "GB200" in gpu
    if spec.attention == "mla":
        return "fa3" if hopper else ("flashinfer" if (sm100 or "BLACKWELL" in gpu) else "triton")
    if hopper:
        return "fa3"
    if sm100:
        return "trtllm_mha"
    return "flashinfer"


def _layer_partition(num_layers: int, pp: int) -> list[int] | None:
    """SGLang's ``SGLANG_PP_LAYER_PARTITION="a,b,..."``: layers per PP stage (docs/simulator.md, "The cost
    model", layer split)."""
    raw = os.environ.get("SGLANG_PP_LAYER_PARTITION", "").strip()
    if not raw or pp == 1:
        return None
    try:
        parts = [int(x) for x in raw.split(",")]
    except ValueError as e:
        raise FlagError(f"SGLANG_PP_LAYER_PARTITION={raw!r} is not a comma-separated list of ints") from e
    if len(parts) != pp or sum(parts) != num_layers or min(parts) < 1:
        raise FlagError(
            f"SGLANG_PP_LAYER_PARTITION={raw!r} must have pp_size ({pp}) positive entries summing to "
            f"num_hidden_layers ({num_layers})"
        )
    return parts


def _health_check_timeout() -> float:
    """SGLang's ``SGLANG_HEALTH_CHECK_TIMEOUT`` (seconds, default 20): how long /health waits for its probe
    generation's output before answering 503."""
    raw = os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "").strip()
    if not raw:
        return 20.0
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise FlagError(f"SGLANG_HEALTH_CHECK_TIMEOUT={raw!r} must be a number of seconds > 0")
    return value


def resolve(args: argparse.Namespace) -> SimConfig:
    warnings: list[str] = []
    try:
        hw_path = resolve_hardware_path(args.sim_hardware)
        hw = load_hardware(args.sim_hardware)
    except HardwareError as e:
        raise FlagError(str(e)) from e
    params = CostParams()
    calibrated_acceptance: dict = {}
    if getattr(args, "sim_calibration", None):
        try:
            calibration = load_calibration(args.sim_calibration)
            params, hw = calibration.apply(params, hw)
            calibrated_acceptance = calibration.spec_acceptance
        except CalibrationError as e:
            raise FlagError(str(e)) from e
    if not Path(args.model_path).is_dir():
        raise FlagError(f"model path {args.model_path!r} is not a directory with a config.json")
    try:
        spec = load_model_spec(args.model_path, args.context_length)
    except ModelConfigError as e:
        raise FlagError(str(e)) from e
    spec = dataclasses.replace(spec, kv_bytes_per_elem=KV_CACHE_DTYPES[args.kv_cache_dtype])
    if getattr(args, "quantization", None) == ONLINE_FP8:
        spec = quantized_online(spec)

    tp, pp, ep, dp, depth = args.tp_size, args.pp_size, args.ep_size, args.dp_size, args.pp_async_batch_depth
    for name, v in (("tp_size", tp), ("pp_size", pp), ("ep_size", ep), ("dp_size", dp)):
        if v < 1:
            raise FlagError(f"{name} must be >= 1, got {v}")
    try:
        attention_dp, dp, dp_warnings = resolve_attention_dp(args, tp, dp, pp)
    except AttentionDPError as e:
        raise FlagError(str(e)) from e
    warnings += dp_warnings
    warnings += list(getattr(args, "dialect_warnings", []))  # what the played engine's own flags left out
    if depth < 0:
        raise FlagError(f"pp_async_batch_depth must be >= 0, got {depth}")
    if args.pp_max_micro_batch_size is not None and args.pp_max_micro_batch_size < 1:
        raise FlagError(f"pp_max_micro_batch_size must be >= 1, got {args.pp_max_micro_batch_size}")
    if args.max_running_requests is not None and args.max_running_requests < 1:
        raise FlagError(f"max_running_requests must be >= 1, got {args.max_running_requests}")
    if args.sim_time_scale <= 0:
        raise FlagError(f"--sim-time-scale must be > 0, got {args.sim_time_scale}")
    if args.schedule_policy not in POLICIES:
        why = (" (SGLang accepts it on the command line, then its scheduler fails at start-up)"
               if args.schedule_policy == "priority" else "")
        raise FlagError(f"Unknown schedule_policy: policy={args.schedule_policy!r}{why}; "
                        f"valid: {', '.join(POLICIES)}")
    if args.schedule_policy == "shortest-prefill-first" and args.disable_radix_cache:
        raise FlagError("Experimental shortest-prefill-first requires prefix caching "
                        "(drop --disable-radix-cache)")
    if args.disaggregation_mode == "prefill" and args.disaggregation_transfer_backend == "fake":
        raise FlagError("Prefill server does not support 'fake' as the transfer backend")
    if args.disaggregation_mode != "null" and args.dp_size > 1:
        raise FlagError("--dp-size > 1 with --disaggregation-mode is not modelled by the simulated engine")
    if args.disaggregation_mode == "decode" and not args.disable_radix_cache:
        args.disable_radix_cache = True  # SGLang 0.5.23's pd_disaggregation_hook, with this warning
        warnings.append("Radix cache is disabled for decode server")
    if args.page_size is not None and args.page_size < 1:
        raise FlagError(f"page_size must be >= 1, got {args.page_size}")
    if args.decode_log_interval < 1:
        raise FlagError(f"decode_log_interval must be >= 1, got {args.decode_log_interval}")
    if ep > 1 and tp % ep != 0:
        raise FlagError(f"ep_size ({ep}) must divide tp_size ({tp}): expert parallelism lives inside TP")
    if pp > spec.num_layers:
        raise FlagError(f"pp_size ({pp}) must be <= num_hidden_layers ({spec.num_layers})")
    if spec.num_heads % tp != 0:
        raise FlagError(f"num_attention_heads ({spec.num_heads}) must be divisible by tp_size ({tp})")
    if spec.attention == "gqa" and spec.num_kv_heads % tp != 0 and tp % spec.num_kv_heads != 0:
        raise FlagError(
            f"num_key_value_heads ({spec.num_kv_heads}) and tp_size ({tp}) must divide one another"
        )
    if ep > 1 and (not spec.is_moe or spec.num_experts % ep != 0):
        raise FlagError(f"ep_size ({ep}) needs a MoE model whose expert count divides by it")
    if args.moe_a2a_backend != "none" and ep != tp:
        warnings.append(
            f"MoE a2a backend {args.moe_a2a_backend} is enabled. The expert parallel size is adjusted "
            f"from {ep} to the tensor parallel size [{tp}]."
        )
        ep = tp
    world = tp * pp * dp
    nnodes = args.nnodes
    if nnodes < 1 or nnodes > hw.nodes:
        raise FlagError(f"nnodes ({nnodes}) must be between 1 and the {hw.nodes} node(s) of {hw.name}")
    if args.node_rank != 0:  # rank 0 models every node; the others stand by (simulator/nodes.py)
        raise FlagError(f"node_rank {args.node_rank}: only rank 0 is modelled; the simulated engine's "
                        f"other ranks stand by (python -m simulator ... --node-rank {args.node_rank})")
    if nnodes > 1 and not args.dist_init_addr:
        raise FlagError("--dist-init-addr is required with --nnodes > 1 (rank 0's HOST:PORT)")
    if nnodes > 1:
        try:
            split_address(args.dist_init_addr)
        except ValueError as e:
            raise FlagError(f"{e} (rank 0's address, where the other nodes join)") from None
    # SGLang 0.5.23's own checks (validation_hook.py)
    if (tp * pp) % nnodes:
        raise FlagError("tp_size must be divisible by number of nodes")
    if dp > 1 and nnodes != 1:
        raise FlagError("multi-node data-parallel replicas are not supported; use attention DP "
                        "(--attn-dp-size) across nodes")
    if world > hw.num_gpus * nnodes:
        raise FlagError(
            f"world size tp*pp*dp = {tp}*{pp}*{dp} = {world} exceeds the {hw.num_gpus * nnodes} GPUs of "
            f"{hw.name}" + (f" ({nnodes} nodes)" if nnodes > 1 else "")
        )
    if spec.context_length > spec.max_context_length:
        # SGLang's ModelConfig: refused unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set (a warning)
        msg = (f"User-specified context_length ({spec.context_length}) is greater than the derived "
               f"context_length ({spec.max_context_length}) from the model's config.json")
        env = os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "")
        if env.lower() not in ("1", "true", "yes"):
            raise FlagError(f"{msg}. To allow overriding this maximum, set the env var "
                            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
        warnings.append(f"Warning: {msg}. This may lead to incorrect model outputs or CUDA "
                        "errors.")
    if spec.context_length < 2:
        raise FlagError(f"context_length must be >= 2, got {spec.context_length}")

    backend = args.attention_backend or _default_attention_backend(spec, hw)
    vllm_spec = getattr(args, "vllm_speculative", None)  # --speculative-config, read by the vLLM dialect
    try:
        speculative = vllm_spec.params if vllm_spec is not None else resolve_spec(
            args.speculative_algorithm, architecture=spec.architecture, model_path=args.model_path,
            draft_model_path=args.speculative_draft_model_path, num_steps=args.speculative_num_steps,
            topk=args.speculative_eagle_topk, draft_tokens=args.speculative_num_draft_tokens,
            page_size=page_size_for(args.page_size, backend), attention_backend=backend, attn_dp=False,
            pp_size=pp, pp_spec_enabled=os.environ.get("SGLANG_ENABLE_PP_SPEC", "").lower() in ("1", "true"))
    except SpecFlagError as e:
        raise FlagError(str(e)) from e
    draft = None
    if speculative is not None:
        if pp > 1:
            raise FlagError("the simulated engine does not model pipeline parallelism with speculative "
                            "decoding" + ("" if vllm_spec is not None else
                                          " (SGLang runs it only with SGLANG_ENABLE_PP_SPEC=1 and EAGLE)"))
        warnings += speculative.warnings
        try:
            draft = load_draft(speculative, spec, hw,
                               Parallel(tp=tp, ep=ep, moe_a2a_backend=args.moe_a2a_backend), params,
                               args.context_length)
        except (ModelConfigError, OSError) as e:
            raise FlagError(f"speculative draft model {speculative.draft_model_path!r}: {e}") from e

    disable_overlap = bool(args.disable_overlap_schedule)
    if pp > 1 and not disable_overlap:
        warnings.append("Pipeline parallelism is incompatible with overlap schedule.")
        disable_overlap = True

    gpu_mem_mib = hw.memory_gb * 1e9 / MIB
    tier_chunk, bs_small, bs_large = _tier(gpu_mem_mib)
    chunked = args.chunked_prefill_size if args.chunked_prefill_size is not None else tier_chunk
    if chunked == 0 or chunked < -1:
        raise FlagError(f"chunked_prefill_size must be positive or -1 (disabled), got {chunked}")
    graph_bs = args.cuda_graph_max_bs_decode
    if graph_bs is None:
        graph_bs = bs_small if tp < 4 else bs_large
        if args.max_running_requests is not None:
            graph_bs = min(graph_bs, args.max_running_requests)

    frac = args.mem_fraction_static
    if frac is None:
        reserved = 512 + max(chunked, 2048) * 1.5 + tp * pp / 8 * 1024 + graph_bs * 2
        if attention_dp is not None:  # padding for DP attention's gathers, more with large graphs
            reserved += graph_bs * attention_dp.ranks * (3 + (1.5 if graph_bs > 300 else 0))
        if gpu_mem_mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        frac = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    if not 0 < frac < 1:
        raise FlagError(f"mem_fraction_static must be in (0, 1), got {frac}")
    # SGLang splits its token and request caps over the attention-DP ranks; vLLM's are each engine core's
    sglang = getattr(args, "dialect", "sglang") == "sglang"
    shares = attention_dp.ranks if attention_dp is not None and sglang else 1
    if shares > 1 and chunked > 0:  # each rank prefills its share (after the memory rule)
        warnings.append(f"DP attention is enabled. chunked prefill size is adjusted from {chunked} to "
                        f"{chunked // shares}.")
        chunked //= shares

    par = Parallel(tp=tp, pp=pp, ep=ep, moe_a2a_backend=args.moe_a2a_backend, eplb=bool(args.enable_eplb))
    disable_graph = bool(args.disable_cuda_graph)
    partition = _layer_partition(spec.num_layers, pp)
    # Build the cost model once to get per-stage weights; graph bs is fixed up after max_running_requests.
    cost = CostModel(spec, hw, par, graph_bs, disable_graph, params, partition)
    total = hw.memory_gb * 1e9
    graph_mem = 0.0 if disable_graph else graph_bs * 2 * MIB  # activations of the captured graphs
    capacities = []
    # a draft sits beside the target (one stage) and widens every KV cell by its own layers' share
    draft_bytes = draft.weight_bytes if draft is not None else 0.0
    cell_factor = draft.kv_cell_factor if draft is not None else 1.0
    weights, kv_per_token = _per_gpu_memory(cost, attention_dp, spec, hw, params, graph_bs, disable_graph,
                                            max(0, args.ep_num_redundant_experts))
    for st, w, kv_tok in zip(cost.stages, weights, kv_per_token, strict=True):
        kv_bytes = total * frac - w - draft_bytes
        cap = int(kv_bytes // (kv_tok * cell_factor)) if kv_bytes > 0 else 0
        if cap <= 0:
            raise FlagError(
                "Not enough memory. Please try to increase --mem-fraction-static."
                + (" Every attention-DP rank keeps the attention weights and the embedding whole."
                   if attention_dp else "")
                + f" (PP stage {st.index}: weights {w / 1e9:.1f} GB per GPU, static budget "
                  f"{total * frac / 1e9:.1f} GB)"
            )
        capacities.append(cap)
    token_capacity = min(capacities)  # SGLang MIN-all-reduces the pool size across PP ranks
    if args.max_total_tokens is not None:
        token_capacity = min(token_capacity, args.max_total_tokens)
    if token_capacity < 2:
        raise FlagError(f"max_total_tokens too small: {token_capacity}")

    ctx = spec.context_length
    asked_mrr = args.max_running_requests
    if asked_mrr is None and speculative is not None:
        asked_mrr = SPEC_MAX_RUNNING_REQUESTS
        warnings.append("Max running requests is reset to 48 for speculative decoding. You can override this "
                        "by explicitly setting --max-running-requests.")
    if asked_mrr is None:
        estimated = min(max(int(token_capacity / ctx * 512), 2048), 4096)
        mrr = min(estimated, token_capacity // 2)
    else:
        # attention DP: the value is each rank's share (SGLang: max_running_requests // attn_dp_size)
        asked_mrr = max(asked_mrr // shares, 1)
        mrr = min(asked_mrr, token_capacity // 2)
        if mrr < asked_mrr:
            warnings.append(
                f"max_running_requests was reduced from the requested {asked_mrr} to {mrr} "
                "(per dp worker) due to the available KV cache capacity."
            )
    mrr = max(mrr, 1)
    cap = args.pp_max_micro_batch_size or max(mrr // pp, 1)
    # captured sizes are clipped to the request pool size (SGLang's batches; vLLM clips its, counted in a
    # step's tokens, to its token budget instead: priced so, the served vLLM runs' TTFTs were predicted
    # worse, docs/simulator.md, "Playing vLLM")
    # (a speculative verify runs k + 1 tokens a request: vLLM's graphs hold that many tokens per request)
    width = speculative.num_draft_tokens if speculative is not None and not sglang else 1
    graph_bs = min(graph_bs, mrr * width)
    cost = CostModel(spec, hw, par, graph_bs, disable_graph, params, partition)
    cost.graph_in_tokens = not sglang  # vLLM captures its graphs by a step's tokens, SGLang by requests
    # vLLM replays what a full graph does not from piecewise graphs, unless --enforce-eager
    # (with cudagraph_mode PIECEWISE, decode steps too: no full graphs, pieces still)
    cost.piecewise = not sglang and getattr(args, "vllm_pieces", not disable_graph)
    cost.fused_allreduce_bytes = int(getattr(args, "vllm_fused_allreduce_bytes", 0))

    stages = []
    for w, kv_tok in zip(weights, kv_per_token, strict=True):
        kv = token_capacity * kv_tok * cell_factor
        stages.append(
            StageMemory(
                weight_bytes=w + draft_bytes,
                kv_bytes=kv,
                graph_bytes=graph_mem,
                token_capacity=token_capacity,
                available_bytes=max(total - w - draft_bytes - kv - graph_mem, 0.0),
            )
        )
    # the engine played prices its steps with its own kernels' tables, at its release
    framework = getattr(args, "dialect", "sglang")
    launched = args.vllm_release if framework == "vllm" else SGLANG_COMPAT_VERSION

    def price(model: CostModel) -> StepCosts:
        return apply_step_costs(getattr(args, "sim_step_costs", "auto"), model, hw.kernel_tables,
                                launched, backend,
                                fuse_shared_experts=not args.disable_shared_experts_fusion,
                                framework=framework, moe_backend=getattr(args, "vllm_moe_backend", "auto"),
                                collective_tables=hw.collective_tables)

    try:
        step_costs = price(cost)
    except StepCostsError as e:
        raise FlagError(str(e)) from e
    lockstep = None
    if attention_dp is not None:
        rank_cost = _rank_cost(attention_dp, spec, hw, params, graph_bs, disable_graph)
        price(rank_cost)
        tables = (kernel_tables(hw.kernel_tables, SGLANG_COMPAT_VERSION)
                  if step_costs.source == "measured" and hw.kernel_tables else None)
        lockstep = LockstepCosts(attention_dp, rank_cost, cost, tables)
    decoding = None
    if speculative is not None and draft is not None:
        try:
            decoding = build_spec_decoding(speculative, draft, cost, args.sim_spec_acceptance, price,
                                           calibrated_acceptance)
        except AcceptanceError as e:
            raise FlagError(f"--sim-spec-acceptance: {e}") from e
    seed = args.random_seed if args.random_seed is not None else random.randint(0, 1 << 30)
    return SimConfig(
        args=args,
        spec=spec,
        hw=hw,
        hw_path=str(hw_path),
        cost=cost,
        par=par,
        tp=tp,
        pp=pp,
        ep=ep,
        dp=dp,
        depth=depth,
        served_model_name=args.served_model_name or args.model_path,
        context_len=ctx,
        chunked_prefill_size=chunked,
        max_prefill_tokens=args.max_prefill_tokens,
        max_total_num_tokens=token_capacity,
        max_running_requests=mrr,
        pp_max_micro_batch_size=cap,
        cuda_graph_max_bs_decode=graph_bs,
        disable_cuda_graph=disable_graph,
        disable_overlap_schedule=disable_overlap,
        mem_fraction_static=frac,
        attention_backend=backend,
        random_seed=seed,
        time_scale=args.sim_time_scale,
        stages=stages,
        warnings=warnings,
        health_check_timeout_s=_health_check_timeout(),
        step_costs=step_costs,
        speculative=decoding,
        attention_dp=attention_dp,
        lockstep=lockstep,
    )


def _rank_cost(layout: AttentionDP, spec: ModelSpec, hw: HardwareConf, params: CostParams, graph_bs: int,
               disable_graph: bool) -> CostModel:
    """The model at one attention-DP rank's attention TP: what prices (and sizes) its attention blocks."""
    return CostModel(spec, hw, Parallel(tp=layout.attn_tp), graph_bs, disable_graph, params)


def _per_gpu_memory(cost: CostModel, layout: AttentionDP | None, spec: ModelSpec, hw: HardwareConf,
                    params: CostParams, graph_bs: int, disable_graph: bool, redundant: int
                    ) -> tuple[list[float], list[float]]:
    """Each stage's weights on one GPU and KV bytes a cached token takes there: the TP layout's (with
    ``--ep-num-redundant-experts`` copies spread over the group), or with attention DP the replicated
    dense weights added and a rank's KV split only over its own GPUs (``attention_dp/layout.py``)."""
    if layout is None:
        copies = [st.moe_layers * redundant * spec.expert_bytes / cost.par.tp for st in cost.stages]
        return ([st.weight_bytes + c for st, c in zip(cost.stages, copies, strict=True)],
                [st.kv_bytes_per_token for st in cost.stages])
    rank = _rank_cost(layout, spec, hw, params, graph_bs, disable_graph)
    st = cost.stages[0]
    return ([st.weight_bytes + extra_weight_bytes(spec, layout, st.moe_layers)],
            [rank.stages[0].kv_bytes_per_token])
