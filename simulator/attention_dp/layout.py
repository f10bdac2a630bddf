"""The attention-DP layout of one engine and what it does to each GPU's memory.

With ``D`` attention-DP ranks in a TP group of ``T`` GPUs, each rank's attention runs on ``T / D`` GPUs
(its attention TP). What SGLang then keeps on every GPU, beside a plain TP layout's shards:

- the attention blocks' weights sharded over the rank's ``T / D`` GPUs only (replicated across ranks);
- the token embedding whole (SGLang builds it without TP when attention DP is on);
- the LM head over the rank's GPUs with ``--enable-dp-lm-head``, else over all ``T``;
- the dense MLPs and shared experts over all ``T`` (``--moe-dense-tp-size`` unset or ``T``), the routed
  experts over the EP group as before, plus ``--ep-num-redundant-experts`` extra copies spread over it;
- the KV cache of the rank's own requests: MLA's latent (one vector a token a layer, the same on each
  of the rank's GPUs) or GQA's heads split over the rank's GPUs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from simulator.model_spec import ModelSpec

DEEPEP_MODES = ("auto", "normal", "low_latency")
# SGLang's DP controller (--load-balance-method): auto is round_robin outside a disaggregated prefill
LOAD_BALANCE_METHODS = ("auto", "round_robin", "total_requests", "total_tokens", "follow_bootstrap_room")


@dataclass(frozen=True)
class AttentionDP:
    ranks: int  # --attn-dp-size
    tp: int  # the TP group the ranks split
    a2a: str = "none"  # --moe-a2a-backend
    deepep_mode: str = "auto"  # --deepep-mode: auto = normal for prefill batches, low_latency for decode
    eplb: bool = False  # --enable-eplb
    redundant_experts: int = 0  # --ep-num-redundant-experts
    dp_lm_head: bool = False  # --enable-dp-lm-head

    @property
    def attn_tp(self) -> int:
        """GPUs of one rank's attention."""
        return self.tp // self.ranks

    def a2a_mode(self, decode: bool) -> str:
        """DeepEP's mode for a batch: its low-latency kernels for decode, normal ones for prefill (auto)."""
        if self.deepep_mode != "auto":
            return self.deepep_mode
        return "low_latency" if decode else "normal"


def extra_weight_bytes(spec: ModelSpec, layout: AttentionDP, moe_layers: int) -> float:
    """Bytes each GPU holds beyond a plain TP layout of ``layout.tp`` (one stage: attention DP is
    not modelled with PP): attention weights of all the model's layers replicated across ranks, the
    embedding whole, the LM head over the rank's GPUs where asked, and the redundant experts' copies."""
    t, a = layout.tp, layout.attn_tp
    attn = spec.num_layers * spec.attn_params * spec.attn_bytes_per_param
    embed = spec.embed_params * spec.embed_bytes_per_param
    out = attn * (1 / a - 1 / t) + embed * (1 - 1 / t)
    if layout.dp_lm_head:
        out += spec.lm_head_params * spec.lm_head_bytes_per_param * (1 / a - 1 / t)
    out += moe_layers * layout.redundant_experts * spec.expert_bytes / t
    return out


class AttentionDPError(ValueError):
    """The attention-DP flags describe what SGLang refuses, or what the simulated engine does not model;
    the message is one line (SGLang's own where it refuses)."""


NOT_MODELLED = "is not modelled by the simulated engine with attention DP"


def resolve_attention_dp(args: argparse.Namespace, tp: int, dp: int, pp: int
                         ) -> tuple[AttentionDP | None, int, list[str]]:
    """SGLang 0.5.23's reading of the attention-DP flags: the layout (None without attention DP), the
    replica count ``dp`` after the rewrite of the deprecated ``--enable-dp-attention`` (``--dp-size N``
    then counts attention-DP ranks), and the warnings it prints. Raises :class:`AttentionDPError`."""
    def get(name: str) -> Any:
        return getattr(args, name)

    ranks, warnings = int(get("attn_dp_size")), []
    if get("enable_dp_attention"):
        warnings.append("--enable-dp-attention is deprecated; use --attn-dp-size instead "
                        f"(rewritten to --attn-dp-size {dp} --dp-size 1)")
        ranks, dp = (dp, 1) if ranks == 1 else (ranks, dp)
    if ranks < 1:
        raise AttentionDPError(f"--attn-dp-size must be positive (got {ranks}).")
    if ranks > 1 and dp > 1:
        raise AttentionDPError(f"--dp-size {dp} with --attn-dp-size {ranks}: data-parallel replicas combined "
                               "with attention data parallelism are not supported.")
    if tp % ranks:
        raise AttentionDPError(f"Invalid attention topology: tp_size={tp}, attn_dp_size={ranks}, "
                               "attn_cp_size=1.")
    dense = get("moe_dense_tp_size")
    if dense not in (None, 1, tp):
        raise AttentionDPError("moe_dense_tp_size only supports None, 1, or tp_size currently")
    if get("enable_dp_lm_head") and ranks == 1:
        raise AttentionDPError("Please enable dp attention when setting enable_dp_lm_head.")
    if get("enable_two_batch_overlap"):
        raise AttentionDPError("--enable-two-batch-overlap is not modelled by the simulated engine")
    if get("ep_num_redundant_experts") < 0:
        raise AttentionDPError("--ep-num-redundant-experts must be >= 0, "
                               f"got {get('ep_num_redundant_experts')}")
    method = get("load_balance_method")
    if method in ("total_tokens", "follow_bootstrap_room"):
        raise AttentionDPError(f"--load-balance-method {method} is not modelled by the simulated engine "
                               "(modelled: auto, round_robin, total_requests)")
    a2a = get("moe_a2a_backend")
    if a2a not in ("none", "deepep"):
        raise AttentionDPError(f"--moe-a2a-backend {a2a} is not modelled by the simulated engine "
                               "(modelled: none, deepep)")
    if ranks == 1:
        return None, dp, warnings
    for flag, on in (("pipeline parallelism (--pp-size > 1)", pp > 1),
                     ("speculative decoding", get("speculative_algorithm") is not None),
                     ("--moe-dense-tp-size 1", dense == 1 and tp > 1)):
        if on:
            raise AttentionDPError(f"{flag} {NOT_MODELLED}")
    return AttentionDP(ranks=ranks, tp=tp, a2a=a2a, deepep_mode=get("deepep_mode"), eplb=get("enable_eplb"),
                       redundant_experts=get("ep_num_redundant_experts"),
                       dp_lm_head=get("enable_dp_lm_head")), dp, warnings
