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
                     (see :func:`kv_capacity`)
tp_comm_bound        cost model ``comm_s / step_s`` and ``memory_bound_s``, cost model estimate; ITL: load
                     measured ``itl_p50_ms``: tp > 1 and (PCIe and comm     generator
                     share >= 0.3 at the busiest point, or anywhere ITL p50
                     > 2 x the memory-bound step with share >= 0.15)
prefill_interference ``itl_p99_ms`` >= 3 x ``itl_p50_ms`` (and +10 ms)      load generator; engine log
                     where logged prefill batches average >= 256 prompt
                     tokens, a quarter or more beside decoding requests
ttft_queueing        the TTFT split: queueing >= half of the TTFT (and      the engine's per-request queue
                     >= 100 ms), for the median request too, with no KV     time, else Little's law over
                     limit or admission cap to explain it                   the engine log / metrics
prefix_cache_thrash  ``cache_hit_rate`` < 0.8 x ``offered_hit_rate`` (and   the engine's per-request cached
                     10 points below it) where the prompts offered >= 20 %  tokens, else its log; the
                     (not with DP behind round-robin: the split rule)       prompts the client sent
prefix_cache_split   dp > 1 behind round-robin, offered >= 20 % and the     the same
                     hit rate >= 5 points below it
==================== ====================================================== ==============================

Findings carry a ``goal``: ``throughput`` for most, ``itl_p99_ms`` for prefill_interference and
``ttft_p99_ms`` for ttft_queueing; the advice check judges each suggested change on it.

Rules on GPU telemetry stay quiet when the trial had none (``gpu_source="none"``) or a summary is
missing. "Busiest" is the highest-concurrency closed-loop point whose client check passed (an invalid
point's numbers describe the client, not the server).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vocab.findings import SEVERITIES, Finding
from vocab.model import CLIP_MAX_NEW_TOKENS
from vocab.records import ENGINE_FAILED, STOPPED_EARLY
from vocab.telemetry import (
    KV_USAGE_MAX,
    LOG_CACHE_HIT_RATE,
    POWER_FRAC_MEAN,
    PREFILL_TOKENS_MAX,
    PREFILL_TOKENS_MEAN,
    PREFILL_WITH_DECODES,
    QUEUE_MEAN,
    RETRACTED,
    RUNNING_MEAN,
    STAGE_ACTIVITY_MAX,
    STAGE_ACTIVITY_MEAN,
    GpuSource,
    per_stage,
)
from vocab.values import float_or_none, int_or_none

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
    interconnect: str = "nvlink"                # hardware profile: "pcie" | "nvlink"
    gpu_source: str = "none"                    # vocab.telemetry.GpuSource value: named in evidence
    engine: str = ""                            # the engine tag: "sim", "sim-predict", "sglang"
    steps: Mapping[str, StepEstimate] = field(default_factory=dict)   # label -> estimate
    stage_layers: Sequence[int] = ()            # layers per PP stage as the engine split them
    input_len: float = 0.0                      # the workload's mean prompt length (tokens; 0: unknown)
    output_len: float = 0.0                     # the workload's mean output length (tokens; 0: unknown)
    dp_router: str = "round_robin"              # how requests are spread over DP replicas (dp.router)

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(f"interconnect must be one of {', '.join(INTERCONNECTS)}, "
                             f"got {self.interconnect!r}")
        valid = [s.value for s in GpuSource]
        if self.gpu_source not in valid:
            raise ValueError(f"gpu_source must be one of {', '.join(valid)}, got {self.gpu_source!r}")


# ---- helpers -------------------------------------------------------------------------------------

def _busiest(f: TrialFacts, key: str | None = None) -> str | None:
    """The highest valid closed-loop load point (that has ``key`` in its metrics, when given)."""
    labels = [label for label in f.concurrency if label in f.points
              and (key is None or float_or_none(f.points[label].get(key)) is not None)
              and f.points[label].get("valid", 1) != 0]
    return max(labels, key=lambda k: f.concurrency[k]) if labels else None


def _by_load(f: TrialFacts, labels: Sequence[str]) -> list[str]:
    """``labels`` busiest first: closed-loop points by concurrency, then the others in their order."""
    closed = sorted((x for x in labels if x in f.concurrency), key=lambda k: -f.concurrency[k])
    return closed + [x for x in labels if x not in f.concurrency]


def _per_replica(f: TrialFacts, c: int) -> int:
    """Concurrency one DP replica sees (the router spreads requests over the replicas)."""
    return math.ceil(c / max(1, f.dp_size))


def _gpu_evidence(f: TrialFacts) -> str | None:
    """"(NVML, measured)" or "(simulated GPU telemetry, not measured)"; None without GPU telemetry."""
    source = GpuSource(f.gpu_source)
    return None if source is GpuSource.NONE else f"({source.describe()})"


SIMULATED_ENGINES = ("sim", "sim-predict")


def _scheduler_evidence(f: TrialFacts) -> str:
    # the engine tag decides, whatever GPU sampling did (a sim trial with gpu_hz=0 has source "none");
    # simulated GPU telemetry only comes with the simulated engine, whose log and metrics it also wrote
    simulated = f.engine in SIMULATED_ENGINES or f.gpu_source == GpuSource.SIMULATED
    return "(simulated engine's log / metrics, not measured)" if simulated else "(engine log / metrics)"


def _value(v: Any) -> str:
    """A value as a Hydra override writes it."""
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, list | tuple):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, str) and "," in v:
        return f"'{v}'"  # quoted: a bare comma would start a sweep
    return str(v)


ENV_PREFIX = "env."  # a change key naming an environment variable of the engine, not a config key
# engine flags are not in the config schema: run.py takes them only as additions, with a leading +
EXTRA_ARGS_PREFIX = "server.extra_args."


def _override(key: str, value: Any) -> str:
    if key.startswith(ENV_PREFIX):
        return f"{key.removeprefix(ENV_PREFIX)}={value} (engine environment)"
    plus = "+" if key.startswith(EXTRA_ARGS_PREFIX) else ""
    return f"{plus}{key}={_value(value)}"


def overrides_text(change: Mapping[str, Any]) -> str:
    """``pp.micro_batch_size=4 pp.async_depth=1``: a change as the overrides a user types (an engine
    flag as ``+server.extra_args.<flag>=value``, as run.py wants it; an engine environment variable as
    ``NAME=value (engine environment)``: it is exported, not overridden)."""
    return " ".join(_override(k, v) for k, v in change.items())


def _suggest(why: str, change: Mapping[str, Any]) -> str:
    """The suggestion text: it states exactly the change the finding carries (the alternatives are
    named only if the change is predicted not to help)."""
    return why + (f" Set {overrides_text(change)}." if change else "")


def _more_load(f: TrialFacts, label: str) -> int | None:
    """Twice the point's concurrency: where the configuration is predicted for what it needs to fill
    (said apart from the fix: a user seldom chooses the traffic)."""
    c = f.concurrency.get(label)
    return 2 * c if c else None


def _some(*changes: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [c for c in changes if c]


def _micro_batches(f: TrialFacts, c: int, cap: int) -> int:
    """Micro-batches one replica fills at concurrency c under a per-slot cap."""
    return min(f.pp_size + f.async_depth, math.ceil(_per_replica(f, c) / cap))


# ---- rules ---------------------------------------------------------------------------------------

def client_bound(f: TrialFacts) -> list[Finding]:
    # a point the trial cut short (the engine died, hung or timed out) is the trial_failed finding's
    # story, not the client's
    bad = [label for label, m in f.points.items() if m.get("valid", 1) == 0
           and not str(m.get("invalid_reason") or "").startswith((STOPPED_EARLY, ENGINE_FAILED))]
    if not bad:
        return []
    reasons = "; ".join(f"{label}: {f.points[label].get('invalid_reason') or 'client fell behind'}"
                        for label in bad)
    return [Finding("client_bound", "critical", f"The load generator fell behind at {', '.join(bad)}",
                    f"valid=0 at {', '.join(bad)} (load generator's validity check: {reasons})",
                    "Do not read those points as server numbers; lower the load or give the client "
                    "its own cores.", point=_by_load(f, bad)[0])]


def too_few_microbatches(f: TrialFacts) -> list[Finding]:
    """PP decode is a closed ring: with m micro-batches in flight a stage is busy at most m/p."""
    cap = int_or_none(f.resolved.get("pp_max_micro_batch_size"))
    if f.pp_size <= 1 or not cap:
        return []
    slots = f.pp_size + f.async_depth
    worst = None
    for label, c in f.concurrency.items():
        m = _micro_batches(f, c, cap)
        if c > 1 and m < f.pp_size and (worst is None or c > worst[1]):
            worst = (label, c, m)
    if worst is None:
        return []
    label, c, m = worst
    per = _per_replica(f, c)
    idle = 1 - m / f.pp_size
    severity = "critical" if idle >= 0.5 else "warning"
    change = {"pp.micro_batch_size": max(1, math.ceil(per / f.pp_size))}
    alternatives = _some({"pp.micro_batch_size": max(1, math.ceil(per / slots))} if slots > f.pp_size
                         else None, {"pp.async_depth": f.async_depth + 1})
    replica = f" per DP replica ({f.dp_size} replicas)" if f.dp_size > 1 else ""
    fills = (f.pp_size - 1) * cap + 1  # requests one replica needs for pp micro-batches of at most cap
    return [Finding(
        "too_few_microbatches", severity,
        f"Only {m} micro-batch{'es' if m > 1 else ''} in flight for {f.pp_size} pipeline stages at {label}",
        f"pp_max_micro_batch_size={cap} ({RESOLVED}) puts all {per} requests{replica} of {label} into "
        f"{m} slot(s) of {slots}; each stage idles at least {idle:.0%} of the time; with this cap all "
        f"{f.pp_size} stages fill only at {fills:,} or more requests in flight{replica}",
        _suggest(f"Spread the {per} requests{replica} of {label} over all {f.pp_size} stages "
                 f"(micro-batch cap ceil(C/pp)).", change),
        point=label, change=change, alternatives=alternatives, more_load=_more_load(f, label))]


def admission_cap(f: TrialFacts) -> list[Finding]:
    mrr = int_or_none(f.resolved.get("max_running_requests"))
    if not mrr:
        return []
    over = {label: _per_replica(f, c) for label, c in f.concurrency.items() if _per_replica(f, c) > mrr}
    if not over:
        return []
    worst = max(over, key=lambda k: over[k])
    change = {"server.max_running_requests": over[worst]}
    replica = " per DP replica" if f.dp_size > 1 else ""
    return [Finding(
        "admission_cap", "warning",
        f"Concurrency above max_running_requests={mrr} queues at the server",
        f"{worst} offers {over[worst]} concurrent requests{replica}; the engine admits at most {mrr} "
        f"(max_running_requests {RESOLVED})",
        _suggest("Admit every offered request (KV capacity permitting), or read those points as "
                 "queueing.", change),
        point=worst, change=change)]


def pp_bubble(f: TrialFacts) -> list[Finding]:
    """Stages busy well under the whole time: too few micro-batches in flight or exposed per-step
    overhead. The change is the micro-batch cap when the resolved cap keeps the busiest point below pp
    micro-batches, else one more async slot to hide the overhead."""
    evidence = _gpu_evidence(f)
    label = _busiest(f, STAGE_ACTIVITY_MEAN) if f.pp_size > 1 and evidence else None
    if label is None:
        return []
    activity = float(f.points[label][STAGE_ACTIVITY_MEAN])
    if activity >= 0.6:
        return []
    c = f.concurrency[label]
    cap = int_or_none(f.resolved.get("pp_max_micro_batch_size"))
    if cap and _micro_batches(f, c, cap) < f.pp_size:
        change: dict[str, Any] = {"pp.micro_batch_size": max(1, math.ceil(_per_replica(f, c) / f.pp_size))}
        why = f"Fill all {f.pp_size} stages with micro-batches."
    else:
        change = {"pp.async_depth": f.async_depth + 1}
        why = "Hide the per-step overhead behind one more micro-batch in flight (check outputs against pp=1)."
    alternatives = [c for c in ({"pp.micro_batch_size": max(1, math.ceil(_per_replica(f, c) / f.pp_size))},
                                {"pp.async_depth": f.async_depth + 1}) if c != change]
    return [Finding(
        "pp_bubble", "warning" if activity >= 0.3 else "critical",
        f"Pipeline stages idle {1 - activity:.0%} of the time at {label}",
        f"mean stage activity {activity:.2f} at {label} (power above idle as a fraction of the idle-to-"
        f"limit range, averaged over each stage's GPUs) {evidence}",
        _suggest(why, change), point=label, change=change, alternatives=alternatives,
        more_load=_more_load(f, label))]


def _rebalance(layers: Sequence[int], activity: Sequence[float]) -> list[int] | None:
    """A layer split that evens the stages out, or None when none is better.

    Every decoder layer costs the same (one stack of identical layers), so the per-layer cost is read
    off the stage that spends the least per layer (it carries the least else); what a stage does beyond
    its layers at that cost (embedding, LM head and sampling) stays with it. Layers move one at a time
    from the stage predicted busiest to the one predicted least busy while the receiver stays below
    what the giver had; every stage keeps at least one layer and the total is unchanged."""
    per_layer = min(a / n for a, n in zip(activity, layers, strict=True))
    if per_layer <= 0:
        return None
    fixed = [a - per_layer * n for a, n in zip(activity, layers, strict=True)]
    split = list(layers)
    for _ in range(sum(layers) * len(layers)):
        load = [x + per_layer * n for x, n in zip(fixed, split, strict=True)]
        givers = [s for s in range(len(split)) if split[s] > 1]
        if not givers:
            break
        src = max(givers, key=lambda s: load[s])
        dst = min(range(len(split)), key=lambda s: load[s])
        if src == dst or load[dst] + per_layer >= load[src] - 1e-12:
            break
        split[src] -= 1
        split[dst] += 1
    return split if split != list(layers) else None


def pp_stage_imbalance(f: TrialFacts) -> list[Finding]:
    """One stage busier than the others paces the whole ring (often the last: it carries the LM head)."""
    evidence = _gpu_evidence(f)
    label = _busiest(f, STAGE_ACTIVITY_MAX) if f.pp_size > 1 and evidence else None
    if label is None:
        return []
    m = f.points[label]
    activity = [float_or_none(m.get(per_stage(s, "activity_mean"))) for s in range(f.pp_size)]
    known = [a for a in activity if a is not None]
    if len(known) < 2:
        return []
    low, high = min(known), max(known)
    if high <= 0 or (high - low) / high <= 0.15:
        return []
    shown = ", ".join(f"stage {s}: {a:.2f}" for s, a in enumerate(activity) if a is not None)
    change: dict[str, Any] = {}
    if len(f.stage_layers) == f.pp_size and len(known) == f.pp_size:
        split = _rebalance(list(f.stage_layers), known)
        if split:
            change = {"env.SGLANG_PP_LAYER_PARTITION": ",".join(map(str, split))}
            why = (f"Move layers off the busiest stage (now {','.join(map(str, f.stage_layers))} layers per "
                   f"stage; the last stage also runs the LM head and sampling).")
        else:
            why = (f"No whole-layer move evens the stages ({','.join(map(str, f.stage_layers))} layers per "
                   f"stage): the imbalance is not in the layers.")
    else:
        why = ("Move layers off the busiest stage with SGLANG_PP_LAYER_PARTITION; the engine's layer split "
               "is unknown here, so no partition is proposed.")
    return [Finding(
        "pp_stage_imbalance", "warning", f"Pipeline stages are unevenly loaded at {label}",
        f"stage activity ranges {low:.2f}..{high:.2f} at {label} ({shown}) {evidence}: the busiest "
        f"stage paces the ring",
        _suggest(why, change), point=label, change=change)]


def cuda_graph_off(f: TrialFacts) -> list[Finding]:
    """Decode steps that run eagerly pay a kernel launch per kernel instead of one graph replay."""
    # the busiest valid point, as every rule reads it (an invalid point's numbers describe the client)
    label = _busiest(f) or ""
    if str(f.resolved.get("disable_cuda_graph")).lower() == "true":
        change: dict[str, Any] = {"server.cuda_graph": True}
        return [Finding("cuda_graph_off", "warning", "CUDA graphs are disabled",
                        f"disable_cuda_graph=True ({RESOLVED}): every decode step launches its kernels "
                        "one by one",
                        _suggest("Use CUDA graphs unless debugging: small decode batches are launch-bound.",
                                 change),
                        point=label, change=change)]
    name = next((n for n in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs")
                 if int_or_none(f.resolved.get(n))), "")
    max_bs = int_or_none(f.resolved.get(name))
    if not max_bs or not label:
        return []
    step = f.steps.get(label)
    if step is not None and step.batch > 0:
        batch, where = step.batch, f"{COST_MODEL} of the micro-batch"
    else:
        cap = int_or_none(f.resolved.get("pp_max_micro_batch_size"))
        per = _per_replica(f, f.concurrency[label])
        batch, where = (min(per, cap) if cap else per), "concurrency and the resolved micro-batch cap"
    if batch <= max_bs:
        return []
    change = {"server.extra_args.cuda-graph-max-bs": batch}
    return [Finding(
        "cuda_graph_off", "info", f"Decode batches at {label} exceed the captured CUDA-graph sizes",
        f"up to {batch} requests per decode batch at {label} ({where}); graphs were captured up to "
        f"bs={max_bs} ({name} {RESOLVED}), so larger batches run eagerly",
        _suggest("Capture graphs up to the decode batch, memory permitting.", change),
        point=label, change=change)]


def gpu_underused(f: TrialFacts) -> list[Finding]:
    """Power, not utilisation: NVML's utilisation counts any time a kernel is resident, including
    kernels spin-waiting on a peer (a stage blocked in a receive shows 100 %); power does not lie."""
    evidence = _gpu_evidence(f)
    label = _busiest(f, POWER_FRAC_MEAN) if evidence else None
    if label is None:
        return []
    frac = float(f.points[label][POWER_FRAC_MEAN])
    idle = f.idle_power_w / f.power_limit_w if 0 < f.idle_power_w < f.power_limit_w else 0.0
    threshold = idle + 0.25 * (1 - idle)
    if frac >= threshold:
        return []
    return [Finding(
        "gpu_underused", "warning", f"GPUs draw {frac:.0%} of their power limit at {label}",
        f"mean GPU power {frac:.0%} of the limit at {label} {evidence}, below {threshold:.0%} (idle "
        f"{idle:.0%} + a quarter of the range to the limit)",
        "The GPUs mostly wait: see the other findings (micro-batches in flight, communication); another "
        "split of the same GPUs may keep them busier.",
        point=label, more_load=_more_load(f, label))]




@dataclass(frozen=True)
class TtftSplit:
    """Where a point's TTFT went: ``stat`` ("p99" or "mean") of TTFT, of which ``queue_ms`` was spent
    waiting in the server's queue, read from ``source``."""

    stat: str
    ttft_ms: float
    queue_ms: float
    source: str

    def text(self) -> str:
        return (f"TTFT {self.stat} {_ms(self.ttft_ms)}, of which {_ms(self.queue_ms)} "
                f"({self.queue_ms / self.ttft_ms:.0%}) queueing ({self.source})")


def _ms(value: float) -> str:
    return f"{value / 1e3:.1f} s" if value >= 1e3 else f"{value:.0f} ms"


def _ttft_split_at(f: TrialFacts, label: str) -> TtftSplit | None:
    """The TTFT split at a point: from the server's own per-request queue time where it reported one
    (the requests in the TTFT p99 tail), else the mean wait by Little's law from the engine's queue
    reports (mean waiting requests / completed requests per second) against the mean TTFT."""
    m = f.points[label]
    simulated = _scheduler_evidence(f) != "(engine log / metrics)"
    ttft, queue = float_or_none(m.get("ttft_p99_ms")), float_or_none(m.get("ttft_p99_queue_ms"))
    if ttft is not None and queue is not None and math.isfinite(ttft) and ttft > 0:
        reported = "simulated engine's report, not measured" if simulated else "reported by the engine"
        return TtftSplit("p99", ttft, queue, f"each request's queue time, {reported}")
    waiting, rate = float_or_none(m.get(QUEUE_MEAN)), float_or_none(m.get("request_s"))
    mean = float_or_none(m.get("ttft_mean_ms"))
    if waiting is None or not rate or mean is None or not math.isfinite(mean) or mean <= 0:
        return None
    return TtftSplit("mean", mean, min(1e3 * waiting / rate, mean),
                     f"Little's law: {waiting:.1f} waiting / {rate:.2f} req/s, "
                     f"{_scheduler_evidence(f)[1:-1]}")


def _running_total(f: TrialFacts, m: Mapping[str, float]) -> float | None:
    """Requests one replica runs: the series' running count, times the micro-batches in flight under
    PP (where the series reports one micro-batch)."""
    running = float_or_none(m.get(RUNNING_MEAN))
    slots = f.pp_size + f.async_depth if f.pp_size > 1 else 1
    return running * slots if running is not None else None


def _waiting(f: TrialFacts, m: Mapping[str, float]) -> float | None:
    """Mean requests waiting at one replica."""
    total = float_or_none(m.get(QUEUE_MEAN))
    if total is not None:
        return total / max(1, f.dp_size)
    stages = [float_or_none(m.get(per_stage(s, "queue_mean"))) for s in range(f.pp_size)]
    known = [q for q in stages if q is not None]
    return max(known) if known else None


def _kv_pool_fit(f: TrialFacts, m: Mapping[str, float] | None = None) -> tuple[int, float, int] | None:
    """(pool tokens, tokens one request takes, whole requests the pool holds) at the workload's mean
    lengths. A request is admitted only with room for its prompt and every decode token it may still
    produce (SGLang reserves them in full for a request that ignores EOS, as a benchmark's do, and clips
    the reservation at 4,096), so a request takes prompt + output tokens of the pool from admission on.
    Where the point's prompts were found in the prefix cache (``m``'s hit rate), only the uncached share
    of a prompt is its own: the shared part is held once, for all. The pool holds whole requests: a
    12,000-token pool holds 5 requests of 2,080 tokens, not 5.8."""
    pool = int_or_none(f.resolved.get("max_total_num_tokens"))
    if not pool or f.input_len <= 0 or f.output_len <= 0:
        return None
    hit = 0.0
    if m is not None:
        hit = float_or_none(m.get("cache_hit_rate")) or float_or_none(m.get(LOG_CACHE_HIT_RATE)) or 0.0
    need = f.input_len * (1.0 - min(max(hit, 0.0), 1.0)) + min(f.output_len, CLIP_MAX_NEW_TOKENS)
    return pool, need, int(pool // need)


def _kv_bound(f: TrialFacts, label: str) -> str | None:
    """Why admission at ``label`` was held back by the KV pool, or None: requests waited (mean queue
    >= 1) while the running requests stayed below the concurrency and both admission caps, and the
    pool, used plus reserved for their remaining decode tokens, had no room for one more request
    (fewer than 1.5 requests' worth left at the mean lengths, so most of the time none)."""
    m = f.points[label]
    fit = _kv_pool_fit(f, m)
    waiting, total = _waiting(f, m), _running_total(f, m)
    if fit is None or waiting is None or total is None or waiting < 1:
        return None
    pool, need, fits = fit
    mrr = int_or_none(f.resolved.get("max_running_requests"))
    cap = int_or_none(f.resolved.get("pp_max_micro_batch_size"))
    running = float_or_none(m.get(RUNNING_MEAN))
    c = f.concurrency.get(label)
    offered = _per_replica(f, c) if c else None
    if (mrr is not None and total >= 0.9 * mrr) or (offered is not None and total >= 0.9 * offered) or (
            cap is not None and f.pp_size > 1 and running is not None and running >= 0.9 * cap):
        return None
    if fits - total >= 1.5:
        return None
    prompt = need - min(f.output_len, CLIP_MAX_NEW_TOKENS)  # less what the prefix cache shares
    below = " and ".join(x for x in (f"the concurrency {offered}" if offered else "",
                                  f"max_running_requests={mrr}" if mrr else "") if x)
    return (f"{waiting:.1f} requests waited on average while about {total:.1f} ran"
            + (f", below {below}" if below else "")
            + f"; at {prompt:,.0f} + {min(f.output_len, CLIP_MAX_NEW_TOKENS):,.0f} tokens a request "
              f"({'prompt' if prompt >= f.input_len else 'uncached prompt'} and every decode token, "
              f"reserved at admission) the {pool:,}-token KV pool holds "
              f"{fits} request{'s' if fits != 1 else ''}" + _pool_cap_text(f))


def _pool_cap(f: TrialFacts) -> int | None:
    """``--max-total-tokens`` where it is what sizes the pool (the pool is no larger than it), else None."""
    cap = int_or_none(f.resolved.get("max_total_tokens"))
    pool = int_or_none(f.resolved.get("max_total_num_tokens"))
    return cap if cap and pool and pool <= cap else None


def _pool_cap_text(f: TrialFacts) -> str:
    cap = _pool_cap(f)
    return f" (the pool is capped by --max-total-tokens={cap:,})" if cap else ""


def kv_capacity(f: TrialFacts) -> list[Finding]:
    """The KV pool, not a request cap, limits how many requests run. At a point it fires on any of:

    * the pool ran full: ``kv_token_usage_max >= 0.95``;
    * the engine retracted requests (``retracted_reqs > 0``): it admitted more than the pool holds;
    * KV-bound admission, read the way SGLang's scheduler decides it (:func:`_kv_bound`): requests
      wait while the running requests sit below the concurrency and both admission caps and the pool,
      used plus reserved for the running requests' remaining decode tokens, has no room for another
      (the used share alone stays below 0.95 then: the reservation is not in it). In closed and open
      loops. Under PP the series' ``running`` is one micro-batch, so the replica runs about running x
      (pp + async depth) requests.

    The point reported is the busiest that fires; the evidence says how many requests the pool holds at
    the workload's lengths and, where known, how much of the TTFT was queueing. The change raises
    ``mem_fraction_static`` by 0.05 (at most 0.95) while it is known and below 0.9; the alternatives,
    predicted when it does not help: a ``max_running_requests`` that keeps the pool about 90 % full
    (when it ran full or retracted: the running requests x 0.9 / usage, usage 1 after a retraction), an
    FP8 KV cache (half the bytes per token). The advice check adds every split of the same GPUs (a wider
    TP group spreads the weights thinner and leaves more room for KV; more replicas take fewer requests
    each).
    """
    mrr = int_or_none(f.resolved.get("max_running_requests"))
    fired: dict[str, tuple[list[str], int | None, bool]] = {}
    for label, m in f.points.items():
        usage, retracted = float_or_none(m.get(KV_USAGE_MAX)), float_or_none(m.get(RETRACTED))
        total = _running_total(f, m)
        reasons = []
        if usage is not None and usage >= 0.95:
            reasons.append(f"KV pool usage reached {usage:.0%}")
        if retracted is not None and retracted > 0:
            reasons.append(f"{retracted:.0f} requests retracted (KV pool full)")
        bound = _kv_bound(f, label)
        if bound:
            reasons.append(bound)
        retracting = retracted is not None and retracted > 0
        fits = None
        if total is not None and ((usage is not None and usage >= 0.95) or retracting):
            # what keeps the pool about 90 % full: the running requests scaled by 0.9 / usage (a
            # retraction means the pool was full, whatever the reports between them caught)
            full = 1.0 if retracting or usage is None else usage
            fits = max(1, math.floor(total * 0.9 / full))
        if reasons:
            fired[label] = (reasons, fits, retracting)
    if not fired:
        return []
    label = _by_load(f, list(fired))[0]
    reasons, fits, retracting = fired[label]
    mfs = float_or_none(f.resolved.get("mem_fraction_static"))
    cap = _pool_cap(f)
    # a pool capped by --max-total-tokens grows only with the cap: more memory would not reach it
    raise_cap = {f"{EXTRA_ARGS_PREFIX}max_total_tokens": 2 * cap} if cap else None
    raise_mfs = ({"server.mem_fraction_static": round(min(mfs + 0.05, 0.95), 3)}
                 if mfs is not None and mfs < 0.9 and not cap else None)
    lower_mrr = ({"server.max_running_requests": fits} if fits is not None and (mrr is None or fits < mrr)
                 else None)
    fp8 = (None if str(f.resolved.get("kv_cache_dtype") or "auto").startswith(("fp8", "mxfp8"))
           else {f"{EXTRA_ARGS_PREFIX}kv-cache-dtype": "fp8_e4m3"})
    candidates = _some(raise_cap, raise_mfs, lower_mrr, fp8)
    change, alternatives = (candidates[0], candidates[1:]) if candidates else ({}, [])
    split = _ttft_split_at(f, label)
    return [Finding(
        "kv_capacity", "critical" if retracting else "warning",
        f"The KV cache limits the running requests at {label}",
        f"{'; '.join(reasons)} at {label} {_scheduler_evidence(f)}"
        + (f"; {split.text()}" if split and split.queue_ms > 0 else ""),
        _suggest("Raise the pool's --max-total-tokens cap." if cap else
                 "Give the KV pool more memory, or store fewer bytes per token, or admit only what it "
                 "holds.", change),
        point=label, change=change, alternatives=alternatives)]


def _comm_bound_point(f: TrialFacts, steps: Mapping[str, StepEstimate], order: Sequence[str]
                      ) -> tuple[str, str] | None:
    """The point tp_comm_bound is about and the ITL part of its evidence, or None."""
    busiest = steps[order[0]]
    if f.interconnect == "pcie" and busiest.comm_s / busiest.step_s >= 0.3:
        return order[0], ""
    for label in order:
        s = steps[label]
        itl = float_or_none(f.points[label].get("itl_p50_ms"))
        if (itl is not None and s.memory_bound_s > 0 and itl / 1e3 > 2 * s.memory_bound_s
                and s.comm_s / s.step_s >= 0.15):
            return label, (f"; measured ITL p50 {itl:.2f} ms (load generator) is "
                           f"{itl / 1e3 / s.memory_bound_s:.1f}x the {s.memory_bound_s * 1e3:.2f} ms "
                           f"memory-bandwidth floor of the step ({COST_MODEL})")
    return None


def tp_comm_bound(f: TrialFacts) -> list[Finding]:
    """TP collectives dominate the decode step: over PCIe when they take >= 30 % of the step at the
    busiest point, or anywhere when the measured ITL is over twice the memory-bandwidth floor while they
    take >= 15 %. The change moves the split to PP, whose stages exchange one activation per step
    instead of two all-reduces per layer."""
    if f.tp_size <= 1:
        return []
    steps = {label: s for label, s in f.steps.items() if s.step_s > 0 and label in f.points}
    if not steps:
        return []
    order = _by_load(f, list(steps))
    found = _comm_bound_point(f, steps, order)
    if found is None:
        return []
    label, itl_text = found
    s = steps[label]
    change = {"tp.size": 1, "pp.size": f.tp_size * f.pp_size}
    alternatives = _some({"tp.size": f.tp_size // 2, "pp.size": f.pp_size * 2} if f.tp_size >= 4 else None)
    return [Finding(
        "tp_comm_bound", "warning", f"TP communication dominates the decode step at {label}",
        f"TP collectives take {s.comm_s / s.step_s:.0%} of a {s.step_s * 1e3:.2f} ms decode step at {label} "
        f"over {f.interconnect} with tp={f.tp_size} ({COST_MODEL}){itl_text}",
        _suggest("Split the model across the slow links by pipeline stages instead of tensor shards.",
                 change),
        point=label, change=change, alternatives=alternatives)]


def _smaller_chunk(chunk: int, mean_batch: float, itl_p50: float, itl_p99: float) -> int:
    """A chunked-prefill size whose prefill stalls a decode about 3 ITL p50: the mean prefill batch,
    whose stall the ITL p99 shows, scaled by 3 x p50 / p99 (prefill time grows about linearly with its
    tokens), rounded down to a power of two, at least 256 and at most half the current size."""
    target = max(256.0, mean_batch * 3 * itl_p50 / itl_p99)
    return max(256, min(chunk // 2, 1 << int(math.log2(target))))


def prefill_interference(f: TrialFacts) -> list[Finding]:
    """Long prefills stall the decodes that run beside them. SGLang runs a prefill batch before any
    decode (the running requests wait the whole prefill, and every chunk of a chunked prompt, one
    after another), unless ``--enable-mixed-chunk`` puts their decode tokens into the prefill's forward;
    a decode then waits one chunk, not one prompt. Fires at the busiest valid point where ITL p99 is at
    least 3x ITL p50 and 10 ms above it (load generator) and the engine log shows prefill batches of at
    least 256 prompt tokens on average, at least a quarter of them run while requests were decoding.

    The change turns mixed chunks on (when off) with a chunk whose prefill stalls a decode about 3 ITL
    p50 (:func:`_smaller_chunk`); the alternatives, each alone. Its goal is ITL p99: it is predicted,
    and kept, for what it does to ITL p99, and the TTFT it costs is said beside it."""
    chunk = int_or_none(f.resolved.get("chunked_prefill_size"))
    mixed_on = str(f.resolved.get("enable_mixed_chunk")).lower() == "true"
    for label in _by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        values = [float_or_none(f.points[label].get(k)) for k in
                  ("itl_p50_ms", "itl_p99_ms", PREFILL_TOKENS_MAX, PREFILL_TOKENS_MEAN, PREFILL_WITH_DECODES)]
        known = [v for v in values if v is not None and math.isfinite(v)]
        if len(known) < len(values):
            continue
        p50, p99, largest, mean, beside = known
        if p50 <= 0 or p99 < 3 * p50 or p99 - p50 < 10 or mean < 256 or beside < 0.25:
            continue
        # chunked prefill off (-1): a prompt is one batch, as large as the largest seen
        enabled = chunk is not None and chunk > 0
        current = chunk if enabled else int(largest)
        mixed = {f"{EXTRA_ARGS_PREFIX}enable-mixed-chunk": True}
        smaller = ({"server.chunked_prefill_size": _smaller_chunk(current, mean, p50, p99)}
                   if current and current > 512 else None)
        if mixed_on and enabled:
            changes = _some(smaller)
        else:  # mixed chunks need chunked prefill: alone they are an alternative only when it is on
            changes = _some({**mixed, **(smaller or {})}, mixed if smaller and enabled else None, smaller)
        change, alternatives = (changes[0], changes[1:]) if changes else ({}, [])
        why = ("Let the running requests decode inside the prefill's forward, in shorter chunks, so a "
               "long prompt costs them one chunk's time instead of the whole prefill (a trade against "
               "TTFT).")
        return [Finding(
            "prefill_interference", "warning", f"Prefills stall the running decodes at {label}",
            f"ITL p99 {p99:.1f} ms is {p99 / p50:.1f}x ITL p50 {p50:.1f} ms at {label} (load generator); "
            f"prefill batches of {mean:,.0f} prompt tokens on average (largest {largest:,.0f}), {beside:.0%} "
            f"of them while requests were decoding, chunked_prefill_size={chunk}, mixed chunk "
            f"{'on' if mixed_on else 'off'} ({_scheduler_evidence(f)[1:-1]}; sizes {RESOLVED})",
            _suggest(why, change), point=label, change=change, alternatives=alternatives,
            goal="itl_p99_ms")]
    return []


def ttft_queueing(f: TrialFacts) -> list[Finding]:
    """TTFT is mostly waiting in the server's queue, and no cap explains it: at the busiest point where
    the queueing part of the TTFT (:func:`_ttft_split_at`) is at least half of it and at least 100 ms, so is
    the median request's (when the server reported per-request times: a tail alone is a burst), and
    neither the KV pool (:func:`_kv_bound`, and the ``kv_capacity`` finding) nor ``max_running_requests``
    holds admission back there (those findings carry the split themselves). What remains is a server
    that takes requests in slower than they come. Its own changes: twice the chunked-prefill size (fewer,
    larger prefill batches take prompts in faster) where the engine resolved one, and twice the DP
    replicas (more GPUs, where the node has them: a TTFT bought with GPUs, and the effect says so); the
    advice check adds every split of the same GPUs. All are predicted for TTFT p99 (its goal)."""
    mrr = int_or_none(f.resolved.get("max_running_requests"))
    for label in _by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        split = _ttft_split_at(f, label)
        if split is None or split.queue_ms < 100 or split.queue_ms < 0.5 * split.ttft_ms:
            continue
        m = f.points[label]
        p50_queue, p50_ttft = float_or_none(m.get("server_queue_p50_ms")), float_or_none(m.get("ttft_p50_ms"))
        if p50_queue is not None and p50_ttft and p50_queue < 0.5 * p50_ttft:
            continue  # only a burst queued (a closed loop's first requests all at once), not the typical one
        c = f.concurrency.get(label)
        if _kv_bound(f, label) or (mrr and c and _per_replica(f, c) > mrr):
            return []
        chunk = int_or_none(f.resolved.get("chunked_prefill_size"))
        own = _some({"server.chunked_prefill_size": 2 * chunk} if chunk and chunk > 0 else None,
                    {"dp.size": 2 * f.dp_size})  # more replicas: more GPUs, bought for the TTFT
        change, alternatives = own[0], own[1:]
        return [Finding(
            "ttft_queueing", "warning", f"Requests wait in the queue for most of their TTFT at {label}",
            f"{split.text()} at {label}; no admission cap or KV limit holds them back: the server "
            "admits requests as fast as it can prefill and run them",
            _suggest("Take requests in faster (larger prefill batches, or more replicas: a wider split of "
                     "the GPUs, or more GPUs), or offer less load per replica.", change),
            point=label, change=change, alternatives=alternatives, goal="ttft_p99_ms")]
    return []


def _reuse(m: Mapping[str, float]) -> tuple[float, float] | None:
    """(hit rate, offered hit rate) of a point's prompt tokens, where both are known: the engine's own
    per-request reports, else its log's prefill lines."""
    hit = float_or_none(m.get("cache_hit_rate"))
    if hit is None:
        hit = float_or_none(m.get(LOG_CACHE_HIT_RATE))
    offered = float_or_none(m.get("offered_hit_rate"))
    return (hit, offered) if hit is not None and offered is not None else None


def _reuse_text(label: str, hit: float, offered: float, m: Mapping[str, float]) -> str:
    computed = float_or_none(m.get("prefill_computed_tokens"))
    return (f"the engine found {hit:.0%} of the prompt tokens in its prefix cache at {label}, where the "
            f"prompts offered {offered:.0%} (what a cache that never evicts would have found)"
            + (f"; {computed:,.0f} prompt tokens computed" if computed is not None else ""))


def _round_robin_split(f: TrialFacts) -> bool:
    return f.dp_size > 1 and f.dp_router == "round_robin"


def prefix_cache_thrash(f: TrialFacts) -> list[Finding]:
    """The prefix cache loses what the workload offers it: at the busiest valid point whose prompts
    offered at least 20 % of their tokens, the engine found less than 80 % of that, and at least 10
    points less. A pool too small for the prefixes in play evicts them and computes them again. (With
    DP replicas behind round-robin, ``prefix_cache_split`` speaks instead: splitting the traffic loses
    more.) Changes, each predicted: a larger pool (the ``--max-total-tokens`` cap doubled where it sizes
    the pool, else ``mem_fraction_static`` + 0.05), ``lpm`` (admit the requests whose prefix is cached
    first, so a cached prefix is used before it is evicted), fewer running requests (what they hold and
    reserve leaves the cache no room)."""
    if _round_robin_split(f) or str(f.resolved.get("disable_radix_cache")) == "True":
        return []
    for label in _by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        m = f.points[label]
        reuse = _reuse(m)
        if reuse is None:
            continue
        hit, offered = reuse
        if offered < 0.2 or hit >= 0.8 * offered or offered - hit < 0.1:
            continue
        usage = float_or_none(m.get(KV_USAGE_MAX))
        pool = int_or_none(f.resolved.get("max_total_num_tokens"))
        cap = _pool_cap(f)
        mfs = float_or_none(f.resolved.get("mem_fraction_static"))
        bigger = ({f"{EXTRA_ARGS_PREFIX}max_total_tokens": 2 * cap} if cap else
                  {"server.mem_fraction_static": round(min(mfs + 0.05, 0.95), 3)}
                  if mfs is not None and mfs < 0.9 else None)
        policy = str(f.resolved.get("schedule_policy") or "fcfs")
        lpm = {"server.schedule_policy": "lpm"} if policy not in ("lpm", "dfs-weight") else None
        total = _running_total(f, m)
        fewer = ({"server.max_running_requests": max(1, math.floor(total * 0.75))}
                 if total is not None and total >= 2 else None)
        own = _some(bigger, lpm, fewer)
        if not own:
            return []
        pool_text = (f"; the KV pool holds {pool:,} tokens" + _pool_cap_text(f)
                     + (f", used up to {usage:.0%}" if usage is not None else "") if pool else "")
        return [Finding(
            "prefix_cache_thrash", "warning", f"The prefix cache evicts what the requests share at {label}",
            _reuse_text(label, hit, offered, m) + pool_text + f" {_scheduler_evidence(f)}",
            _suggest("Give the cache room to keep the shared prefixes (a larger pool, or fewer running "
                     "requests), or admit the requests whose prefix is cached first (lpm).", own[0]),
            point=label, change=own[0], alternatives=own[1:])]
    return []


def prefix_cache_split(f: TrialFacts) -> list[Finding]:
    """Data parallelism splits the prefix cache: with DP replicas behind round-robin, each replica sees
    a share of every prefix's requests and computes the prefix for itself. Fires at the busiest valid
    point whose prompts offered at least 20 % of their tokens where the engine found at least 5 points
    less. Change, predicted: the cache-aware router (``dp.router=cache_aware``), which sends a prompt to
    the replica that already holds its beginning."""
    if not _round_robin_split(f) or str(f.resolved.get("disable_radix_cache")) == "True":
        return []
    for label in _by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        m = f.points[label]
        reuse = _reuse(m)
        if reuse is None or reuse[1] < 0.2 or reuse[1] - reuse[0] < 0.05:
            continue
        hit, offered = reuse
        change = {"dp.router": "cache_aware"}
        return [Finding(
            "prefix_cache_split", "warning", f"{f.dp_size} replicas split the prefix cache at {label}",
            _reuse_text(label, hit, offered, m) + f"; {f.dp_size} DP replicas take requests in turn "
            f"(round-robin), so every replica computes and keeps each shared prefix {_scheduler_evidence(f)}",
            _suggest("Route each request to the replica that already holds its prefix.", change),
            point=label, change=change)]
    return []


RULES: list[Callable[[TrialFacts], list[Finding]]] = [
    client_bound, too_few_microbatches, admission_cap, pp_bubble, pp_stage_imbalance, cuda_graph_off,
    gpu_underused, kv_capacity, tp_comm_bound, prefill_interference, ttft_queueing, prefix_cache_thrash,
    prefix_cache_split,
]


def diagnose(facts: TrialFacts) -> list[Finding]:
    findings = [finding for rule in RULES for finding in rule(facts)]
    return sorted(findings, key=lambda x: -SEVERITIES.index(x.severity))
