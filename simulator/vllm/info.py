"""What the simulated engine playing vLLM says it is at ``/parasweep_sim/info``: the release it plays and
the values its flags resolved to (vLLM's words), read by parasweep as a live vLLM's start-up lines are.
The same dict stands for a prediction's resolved values, so a trial in virtual time reads as a live one."""

from __future__ import annotations

from typing import Any

from simulator import __version__
from simulator.sim_config import SimConfig


def played_info(cfg: SimConfig) -> dict[str, Any]:
    a = cfg.args
    return {
        "engine": "parasweep-sim",
        "sim_version": __version__,
        "plays": "vllm",
        "version": a.vllm_release,
        "sim_hardware": cfg.hw.name,
        "sim_step_costs": cfg.step_costs.to_dict(),
        "max_num_seqs": cfg.max_running_requests,
        "max_num_batched_tokens": cfg.chunked_prefill_size,
        "block_size": cfg.page_size,
        "async_scheduling": bool(a.async_scheduling),
        "kv_cache_tokens": cfg.max_total_num_tokens,
        "gpu_memory_utilization": a.gpu_memory_utilization,
        "enable_prefix_caching": cfg.radix_cache,
        "enforce_eager": a.vllm_cudagraph_mode == "NONE",
        "cudagraph_mode": a.vllm_cudagraph_mode,
        "max_model_len": cfg.context_len,
        **cfg.speculative_info(),
    }
