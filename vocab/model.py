"""The one reader of a model's Hugging Face ``config.json``.

Multimodal and wrapper configs keep the language model's numbers under ``text_config``; both the
validator (layers, heads, experts, context) and the simulator's cost model (every architecture number)
read that section through :func:`language_config`, so they always agree on what the model is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What SGLang assumes when config.json names no context length (none of the keys below).
DEFAULT_CONTEXT_LENGTH = 2048
# SGLang reserves KV for at most this many of a request's decode tokens when it admits it (its
# CLIP_MAX_NEW_TOKENS): the simulated engine's admission and the diagnosis's KV-pool arithmetic agree
CLIP_MAX_NEW_TOKENS = 4096
# disaggregation: SGLang's --num-reserved-decode-tokens default (the KV a decode server keeps per request it
# holds), and how the router pairs a prefill and a decode server (the policies parasweep runs it with)
DEFAULT_RESERVED_DECODE_TOKENS = 512
PD_POLICIES = ("round_robin", "random")
# SGLang's --schedule-policy values that start an engine (0.5.9-0.5.23; hrrn from 0.5.20,
# shortest-prefill-first from 0.5.22), all modelled by the simulated engine. "priority" is not one: SGLang
# accepts it on the command line and fails at start-up ("Unknown schedule_policy").
# how requests are spread over data-parallel replicas or attention-DP ranks: SGLang's DP controller in
# turn or to the one holding the fewest requests (its --load-balance-method total_requests), or the
# sglang-router package's cache-aware policy (a replica that already holds the prompt's prefix)
DP_ROUTERS = ("round_robin", "total_requests", "cache_aware")
# what runs that policy: "engine" inside the engine (SGLang's DP controller, the simulated engine's
# model), "smg" the router package (sglang-router's successor) as its own process in front of one
# server per replica, "auto" the engine where it has the policy, else the router
DP_ROUTER_IMPLS = ("auto", "engine", "smg")
# the router package parasweep launches (pinned: its flags and metric names change between releases)
ROUTER_PACKAGE = "smg==1.13.0"
# vLLM's router in PD mode (vllm-project/router): a disaggregated vLLM deployment's front
VLLM_ROUTER_PACKAGE = "vllm-router==0.1.17"
# each engine parasweep launches, as its project spells it (in tables, notes and findings)
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "routing-key", "hrrn",
                     "shortest-prefill-first")
CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "max_seq_len",
                "model_max_length")


class ModelConfigError(ValueError):
    """``config.json`` is missing, unreadable, or describes a model we cannot size."""


def read_config_json(directory: Path) -> dict[str, Any]:
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ModelConfigError(f"no config.json in {directory}")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{config_file} is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{config_file}: expected a JSON object")
    return raw


def language_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's section of a config (``text_config`` where there is one, merged over the
    top level so fields such as ``architectures`` and ``quantization_config`` stay visible)."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return raw
    return {**{k: v for k, v in raw.items() if k != "text_config"}, **text}


def context_length(cfg: dict[str, Any]) -> int:
    for key in CONTEXT_KEYS:
        if cfg.get(key):
            return int(cfg[key])
    return DEFAULT_CONTEXT_LENGTH


@dataclass(frozen=True)
class ModelInfo:
    """The facts validation and load planning need."""

    path: Path
    num_layers: int
    num_experts: int  # routed experts per MoE layer; 0 for a dense model
    vocab_size: int
    max_context: int
    num_heads: int  # attention heads (0 when the config does not say)
    model_type: str = ""  # config.json's model_type (its language model's): picks a tokenizer
    # multi-head latent attention (DeepSeek-style, ``kv_lora_rank``): one latent vector a token a layer,
    # the same on every GPU of a TP group
    latent_kv: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def num_routed_experts(cfg: dict[str, Any]) -> int:
    return int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0)


def mtp_layers(cfg: dict[str, Any]) -> int:
    """The next-token prediction layers the checkpoint carries (``num_nextn_predict_layers``; DeepSeek-V3:
    one), which a model's own speculation (MTP) drafts with."""
    return int(cfg.get("num_nextn_predict_layers") or 0)


def read_model_info(directory: Path) -> ModelInfo:
    raw = read_config_json(directory)
    cfg = language_config(raw)
    return ModelInfo(
        path=directory,
        num_layers=int(cfg.get("num_hidden_layers", 0)),
        num_experts=num_routed_experts(cfg),
        vocab_size=int(cfg.get("vocab_size", 32000)),
        max_context=context_length(cfg),
        num_heads=int(cfg.get("num_attention_heads", 0) or 0),
        model_type=str(cfg.get("model_type") or raw.get("model_type") or ""),
        latent_kv=cfg.get("kv_lora_rank") is not None,
    )
