"""What the diagnosis rules look at: a trial's facts (``TrialFacts``) and the cost model's decode step at a
point (``StepEstimate``), with the words their evidence names sources by."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vocab.telemetry import (
    GpuSource,
)

INTERCONNECTS = ("pcie", "nvlink")
COST_MODEL = "cost model estimate"
RESOLVED = "resolved by the engine"


@dataclass
class StepEstimate:
    """The cost model's view of one decode step at a point (filled by the orchestrator from the
    simulator's cost model)."""

    batch: int            # requests per micro-batch at that point
    step_s: float         # one decode forward through every stage (the ring trip / the step for pp=1)
    comm_s: float         # of which TP/EP collectives
    memory_bound_s: float  # the same step if it only read weights + KV at full memory bandwidth (its floor)
    # speculative decoding on: one draft-verify-extend iteration, its verify, and the tokens the model
    # expects per request per iteration (all 0.0 when off)
    spec_step_s: float = 0.0
    verify_s: float = 0.0
    spec_tokens: float = 0.0
    # experts spread over an EP group without EPLB: the same step with every EP rank given an even share
    # of the routed tokens (0.0 otherwise)
    balanced_step_s: float = 0.0


@dataclass
class TrialFacts:
    """What the rules look at. ``points`` maps a load-point label to its metrics (client metrics and
    the ``analysis.telemetry.point_telemetry`` summaries)."""

    pp_size: int
    async_depth: int
    resolved: Mapping[str, Any]
    points: Mapping[str, Mapping[str, float]]   # label -> client metrics + point_telemetry summaries
    concurrency: Mapping[str, int]              # label -> concurrency, closed-loop points only
    idle_power_w: float = 0.0
    power_limit_w: float = 0.0
    tp_size: int = 1
    dp_size: int = 1
    attn_dp: int = 1                            # attention-DP ranks inside the TP group (dp.attention)
    latent_kv: bool = False                     # the model caches MLA's latent (the same on every TP rank)
    moe: bool = False                           # the model has routed experts
    interconnect: str = "nvlink"                # hardware profile: "pcie" | "nvlink"
    gpu_source: str = "none"                    # vocab.telemetry.GpuSource value: named in evidence
    engine: str = ""                            # the engine tag: "sim", "sim-predict", "sglang"
    plays: str = "sglang"                       # whose scheduler, flags and words: "sglang" or "vllm"
    steps: Mapping[str, StepEstimate] = field(default_factory=dict)   # label -> estimate
    stage_layers: Sequence[int] = ()            # layers per PP stage as the engine split them
    input_len: float = 0.0                      # the workload's mean prompt length (tokens; 0: unknown)
    output_len: float = 0.0                     # the workload's mean output length (tokens; 0: unknown)
    dp_router: str = "round_robin"              # how requests are spread over DP replicas (dp.router)
    spec_algorithm: str = "none"                # spec.algorithm of the trial
    # drafts the model could speculate with (spec.algorithm -> the acceptance a prediction would assume)
    spec_drafts: Mapping[str, str] = field(default_factory=dict)
    # a disaggregated deployment: prefill_workers, decode_workers, prefill_gpus, decode_gpus (per server),
    # reserved_decode_tokens (0: the engine's); None for a trial that serves aggregated
    pd: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(f"interconnect must be one of {', '.join(INTERCONNECTS)}, "
                             f"got {self.interconnect!r}")
        valid = [s.value for s in GpuSource]
        if self.gpu_source not in valid:
            raise ValueError(f"gpu_source must be one of {', '.join(valid)}, got {self.gpu_source!r}")
