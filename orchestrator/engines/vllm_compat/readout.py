"""How a running vLLM server is read (the real one, or the simulated engine playing it): readiness is
``/health`` then ``/v1/models``; what it is from ``/version`` and ``/v1/models`` (vLLM has no
``/server_info`` outside its development mode), with the simulated engine's own ``/parasweep_sim/info``
where it answers; the resolved values from its start-up lines; the prefix cache emptied with
``POST /reset_prefix_cache``, a development endpoint (``VLLM_SERVER_DEV_MODE=1``, which parasweep
sets); the scheduler series from its periodic stats line and ``vllm:`` gauges."""

from __future__ import annotations

import contextlib
import urllib.error
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.gpus import SIM_INFO_PATH

if TYPE_CHECKING:
    import pandas as pd

# vLLM's own words for what parasweep names as SGLang does (resolved.* keys)
_RESOLVED_FROM_INFO = {
    "max_num_seqs": "max_running_requests",
    "max_num_batched_tokens": "chunked_prefill_size",
    "block_size": "page_size",
    "kv_cache_tokens": "max_total_num_tokens",
    "async_scheduling": "async_scheduling",
    "gpu_memory_utilization": "mem_fraction_static",
    "max_model_len": "context_len",
    # the simulated engine's speculation as resolved (a live vLLM's is read from its configuration line)
    "speculative_num_steps": "speculative_num_steps",
    "speculative_eagle_topk": "speculative_eagle_topk",
    "speculative_num_draft_tokens": "speculative_num_draft_tokens",
    "sim_spec_acceptance": "sim_spec_acceptance",
    "sim_spec_expected_accept_length": "sim_spec_expected_accept_length",
}


class VLLMReadout:
    """The reading side of an engine adapter, for vLLM (mixed into ``VLLMEngine`` and ``SimVLLMEngine``).
    Its readers are imported where used, as the SGLang adapter's: a config check loads this class, and
    the log parsers would load pandas (a quarter second) into every command line's start."""

    batch_log = False  # a stats line every 10 s: /metrics' gauges are the scheduler series

    def launch_env(self) -> dict[str, str]:
        # the development endpoints (/reset_prefix_cache), and log lines without colour codes
        return {"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1"}

    def server_info(self, url: str) -> dict[str, Any]:
        from orchestrator.process.server import http_get_json

        info: dict[str, Any] = {"engine": "vllm", "version": http_get_json(url + "/version").get("version")}
        models = http_get_json(url + "/v1/models").get("data") or [{}]
        info["served_model_name"] = models[0].get("id")
        info["context_len"] = models[0].get("max_model_len")
        with contextlib.suppress(urllib.error.HTTPError):  # the simulated engine: what it is, its clock
            info.update(http_get_json(url + SIM_INFO_PATH))
        return info

    def resolved(self, info: dict[str, Any], log_text: str) -> dict[str, Any]:
        from orchestrator.telemetry.vllm_log import resolved_from_vllm_log

        resolved = resolved_from_vllm_log(log_text.splitlines())
        for key, name in _RESOLVED_FROM_INFO.items():
            if info.get(key) is not None:
                resolved[name] = info[key]
        return resolved

    def flush_cache(self, url: str) -> bool:
        from orchestrator.process.server import flush_prefix_cache

        return flush_prefix_cache(url, path="/reset_prefix_cache")

    def log_frame(self, path: Path) -> pd.DataFrame:
        from orchestrator.telemetry.vllm_log import vllm_log_frame

        return vllm_log_frame(path)
