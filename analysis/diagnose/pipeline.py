"""Rules on the pipeline: too few micro-batches for its stages, the request pool capping the load, stages
idle (the bubble), and stages unevenly loaded (with the layer split that would even them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from analysis.diagnose.evidence import (
    busiest,
    gpu_evidence,
    micro_batches,
    more_load,
    per_replica,
    some,
    suggest,
)
from analysis.diagnose.facts import RESOLVED, TrialFacts
from vocab.findings import Finding
from vocab.telemetry import (
    STAGE_ACTIVITY_MAX,
    STAGE_ACTIVITY_MEAN,
    per_stage,
)
from vocab.values import float_or_none, int_or_none


def too_few_microbatches(f: TrialFacts) -> list[Finding]:
    """PP decode is a closed ring: with m micro-batches in flight a stage is busy at most m/p."""
    cap = int_or_none(f.resolved.get("pp_max_micro_batch_size"))
    if f.pp_size <= 1 or not cap:
        return []
    slots = f.pp_size + f.async_depth
    worst = None
    for label, c in f.concurrency.items():
        m = micro_batches(f, c, cap)
        if c > 1 and m < f.pp_size and (worst is None or c > worst[1]):
            worst = (label, c, m)
    if worst is None:
        return []
    label, c, m = worst
    per = per_replica(f, c)
    idle = 1 - m / f.pp_size
    severity = "critical" if idle >= 0.5 else "warning"
    change = {"pp.micro_batch_size": max(1, math.ceil(per / f.pp_size))}
    alternatives = some({"pp.micro_batch_size": max(1, math.ceil(per / slots))} if slots > f.pp_size
                         else None, {"pp.async_depth": f.async_depth + 1})
    replica = f" per DP replica ({f.dp_size} replicas)" if f.dp_size > 1 else ""
    fills = (f.pp_size - 1) * cap + 1  # requests one replica needs for pp micro-batches of at most cap
    return [Finding(
        "too_few_microbatches", severity,
        f"Only {m} micro-batch{'es' if m > 1 else ''} in flight for {f.pp_size} pipeline stages at {label}",
        f"pp_max_micro_batch_size={cap} ({RESOLVED}) puts all {per} requests{replica} of {label} into "
        f"{m} slot(s) of {slots}; each stage idles at least {idle:.0%} of the time; with this cap all "
        f"{f.pp_size} stages fill only at {fills:,} or more requests in flight{replica}",
        suggest(f"Spread the {per} requests{replica} of {label} over all {f.pp_size} stages "
                 f"(micro-batch cap ceil(C/pp)).", change),
        point=label, change=change, alternatives=alternatives, more_load=more_load(f, label))]


def admission_cap(f: TrialFacts) -> list[Finding]:
    mrr = int_or_none(f.resolved.get("max_running_requests"))
    if not mrr:
        return []
    over = {label: per_replica(f, c) for label, c in f.concurrency.items() if per_replica(f, c) > mrr}
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
        suggest("Admit every offered request (KV capacity permitting), or read those points as "
                 "queueing.", change),
        point=worst, change=change)]


def pp_bubble(f: TrialFacts) -> list[Finding]:
    """Stages busy well under the whole time: too few micro-batches in flight or exposed per-step
    overhead. The change is the micro-batch cap when the resolved cap keeps the busiest point below pp
    micro-batches, else one more async slot to hide the overhead."""
    evidence = gpu_evidence(f)
    label = busiest(f, STAGE_ACTIVITY_MEAN) if f.pp_size > 1 and evidence else None
    if label is None:
        return []
    activity = float(f.points[label][STAGE_ACTIVITY_MEAN])
    if activity >= 0.6:
        return []
    c = f.concurrency[label]
    cap = int_or_none(f.resolved.get("pp_max_micro_batch_size"))
    if cap and micro_batches(f, c, cap) < f.pp_size:
        change: dict[str, Any] = {"pp.micro_batch_size": max(1, math.ceil(per_replica(f, c) / f.pp_size))}
        why = f"Fill all {f.pp_size} stages with micro-batches."
    else:
        change = {"pp.async_depth": f.async_depth + 1}
        why = "Hide the per-step overhead behind one more micro-batch in flight (check outputs against pp=1)."
    alternatives = [c for c in ({"pp.micro_batch_size": max(1, math.ceil(per_replica(f, c) / f.pp_size))},
                                {"pp.async_depth": f.async_depth + 1}) if c != change]
    return [Finding(
        "pp_bubble", "warning" if activity >= 0.3 else "critical",
        f"Pipeline stages idle {1 - activity:.0%} of the time at {label}",
        f"mean stage activity {activity:.2f} at {label} (power above idle as a fraction of the idle-to-"
        f"limit range, averaged over each stage's GPUs) {evidence}",
        suggest(why, change), point=label, change=change, alternatives=alternatives,
        more_load=more_load(f, label))]


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
    evidence = gpu_evidence(f)
    label = busiest(f, STAGE_ACTIVITY_MAX) if f.pp_size > 1 and evidence else None
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
        suggest(why, change), point=label, change=change)]
