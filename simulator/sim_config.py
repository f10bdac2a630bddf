"""The resolved configuration of one simulated server: every launch flag with SGLang's auto defaults
filled in (``resolve.py`` computes it), and the ``/server_info`` dict derived from it.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

from simulator import SGLANG_COMPAT_VERSION, __version__
from simulator.attention_dp.costs import LockstepCosts
from simulator.attention_dp.layout import AttentionDP
from simulator.costs import CostModel, Parallel
from simulator.model_spec import ModelSpec
from simulator.speculative.decoding import SpecDecoding
from simulator.step_costs import StepCosts
from vocab.hardware import HardwareConf

MIB = 2**20
GIB = 2**30


@dataclass
class StageMemory:
    weight_bytes: float
    kv_bytes: float
    graph_bytes: float
    token_capacity: int
    available_bytes: float


def page_size_for(asked: int | None, backend: str) -> int:
    """Tokens per KV page. SGLang's default is 1, but some attention backends need pages and set or
    override it (0.5.23's overrides)."""
    if backend == "trtllm_mha":
        return asked if asked in (16, 32, 64, 128) else 64
    if backend == "trtllm_mla":
        return asked if asked in (32, 64) else 64
    if backend == "flashmla":
        return 64
    if backend == "fa4":
        return 128
    return int(asked or 1)


@dataclass
class SimConfig:
    args: argparse.Namespace
    spec: ModelSpec
    hw: HardwareConf
    hw_path: str
    cost: CostModel
    par: Parallel
    tp: int
    pp: int
    ep: int
    dp: int
    depth: int
    served_model_name: str
    context_len: int
    chunked_prefill_size: int  # -1 = disabled
    max_prefill_tokens: int
    max_total_num_tokens: int
    max_running_requests: int
    pp_max_micro_batch_size: int
    cuda_graph_max_bs_decode: int  # what was captured (clipped to max_running_requests)
    disable_cuda_graph: bool
    disable_overlap_schedule: bool
    mem_fraction_static: float
    attention_backend: str
    random_seed: int
    time_scale: float
    stages: list[StageMemory]
    warnings: list[str] = field(default_factory=list)
    # /health's wait for the probe's output (SGLang's SGLANG_HEALTH_CHECK_TIMEOUT, default 20 s)
    health_check_timeout_s: float = 20.0
    # what priced the kernels of each step (roofline or measured tables), for the run's records
    step_costs: StepCosts = field(default_factory=lambda: StepCosts("roofline", "roofline"))
    startup_time: float = field(default_factory=time.time)
    speculative: SpecDecoding | None = None  # --speculative-algorithm (simulator/speculative/)
    # --attn-dp-size > 1: the ranks' layout and their lockstep forward (simulator/attention_dp/); the
    # capacities above (KV tokens, max_running_requests) are then each rank's
    attention_dp: AttentionDP | None = None
    lockstep: LockstepCosts | None = None

    @property
    def attn_dp(self) -> int:
        """Attention-DP ranks of the engine's TP group (1: none)."""
        return self.attention_dp.ranks if self.attention_dp is not None else 1

    @property
    def schedulers(self) -> int:
        """Schedulers of the engine, each with its own requests and KV cache: one per DP replica, or per
        attention-DP rank (SGLang refuses both at once)."""
        return self.dp * self.attn_dp

    @property
    def rank_tp(self) -> int:
        """GPUs of one scheduler's share of a stage: its replica's TP group, or its rank's attention TP."""
        return self.tp // self.attn_dp

    @property
    def mixed_chunk(self) -> bool:
        """Prefill batches carry the running decodes (SGLang: ``--enable-mixed-chunk`` with chunked
        prefill on)."""
        return bool(self.args.enable_mixed_chunk) and self.chunked_prefill_size > 0

    @property
    def page_size(self) -> int:
        """Tokens per KV page: the prefix cache matches and keeps whole pages."""
        return page_size_for(self.args.page_size, self.attention_backend)

    @property
    def radix_cache(self) -> bool:
        """Prompts' KV is kept and reused across requests (off with ``--disable-radix-cache``)."""
        return not self.args.disable_radix_cache

    @property
    def server_warmup(self) -> bool:
        """SGLang's server sends itself one short request before it reports ready (off with
        ``--skip-server-warmup``)."""
        return not self.args.skip_server_warmup

    @property
    def router(self) -> str:
        """How requests are spread over the DP replicas or attention-DP ranks (``router.py``): the DP
        controller's ``--load-balance-method`` where it names one the model has, else ``--sim-router``
        (the router package's policy in front of replicas)."""
        if self.args.load_balance_method == "total_requests":
            return "total_requests"
        return str(self.args.sim_router)

    @property
    def dialect(self) -> str:
        """The engine the server plays: ``sglang``, or ``vllm`` (``python -m simulator serve ...``)."""
        return str(getattr(self.args, "dialect", "sglang"))

    @property
    def schedule_policy(self) -> str:
        return str(self.args.schedule_policy)

    @property
    def max_req_input_len(self) -> int:
        return min(self.context_len - 1, self.max_total_num_tokens - 1)

    def speculative_info(self) -> dict:
        """The speculative flags as SGLang reports them (null when off), and where the simulated engine's
        acceptance came from."""
        sd = self.speculative
        if sd is None:
            return {"speculative_algorithm": None}
        p = sd.params
        return {"speculative_algorithm": p.asked, "speculative_draft_model_path": p.draft_model_path,
                "speculative_num_steps": p.num_steps, "speculative_eagle_topk": p.topk,
                "speculative_num_draft_tokens": p.num_draft_tokens,
                "sim_spec_acceptance": sd.acceptance.source,
                "sim_spec_expected_accept_length": round(sd.expected_accept_length, 4)}

    def server_info(self) -> dict:
        a = self.args
        s0 = self.stages[0]
        info = {
            "model_path": a.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "skip_tokenizer_init": a.skip_tokenizer_init,
            "load_format": a.load_format,
            "trust_remote_code": a.trust_remote_code,
            "context_length": a.context_length,
            "dtype": a.dtype,
            "kv_cache_dtype": a.kv_cache_dtype,
            "enable_mixed_chunk": a.enable_mixed_chunk,
            "tp_size": self.tp,
            "pp_size": self.pp,
            "ep_size": self.ep,
            "dp_size": self.dp,
            "moe_a2a_backend": a.moe_a2a_backend,
            "attn_dp_size": self.attn_dp,
            "enable_dp_attention": self.attn_dp > 1,
            "load_balance_method": a.load_balance_method,
            "deepep_mode": a.deepep_mode,
            "enable_eplb": a.enable_eplb,
            "ep_num_redundant_experts": a.ep_num_redundant_experts,
            "enable_dp_lm_head": a.enable_dp_lm_head,
            "moe_dense_tp_size": a.moe_dense_tp_size,
            "pp_async_batch_depth": self.depth,
            # as SGLang 0.5.23 reports them: the raw inputs at the top level (null unless set), the
            # values resolved at start-up in internal_states and cuda_graph_config
            "pp_max_micro_batch_size": a.pp_max_micro_batch_size,
            "max_running_requests": self.max_running_requests,
            "max_queued_requests": a.max_queued_requests,
            "max_total_tokens": a.max_total_tokens,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "schedule_policy": a.schedule_policy,
            "disable_overlap_schedule": self.disable_overlap_schedule,
            "mem_fraction_static": self.mem_fraction_static,
            "page_size": self.page_size,
            "disable_radix_cache": a.disable_radix_cache,
            "disable_cuda_graph": self.disable_cuda_graph,
            "cuda_graph_max_bs_decode": a.cuda_graph_max_bs_decode,
            "cuda_graph_config": {"decode": {"max_bs": self.cuda_graph_max_bs_decode}},
            **self.speculative_info(),
            "disaggregation_mode": a.disaggregation_mode,
            "disaggregation_transfer_backend": a.disaggregation_transfer_backend,
            "disaggregation_bootstrap_port": a.disaggregation_bootstrap_port,
            "num_reserved_decode_tokens": a.num_reserved_decode_tokens,
            "disaggregation_decode_polling_interval": a.disaggregation_decode_polling_interval,
            "attention_backend": self.attention_backend,
            "host": a.host,
            "port": a.port,
            "enable_metrics": a.enable_metrics,
            "decode_log_interval": a.decode_log_interval,
            "log_level": a.log_level,
            "random_seed": self.random_seed,
            "stream_interval": a.stream_interval,
            "scheduler_recv_interval": a.scheduler_recv_interval,
            # scheduler init info
            "status": "ready",
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.max_req_input_len,
            "context_len": self.context_len,
            "startup_time": self.startup_time,
            "version": SGLANG_COMPAT_VERSION,
            "engine": "parasweep-sim",
            "sim_version": __version__,
            "sim_hardware": self.hw.name,
            "sim_hardware_path": self.hw_path,
            "sim_time_scale": self.time_scale,
            "sim_router": self.router,
            "sim_pd_node": a.sim_pd_node,
            "sim_stage_layers": list(self.cost.stage_layers),
            "sim_stage_weight_gb": [round(s.weight_bytes / 1e9, 3) for s in self.stages],
            "sim_stage_token_capacity": [s.token_capacity for s in self.stages],
            "sim_step_costs": self.step_costs.to_dict(),
        }
        info["internal_states"] = [
            {
                "effective_max_running_requests_per_dp": self.max_running_requests,
                "pp_max_micro_batch_size": self.pp_max_micro_batch_size,
                "last_gen_throughput": 0.0,
                "memory_usage": {
                    "weight": round(s0.weight_bytes / GIB, 2),
                    "kvcache": round(s0.kv_bytes / GIB, 2),
                    "token_capacity": self.max_total_num_tokens,
                    "graph": round(s0.graph_bytes / GIB, 2),
                },
                "world_size": self.tp * self.pp,
                **({"avg_spec_accept_length": 0.0} if self.speculative is not None else {}),
            }
            for _ in range(self.schedulers)
        ]
        return info
