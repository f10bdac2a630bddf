"""Telemetry vocabulary: the series every GPU source writes, the per-stage scheduler series, where each
GPU sits in the engine's layout, and the names of the per-point summaries the diagnosis reads.

Three sources feed the same series (``GpuSource``): ``nvml`` (the trial's physical GPUs, read with
nvidia-ml-py), ``simulated`` (the simulated engine's model of its GPUs), ``none`` (no NVML on this
node: no driver, no GPU, no permission). Trial code and the diagnosis read the series by these names
and never ask which source wrote them; the source is only *named* wherever a person reads numbers
(tags, plot titles, finding evidence, the run description).

One row per GPU per sample. ``ts`` is epoch seconds on the load generator's clock
(:func:`workloads.clock.now` semantics: wall-clock base plus a monotonic delta), so a sample and a
request record can be compared directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class GpuSource(StrEnum):
    NVML = "nvml"
    SIMULATED = "simulated"
    NONE = "none"

    def describe(self) -> str:
        """How a person should read numbers from this source (plot titles, evidence)."""
        return {GpuSource.NVML: "NVML, measured",
                GpuSource.SIMULATED: "simulated GPU telemetry, not measured",
                GpuSource.NONE: "no GPU telemetry"}[self]


# The per-GPU sample columns, in order. Units are in the names; a value a source cannot read is NaN.
GPU_COLUMNS: tuple[str, ...] = (
    "ts",                # epoch seconds, the load generator's clock
    "gpu",               # the GPU's position among the trial's GPUs (0..n-1): the engine's gpu id
    "uuid",              # NVML UUID ("GPU-…"), or "sim-<gpu>" for a simulated GPU
    "power_w",           # board power draw
    "power_limit_w",     # enforced power limit
    "util_gpu_pct",      # % of the last sample period a kernel was running (not SM occupancy)
    "util_mem_pct",      # % of the last sample period device memory was read or written
    "sm_clock_mhz",
    "mem_used_bytes",
    "mem_total_bytes",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
    "temp_c",
    "throttle_reasons",  # NVML clocks-event-reason bitmask (0: none); idle and app-clock bits removed
    "energy_j",          # the GPU's total-energy counter (J since the driver loaded / engine start)
)

# The per-stage scheduler series (``telemetry/stage_series.parquet``): one row per report of one
# pipeline stage (and TP rank), from the engine's batch log lines (``source="log"``) and its
# ``/metrics`` gauges (``source="metrics"``), joined on the same clock as the GPU samples. Under PP,
# ``running`` is the micro-batch the stage just ran, not the whole server; ``token_usage`` is pool-wide.
STAGE_COLUMNS: tuple[str, ...] = (
    "ts", "source", "kind", "dp", "pp", "tp",
    "running",            # running requests of the batch the stage reported
    "queue",              # requests waiting for admission
    "token_usage",        # KV pool usage, 0..1
    "gen_throughput",     # the engine's own tokens/s estimate
    "retracted_total",    # requests retracted so far because the KV pool ran full (NaN: not reported)
    "new_tokens",         # prompt tokens the batch prefilled (prefill lines only; NaN otherwise)
    "cached_tokens",      # prompt tokens of the batch's new requests found in the prefix cache (the same)
    "accept_len",         # speculative decoding: tokens per request per verify over the interval (NaN: off)
)

# Clocks-event-reason bits that are not throttling: GPU idle (1) and application-clock setting (2),
# and the display-clock setting (256). Sources clear them before writing ``throttle_reasons``.
NOT_THROTTLING_BITS = 0x1 | 0x2 | 0x100


@dataclass(frozen=True)
class GpuPlace:
    """Where one of the trial's GPUs sits in the engine's layout."""

    gpu: int
    dp: int
    pp: int
    tp: int


def engine_layout(tp: int, pp: int, dp: int = 1) -> list[GpuPlace]:
    """The GPU of each (dp, pp, tp) rank, as SGLang places them on one node: replica r starts at
    r*tp*pp, and within a replica ``gpu = pp_rank*tp + tp_rank`` (the simulated engine uses the same)."""
    return [GpuPlace(r * tp * pp + s * tp + t, r, s, t)
            for r in range(dp) for s in range(pp) for t in range(tp)]


# Per-point summary metric names (``<point>/<name>`` in MLflow). Power fractions are of the enforced
# limit; "activity" is power above idle as a fraction of the idle-to-limit range, per GPU, then
# averaged over the GPUs of each pipeline stage. Power is used rather than utilisation because NVML's
# utilisation counts a kernel spin-waiting on a peer (a stage blocked in a receive shows 100 %).
POWER_FRAC_MEAN = "gpu_power_frac_mean"        # mean over GPUs of each GPU's mean power / limit
POWER_FRAC_PEAK = "gpu_power_frac_peak"        # highest single sample / limit, any GPU
POWER_FRAC_MIN_GPU = "gpu_power_frac_min_gpu"  # lowest per-GPU mean
POWER_FRAC_MAX_GPU = "gpu_power_frac_max_gpu"  # highest per-GPU mean
UTIL_MEAN = "gpu_util_mean_pct"
MEM_USED_MAX = "gpu_mem_used_gib_max"          # highest memory used on any GPU
ENERGY_J = "energy_j"                          # all the trial's GPUs, from the energy counters
J_PER_TOKEN = "j_per_output_token"
THROTTLED_S = "gpu_throttled_s"                # longest time any one GPU was throttled in the window
STAGE_ACTIVITY_MEAN = "stage_activity_mean"
STAGE_ACTIVITY_MIN = "stage_activity_min"
STAGE_ACTIVITY_MAX = "stage_activity_max"
KV_USAGE_MAX = "kv_token_usage_max"            # KV pool usage (0..1), highest reported
RETRACTED = "retracted_reqs"                   # requests retracted (KV pool full) in the window
# disaggregation: each role's mean GPU utilisation, the KV a request moved (MB per GPU), and the mean of
# each part of the TTFT (pd_ttft_part: bootstrap, prefill_queue, prefill, transfer, decode_first)
PD_PREFILL_UTIL = "pd_prefill_util_pct"
PD_DECODE_UTIL = "pd_decode_util_pct"
PD_TRANSFER_MB = "pd_transfer_mb_per_gpu"
QUEUE_GROWTH = "queue_growth_req_s"            # slope of the waiting queue over the window
RUNNING_MEAN = "running_reqs_mean"             # mean over stages of each stage's mean running requests
QUEUE_MEAN = "queue_reqs_mean"                 # mean waiting requests, each DP replica read once, summed
PREFILL_TOKENS_MAX = "prefill_batch_tokens_max"    # most prompt tokens one logged prefill batch computed
PREFILL_TOKENS_MEAN = "prefill_batch_tokens_mean"  # mean prompt tokens per logged prefill batch
# share of logged prefill batches that ran while requests were decoding (#running-req > 0): their
# decodes waited for the prefill, or rode along in it (mixed chunk)
PREFILL_WITH_DECODES = "prefill_batches_with_decodes_frac"
# the prefix cache as the engine log's prefill lines report it over the window (#cached-token against
# #new-token): for servers that do not report it per request (the OpenAI APIs without a cache report)
LOG_CACHED_TOKENS = "log_cached_tokens"
LOG_COMPUTED_TOKENS = "log_computed_tokens"
LOG_CACHE_HIT_RATE = "log_cache_hit_rate"
# several schedulers in one engine (attention-DP ranks, or DP replicas behind its own controller): each
# one's mean running and waiting requests (``per_replica(r, RANK_RUNNING)``...), its highest KV use, and
# how far apart they are: the busiest rank's mean running over the ranks' mean (1: even), and the mean
# waiting requests of the rank that queued most against the least
RANK_RUNNING = "running_mean"
RANK_QUEUE = "queue_mean"
RANK_KV_USAGE = "kv_token_usage_max"
RANK_RUNNING_IMBALANCE = "dp_running_imbalance"
RANK_QUEUE_SPREAD = "dp_queue_spread"
# attention DP, from SGLang's balance series (analysis/dp_balance.py): the share of the forwards' token
# slots lost to imbalance, of the ranks' forwards run idle, the busiest over the mean, the sync wait
DP_IMBALANCE_FRAC = "dp_attention_imbalance_frac"
DP_IDLE_STEPS_FRAC = "dp_attention_idle_steps_frac"
DP_IMBALANCE_RATIO_MEAN = "dp_attention_imbalance_ratio_mean"
DP_SYNC_WAIT_MS = "dp_attention_sync_wait_ms_mean"
# speculative decoding: tokens each verify emitted per request, the target's own included (SGLang's
# "accept len"), over the window's decode lines (or gauges) of stage 0
SPEC_ACCEPT_LEN = "spec_accept_len_mean"


def per_gpu(gpu: int, name: str) -> str:
    """``gpu3_power_frac_mean``: a per-GPU summary's metric name."""
    return f"gpu{gpu}_{name}"


def per_replica(rank: int, name: str) -> str:
    """``dp1_requests``, ``dp1_cache_hit_rate``: a DP replica's summary behind the router package."""
    return f"dp{rank}_{name}"


def per_stage(stage: int, name: str) -> str:
    """``stage2_activity_mean``, ``stage2_running_mean``, ``stage2_queue_mean``."""
    return f"stage{stage}_{name}"


def pd_ttft_part(part: str) -> str:
    """The metric of one part of a disaggregated request's TTFT (mean over the window, ms), from the
    requests' own accounts (the simulated engine sends them) or a prediction."""
    return f"pd_ttft_{part}_ms"


def pd_stage_part(part: str) -> str:
    """The same part from the servers' stage histograms over the window (ms): what any live deployment,
    SGLang's included, gives."""
    return f"pd_stage_{part}_ms"
