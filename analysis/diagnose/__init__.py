"""Diagnosis rules: each reads the trial's facts (config, the engine's resolved values, the per-point
client metrics and telemetry summaries, the cost model's step estimates) and returns findings with
evidence, a suggestion, and that suggestion as config overrides (ids are stable: users filter on them).

The rules read only engine-independent signals: GPU telemetry by the names of ``vocab/telemetry.py``
(whichever source wrote it: NVML or the simulated engine's GPU model), the per-stage scheduler series
(engine log / ``/metrics``), the client's own metrics, the resolved config and the cost model. They
never read the simulated engine's internal series, so a rule fires on SGLang exactly as it fires on the
simulator. Every evidence string names where its numbers come from.

Each rule: the signal it reads, when it fires, the source its evidence names.

==================== ====================================================== ==============================
rule                 signal: fires when                                     source in the evidence
==================== ====================================================== ==============================
client_bound         each point's ``valid``: 0 (the client's own validity   load generator
                     check)
too_few_microbatches resolved ``pp_max_micro_batch_size``, C per DP         resolved by the engine
                     replica: pp > 1, C > 1 and min(pp + async depth,
                     ceil(C/cap)) micro-batches < pp
admission_cap        resolved ``max_running_requests``: C per DP replica    resolved by the engine
                     above it
pp_bubble            ``stage_activity_mean`` at the busiest point: pp > 1   GPU telemetry (NVML, measured;
                     and < 0.6 (critical below 0.3)                         or simulated)
pp_stage_imbalance   ``stageK_activity_mean`` at the busiest point: pp > 1  GPU telemetry
                     and (max - min) / max > 0.15
cuda_graph_off       resolved ``disable_cuda_graph``,                       resolved by the engine; the
                     ``cuda_graph_max_bs_decode`` or ``cuda_graph_max_bs``: batch: cost model
                     graphs off, or the decode batch at the busiest point
                     above the largest captured size
gpu_underused        ``gpu_power_frac_mean`` at the busiest point: below    GPU telemetry
                     idle + 0.25 x (1 - idle), as fractions of the power
                     limit
kv_capacity          ``kv_token_usage_max`` >= 0.95, or ``retracted_reqs``  engine log / metrics; TTFT
                     > 0, or KV-bound admission: requests wait while the    split: the engine's per-request
                     running ones sit below the concurrency and both caps   queue time, else Little's law
                     and the pool (used + reserved, ``max_total_num_tokens``
                     at the workload's lengths) has no room for another
                     (see :func:`kv_capacity`; SGLang's: vLLM reserves
                     nothing, its preemptions are ``retracted_reqs``)
tp_comm_bound        cost model ``comm_s / step_s`` and ``memory_bound_s``, cost model estimate; ITL: load
                     measured ``itl_p50_ms``: tp > 1 and (PCIe and comm     generator
                     share >= 0.3 at the busiest point, or anywhere ITL p50
                     > 2 x the memory-bound step with share >= 0.15)
prefill_interference ``itl_p99_ms`` >= 3 x ``itl_p50_ms`` (and +10 ms)      load generator; engine log
                     where logged prefill batches average >= 256 prompt
                     tokens, a quarter or more beside decoding requests
ttft_queueing        the TTFT split: queueing >= half of the TTFT (and      the engine's per-request queue
                     >= 100 ms), for the median request too (and over 2     time, else Little's law over
                     decode steps), with no KV limit, admission cap or      the engine log / metrics
                     uneven DP dealing to explain it
prefix_cache_thrash  ``cache_hit_rate`` < 0.8 x ``offered_hit_rate`` (and   the engine's per-request cached
                     10 points below it) where the prompts offered >= 20 %  tokens, else its log; the
                     (not with DP behind round-robin: the split rule)       prompts the client sent
prefix_cache_split   dp > 1 behind round-robin, offered >= 20 % and the     the same
                     hit rate >= 5 points below it
speculation_would_pay spec off, pp = 1, a draft for the model, and at the    cost model estimate
                     least loaded point < 8 requests per replica with a step
                     within 2x its memory-bound floor
speculation_costs    spec on, and at the busiest point the cost model's     cost model estimate; accept
                     verify >= 1.5 plain steps (one draft step already:     length: engine log / metrics
                     offers none)
pd_prefill_bound     disaggregated: queueing for a prefill server >= half    the decode servers' per-request
                     the TTFT (and 50 ms)                                   TTFT parts; role GPU busy share
pd_decode_bound      disaggregated: decode GPUs >= 90 % busy, prefill       the same
                     GPUs < 50 %, prompts not queueing
pd_transfer_bound    disaggregated: KV transfer >= a quarter of the TTFT    the same; KV moved per GPU
                     (and 50 ms); no change predicted (the path)
pd_decode_kv_pressure disaggregated: waiting for the decode pre-allocation  the same
                     >= a quarter of the TTFT (and 50 ms)
expert_imbalance     experts over an EP group without EPLB: the cost        cost model estimate
                     model's decode step >= 10 % longer than with every
                     EP rank given an even share of the routed experts
prefill_starved      vLLM: the running requests' decode tokens take >= a     engine metrics; budget:
                     fifth of the step's token budget, a prompt then needs  resolved by the engine; TTFT
                     >= 2 steps, one more than the whole budget would       split as kv_capacity's
                     take, and queueing is >= half the TTFT (and 100 ms)
dp_dispatch_imbalance several schedulers (attention-DP ranks, DP replicas    engine log / metrics, per
                     in the engine) dealt requests round-robin: one rank's  rank (``dp_rank``, ``DP<r>``)
                     mean queue >= 1 request longer than another's while
                     the least busy ran below 0.9 of its cap or share
==================== ====================================================== ==============================

Findings carry a ``goal``: ``throughput`` for most, ``itl_p99_ms`` for prefill_interference and
``ttft_p99_ms`` for ttft_queueing and prefill_starved; the advice check judges each suggested change on it.

Rules on GPU telemetry stay quiet when the trial had none (``gpu_source="none"``) or a summary is
missing. "Busiest" is the highest-concurrency closed-loop point whose client check passed (an invalid
point's numbers describe the client, not the server).

The rules live by what they look at: ``engine`` (the client, the GPUs, the engine's settings),
``pipeline``, ``kv_pool``, ``latency``, ``token_budget`` (vLLM's), ``prefix_cache``, ``speculation``,
``disaggregation``, ``data_parallel``, ``experts``; ``facts``
is what they read
and ``evidence`` what they share.
"""

from __future__ import annotations

from collections.abc import Callable

from analysis.diagnose.data_parallel import dp_dispatch_imbalance
from analysis.diagnose.disaggregation import (
    pd_decode_bound,
    pd_decode_kv_pressure,
    pd_prefill_bound,
    pd_transfer_bound,
)
from analysis.diagnose.engine import client_bound, cuda_graph_off, gpu_underused, tp_comm_bound
from analysis.diagnose.evidence import ENV_PREFIX, EXTRA_ARGS_PREFIX, overrides_text
from analysis.diagnose.experts import expert_imbalance
from analysis.diagnose.facts import COST_MODEL, INTERCONNECTS, RESOLVED, StepEstimate, TrialFacts
from analysis.diagnose.kv_pool import kv_capacity
from analysis.diagnose.latency import prefill_interference, ttft_queueing
from analysis.diagnose.pipeline import admission_cap, pp_bubble, pp_stage_imbalance, too_few_microbatches
from analysis.diagnose.prefix_cache import prefix_cache_split, prefix_cache_thrash
from analysis.diagnose.speculation import speculation_costs, speculation_would_pay
from analysis.diagnose.token_budget import prefill_starved
from vocab.findings import SEVERITIES, Finding

__all__ = [
    "COST_MODEL", "ENV_PREFIX", "EXTRA_ARGS_PREFIX", "INTERCONNECTS", "RESOLVED", "RULES",
    "StepEstimate", "TrialFacts", "diagnose", "overrides_text",
]

RULES: list[Callable[[TrialFacts], list[Finding]]] = [
    client_bound, too_few_microbatches, admission_cap, pp_bubble, pp_stage_imbalance, cuda_graph_off,
    gpu_underused, kv_capacity, tp_comm_bound, prefill_interference, ttft_queueing, prefix_cache_thrash,
    prefix_cache_split, speculation_would_pay, speculation_costs, pd_prefill_bound, pd_decode_bound,
    pd_transfer_bound, pd_decode_kv_pressure, dp_dispatch_imbalance, expert_imbalance, prefill_starved,
]


def diagnose(facts: TrialFacts) -> list[Finding]:
    findings = [finding for rule in RULES for finding in rule(facts)]
    return sorted(findings, key=lambda x: -SEVERITIES.index(x.severity))
