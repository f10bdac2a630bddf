"""``python -m simulator serve MODEL <vLLM flags> --sim-*``: ``vllm serve``'s command line (the flags
parasweep builds, and a few a user passes often), turned into the simulator's configuration.

The simulator's configuration speaks in the engine-neutral quantities its model needs (layout, request
and token caps, KV budget, page size, whether host work overlaps the GPU); SGLang's flag names are its
spelling of them, so each vLLM flag is translated into the quantity it sets (docs/simulator.md,
"Playing vLLM", has the table) and what only vLLM has (its release, async scheduling, the prefill
threshold, the full-prompt check) rides beside them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.cli import add_sim_flags, build_parser
from simulator.kernel_lanes import VLLM_MOE_BACKENDS
from simulator.model_spec import ONLINE_FP8
from simulator.vllm.compilation import CompilationError, read_compilation
from simulator.vllm.kv_transfer_flag import KVTransferConfigError, parse_kv_transfer_config
from simulator.vllm.releases import NEWEST, PLAYED, default_caps, played
from simulator.vllm.speculative import SpecConfigError, async_with_spec, conditional_rates, parse_spec_config

if TYPE_CHECKING:
    from simulator.sim_config import SimConfig

# vLLM's KV cache dtypes the model prices (0.19.0's choices less the MLA-only and Intel ones), and the
# simulator's name for each
VLLM_KV_CACHE_DTYPES = {"auto": "auto", "bfloat16": "bfloat16", "float16": "bfloat16", "fp8": "fp8_e4m3",
                        "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# what vLLM says at start-up to --max-num-partial-prefills above 1 (every release that has the flag)
CONCURRENT_PARTIAL_PREFILL = ("Concurrent Partial Prefill is not supported. We recommend to remove "
                              "Concurrent Partial Prefill from your config.")
# vLLM's default --gpu-memory-utilization and --block-size (every played release)
GPU_MEMORY_UTILIZATION = 0.9
BLOCK_SIZE = 16
# vLLM's largest CUDA graph by default: min(2 x max_num_seqs, 512) (CompilationConfig)
MAX_CAPTURE = 512
# What vLLM's start-up profile leaves outside the KV cache beyond the weights: the peak activations of
# one step of --max-num-batched-tokens tokens and the non-torch allocations. Not measured here: an
# estimate of 1 GiB plus 0.25 MiB per batched token (3 GiB at 8192 tokens), docs/simulator.md.
PROFILE_BASE_MIB = 1024.0
PROFILE_MIB_PER_TOKEN = 0.25


def _bool_pair(p: argparse.ArgumentParser, flag: str, default: bool | None) -> None:
    """``--x`` / ``--no-x``, as vLLM's BooleanOptionalAction spells a bool field."""
    p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)


def build_vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m simulator serve",
        description="parasweep simulated engine playing vLLM: vllm serve's flags, discrete-event timing.",
        allow_abbrev=False,
    )
    a = p.add_argument
    a("model_tag", help="directory with config.json")
    a("--served-model-name", default=None)
    a("--load-format", default="auto")
    a("--skip-tokenizer-init", action="store_true")
    a("--trust-remote-code", action="store_true")
    a("--dtype", default="auto")
    a("--kv-cache-dtype", default="auto", choices=list(VLLM_KV_CACHE_DTYPES))
    a("--quantization", "-q", default=None, choices=[ONLINE_FP8])
    a("--max-model-len", type=int, default=None)
    a("--hf-overrides", default=None)
    a("--tensor-parallel-size", "-tp", type=int, default=1)
    a("--pipeline-parallel-size", "-pp", type=int, default=1)
    a("--data-parallel-size", "-dp", type=int, default=1)
    a("--enable-expert-parallel", action="store_true")
    a("--distributed-executor-backend", default=None, choices=["ray", "mp", "uni", "external_launcher"])
    # across nodes with the multiprocessing executor: one process per node, rank 0 serving
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--master-addr", default="127.0.0.1")
    a("--master-port", type=int, default=29501)
    a("--headless", action="store_true")
    a("--max-num-seqs", type=int, default=None)
    a("--max-num-batched-tokens", type=int, default=None)
    a("--gpu-memory-utilization", type=float, default=GPU_MEMORY_UTILIZATION)
    a("--block-size", type=int, default=None)
    _bool_pair(p, "--enable-prefix-caching", None)
    _bool_pair(p, "--async-scheduling", None)
    a("--enforce-eager", action="store_true")
    a("--max-cudagraph-capture-size", type=int, default=None)
    a("--moe-backend", default="auto")
    a("--speculative-config", default=None)
    a("--kv-transfer-config", default=None)
    a("--compilation-config", "-cc", default=None)
    a("--optimization-level", "-O", default=None)
    a("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"])
    a("--long-prefill-token-threshold", type=int, default=0)
    a("--max-num-partial-prefills", type=int, default=1)
    a("--seed", type=int, default=None)
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000)
    a("--disable-log-stats", action="store_true")
    a("--disable-log-requests", action="store_true")
    _bool_pair(p, "--enable-log-requests", False)
    a(
        "--uvicorn-log-level",
        default="info",
        choices=["debug", "info", "warning", "error", "critical", "trace"],
    )
    a(
        "--sim-vllm-release",
        default=NEWEST,
        choices=list(PLAYED),
        help="the vLLM release whose defaults, metric names and log wording the server plays",
    )
    add_sim_flags(p)
    return p


class VLLMFlagError(ValueError):
    """A command line vLLM would refuse (or one the simulated engine does not model)."""


def _neutral(v: argparse.Namespace) -> argparse.Namespace:
    """The simulator's configuration from vLLM's flags: the SGLang-spelt namespace its resolution reads,
    every field at its default, then the quantities vLLM's flags set."""
    from vocab.hardware import HardwareError, load_hardware

    if v.hf_overrides is not None:
        raise VLLMFlagError(
            "--hf-overrides: the simulated engine reads a config.json with the overrides "
            "already applied (parasweep writes one for the trial)"
        )
    moe_lockstep = v.data_parallel_size > 1 and _is_moe(v.model_tag)
    if moe_lockstep and v.pipeline_parallel_size > 1:
        raise VLLMFlagError(
            "--data-parallel-size > 1 with --pipeline-parallel-size > 1 on a MoE model is not modelled "
            "by the simulated engine playing vLLM"
        )
    if v.scheduling_policy != "fcfs":
        raise VLLMFlagError("--scheduling-policy priority is not modelled: requests carry no priority")
    if v.moe_backend not in VLLM_MOE_BACKENDS:
        raise VLLMFlagError(f"--moe-backend {v.moe_backend} is not modelled by the simulated engine "
                            f"(modelled: {', '.join(VLLM_MOE_BACKENDS)})")
    if v.max_num_partial_prefills != 1:  # EngineArgs._check_feature_supported, every release with the flag
        raise VLLMFlagError(CONCURRENT_PARTIAL_PREFILL)
    try:
        hw = load_hardware(v.sim_hardware)
    except HardwareError as e:
        raise VLLMFlagError(str(e)) from e
    seqs_default, tokens_default = default_caps(hw.memory_gb, hw.gpu)
    seqs = v.max_num_seqs if v.max_num_seqs is not None else seqs_default
    budget = v.max_num_batched_tokens if v.max_num_batched_tokens is not None else tokens_default
    for flag, value in (
        ("--max-num-seqs", seqs),
        ("--max-num-batched-tokens", budget),
        ("--tensor-parallel-size", v.tensor_parallel_size),
        ("--pipeline-parallel-size", v.pipeline_parallel_size),
        ("--data-parallel-size", v.data_parallel_size),
    ):
        if value < 1:
            raise VLLMFlagError(f"{flag} must be >= 1, got {value}")
    if not 0 < v.gpu_memory_utilization <= 1:
        raise VLLMFlagError(f"--gpu-memory-utilization must be in (0, 1], got {v.gpu_memory_utilization}")
    if v.long_prefill_token_threshold < 0:
        raise VLLMFlagError(
            f"--long-prefill-token-threshold must be >= 0, got {v.long_prefill_token_threshold}"
        )
    total_mib = hw.memory_gb * 1e9 / 2**20
    reserve = PROFILE_BASE_MIB + PROFILE_MIB_PER_TOKEN * budget
    if v.gpu_memory_utilization - reserve / total_mib <= 0:
        raise VLLMFlagError(
            f"--gpu-memory-utilization {v.gpu_memory_utilization:g} leaves no memory for the "
            f"KV cache after one step's activations ({reserve / 1024:.1f} GiB of "
            f"{total_mib / 1024:.0f} GiB)"
        )
    release = played(v.sim_vllm_release)
    asynchronous = release.async_scheduling_default if v.async_scheduling is None else v.async_scheduling
    speculative, spec_warnings = None, []
    if v.speculative_config is not None:
        try:
            speculative = parse_spec_config(v.speculative_config, release.version, v.model_tag,
                                            _has_mtp_layers(v.model_tag))
            asynchronous, off = async_with_spec(release.version, speculative.method, v.async_scheduling,
                                                release.async_scheduling_default)
        except SpecConfigError as e:
            raise VLLMFlagError(str(e)) from e
        spec_warnings = [*speculative.warnings, *([off] if off else [])]
        if moe_lockstep:  # the ranks' lockstep forward prices no drafter
            raise VLLMFlagError("--speculative-config with --data-parallel-size > 1 on a MoE model is not "
                                "modelled by the simulated engine")
        if speculative.synthetic is not None:  # vLLM's sampler accepts by these rates: they win
            v.sim_spec_acceptance = "rates:" + ",".join(f"{r:g}" for r in
                                                        conditional_rates(speculative.synthetic))
    kv_transfer = None
    if v.kv_transfer_config is not None:
        try:
            kv_transfer = parse_kv_transfer_config(v.kv_transfer_config)
        except KVTransferConfigError as e:
            raise VLLMFlagError(str(e)) from e
        if speculative is not None:
            raise VLLMFlagError("--kv-transfer-config with --speculative-config is not modelled by the "
                                "simulated engine")
    try:
        compiled = read_compilation(v.compilation_config, v.optimization_level, v.enforce_eager)
    except CompilationError as e:
        raise VLLMFlagError(str(e)) from e
    n = build_parser().parse_args(["--model-path", v.model_tag, "--sim-hardware", v.sim_hardware])
    n.served_model_name = v.served_model_name
    n.load_format, n.skip_tokenizer_init = v.load_format, v.skip_tokenizer_init
    n.trust_remote_code, n.dtype, n.quantization = v.trust_remote_code, v.dtype, v.quantization
    n.kv_cache_dtype = VLLM_KV_CACHE_DTYPES[v.kv_cache_dtype]
    n.context_length = v.max_model_len
    n.tp_size, n.pp_size = v.tensor_parallel_size, v.pipeline_parallel_size
    if v.data_parallel_size > 1:
        _data_parallel(n, v.data_parallel_size, moe_lockstep)
    world = v.tensor_parallel_size * v.pipeline_parallel_size * v.data_parallel_size
    n.vllm_mp_nodes = v.nnodes > 1
    n.vllm_node_rank = v.node_rank
    if v.nnodes > 1:
        # vLLM's multiprocessing executor across nodes: the processes meet at rank 0's master address
        # (simulator/nodes.py), rank 0 models every node; the others run headless, workers only
        if v.node_rank > 0 and not v.headless:
            raise VLLMFlagError("--node-rank > 0 needs --headless in the simulated engine: a node other "
                                "than rank 0 runs vLLM's workers only")
        n.nnodes = v.nnodes
        n.dist_init_addr = f"{v.master_addr}:{v.master_port}"
    elif world > hw.num_gpus and hw.nodes > 1:
        # across nodes vLLM is one server process whose Ray executor places the ranks on the other nodes:
        # the model prices the layout over the nodes it takes; no other process of the engine joins
        n.nnodes = min(-(-world // hw.num_gpus), hw.nodes)
        n.dist_init_addr = "127.0.0.1:1"
    n.ep_size = n.tp_size if v.enable_expert_parallel else 1  # every GPU of the engine under DP
    n.max_running_requests = seqs
    # one token budget per step: what a step computes, prompt chunks and decodes together
    n.chunked_prefill_size = n.max_prefill_tokens = budget
    n.mem_fraction_static = v.gpu_memory_utilization - reserve / total_mib
    n.page_size = v.block_size or BLOCK_SIZE
    n.disable_radix_cache = v.enable_prefix_caching is False  # on by default in every played release
    n.disable_overlap_schedule = not asynchronous
    n.disable_cuda_graph = not compiled.full_graphs  # no full decode graphs
    # vLLM folds DeepSeek's shared expert into the routed ones only on ROCm (AITER); on CUDA it runs beside
    n.disable_shared_experts_fusion = True
    n.cuda_graph_max_bs_decode = (v.max_cudagraph_capture_size or compiled.max_capture
                                  or min(2 * seqs, MAX_CAPTURE))
    n.vllm_speculative = speculative
    n.vllm_kv_transfer = kv_transfer
    if speculative is not None and release.spec_widens_capture:
        # graphs are captured by a step's tokens, a verify of b requests runs b(k + 1): from 0.15 the
        # default largest capture grows with it, min(2 x max_num_seqs x (k + 1), 512)
        n.cuda_graph_max_bs_decode = (v.max_cudagraph_capture_size or compiled.max_capture
                                      or min(2 * seqs * (speculative.k + 1), MAX_CAPTURE))
    n.random_seed = v.seed if v.seed is not None else 0  # vLLM seeds with 0 where unset
    n.host, n.port = v.host, v.port
    n.enable_metrics = True  # vLLM always serves /metrics
    n.skip_server_warmup = True  # vLLM sends itself no request before it is ready
    n.log_level = "info"
    for name in (
        "sim_calibration",
        "sim_step_costs",
        "sim_router",
        "sim_spec_acceptance",
        "sim_pd_node",
        "sim_time_scale",
    ):
        setattr(n, name, getattr(v, name))
    for name in vars(v):
        if name.startswith("sim_fault_"):
            setattr(n, name, getattr(v, name))
    # what only vLLM has, beside the shared quantities
    n.dialect = "vllm"
    n.vllm_release = release.version
    n.async_scheduling = asynchronous
    n.long_prefill_token_threshold = v.long_prefill_token_threshold
    n.vllm_moe_backend = (release.fp8_moe_backend(hw.kernel_tables or "") if v.moe_backend == "auto"
                          else v.moe_backend)
    n.vllm_fused_allreduce_bytes = release.fused_allreduce_bytes(
        hw.kernel_tables or "", v.tensor_parallel_size, compiled.fuse_allreduce
    )
    n.vllm_pieces = compiled.pieces
    n.vllm_cudagraph_mode = compiled.cudagraph_mode
    n.dialect_warnings = (
        ["--compilation-config keys that price nothing in the simulated engine: "
         + ", ".join(compiled.ignored)]
        if compiled.ignored else []
    ) + spec_warnings
    n.log_stats = not v.disable_log_stats
    n.gpu_memory_utilization = v.gpu_memory_utilization
    n.vllm_argv = sys.argv[1:]
    return n


def _has_mtp_layers(model_dir: str) -> bool:
    """Whether the checkpoint carries next-token prediction layers (``num_nextn_predict_layers``)."""
    from vocab.model import ModelConfigError, mtp_layers, read_config_json

    try:
        return mtp_layers(read_config_json(Path(model_dir))) > 0
    except (ModelConfigError, OSError):
        return False


def _is_moe(model_dir: str) -> bool:
    """Whether the checkpoint is a mixture of experts (False where its config cannot be read: the
    resolution says why)."""
    from simulator.model_spec import load_model_spec
    from vocab.model import ModelConfigError

    try:
        return load_model_spec(model_dir, None).is_moe
    except (ModelConfigError, OSError):
        return False


def _data_parallel(n: argparse.Namespace, dp: int, moe_lockstep: bool) -> None:
    """``--data-parallel-size dp`` in the simulator's quantities. A dense model's DP ranks are engine cores
    of their own (replicas). A MoE model's run in lockstep: each rank's attention on its own TP group,
    the experts over every rank's GPUs (spread with --enable-expert-parallel, else sharded), every rank
    stepping together, an idle one with a dummy batch. That is the simulator's attention-DP layout with an
    attention TP of ``--tensor-parallel-size`` and each rank's LM head on its own GPUs. vLLM's API server
    sends a request to the rank with the fewest waiting and running requests (from the ranks' reported
    counts, waiting ones weighted 4 times): the model counts requests held, exactly."""
    tp = n.tp_size
    if moe_lockstep:
        vars(n).update(tp_size=tp * dp, attn_dp_size=dp, enable_dp_lm_head=True)
    else:
        n.dp_size = dp
    n.load_balance_method = "total_requests"


def parse(argv: list[str], exit_on_error: bool = True) -> argparse.Namespace:
    """``serve MODEL FLAGS...`` parsed and translated; a flag vLLM's parser would refuse exits 2 (as vLLM
    does), or raises VLLMFlagError where not ``exit_on_error`` (a prediction); a combination vLLM refuses
    at start-up raises VLLMFlagError."""
    if not argv or argv[0] != "serve":
        raise VLLMFlagError("the vLLM dialect's command is `serve MODEL [flags]`")
    parser = build_vllm_parser()
    if not exit_on_error:

        def error(message: str) -> None:
            raise VLLMFlagError(f"simulator flags: {message}")

        parser.error = error  # type: ignore[method-assign]
    return _neutral(parser.parse_args(argv[1:]))


def resolved(args: argparse.Namespace) -> SimConfig:
    """The translated flags resolved into the simulator's configuration; VLLMFlagError, in vLLM's words
    where vLLM has its own, for a configuration it refuses at start-up."""
    from simulator.resolve import FlagError, resolve

    try:
        return resolve(args)
    except FlagError as e:
        message = str(e)
        if message.startswith("Not enough memory"):  # vLLM's words for the same refusal
            message = ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                       f"when initializing the engine. ({message.split('(', 1)[-1]}")
        raise VLLMFlagError(message) from e


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = resolved(parse(argv))  # a headless node checks the same flags as rank 0 would
    except VLLMFlagError as e:
        print(f"ValueError: {e}", file=sys.stderr, flush=True)
        return 1
    a = cfg.args
    if a.vllm_node_rank > 0:  # workers only: joins rank 0 and stands by (simulator/nodes.py)
        from simulator.nodes import follow
        from simulator.vllm.logs import VLLMLogWriter

        VLLMLogWriter().info(f"Launching vLLM (v{a.vllm_release}) headless multiproc executor, with head "
                             f"node address {a.dist_init_addr} for torch.distributed process group.",
                             "serve.py:193")
        return follow(a.dist_init_addr, a.vllm_node_rank, a.nnodes, a.dist_timeout)
    from simulator.vllm.server import serve

    return serve(cfg)
