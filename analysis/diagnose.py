"""Diagnosis rules: each reads the trial's config, the engine's resolved values and the per-point
results, and returns findings with evidence and a suggestion (ids are stable: users filter on them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vocab.findings import SEVERITIES, Finding


@dataclass
class TrialFacts:
    """What the rules look at. ``points`` maps a load-point label to its metrics."""

    pp_size: int
    async_depth: int
    resolved: Mapping[str, Any]
    points: Mapping[str, Mapping[str, float]]
    concurrency: Mapping[str, int]  # label -> concurrency, closed-loop points only
    idle_power_w: float = 0.0  # hardware profile: an idle GPU with a server loaded
    power_limit_w: float = 0.0  # hardware profile: board power limit


def _busiest(f: TrialFacts, key: str) -> str | None:
    """The highest closed-loop load point that has ``key`` in its metrics."""
    labels = [label for label in f.concurrency if key in f.points.get(label, {})]
    return max(labels, key=lambda k: f.concurrency[k]) if labels else None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def client_bound(f: TrialFacts) -> list[Finding]:
    bad = [label for label, m in f.points.items() if m.get("valid", 1) == 0]
    if not bad:
        return []
    reasons = "; ".join(f"{label}: {f.points[label].get('invalid_reason', 'client fell behind')}"
                        for label in bad)
    return [Finding("client_bound", "critical", f"The load generator fell behind at {', '.join(bad)}",
                    f"valid=0 at {', '.join(bad)} ({reasons})",
                    "Do not read those points as server numbers; lower the load or give the client "
                    "its own cores.")]


def too_few_microbatches(f: TrialFacts) -> list[Finding]:
    """PP decode is a closed ring: with m micro-batches in flight a stage is busy at most m/p."""
    cap = _int(f.resolved.get("pp_max_micro_batch_size"))
    if f.pp_size <= 1 or not cap:
        return []
    slots = f.pp_size + f.async_depth
    worst = None
    for label, c in f.concurrency.items():
        m = min(slots, math.ceil(c / cap))
        if c > 1 and m < f.pp_size and (worst is None or c > worst[1]):
            worst = (label, c, m)
    if worst is None:
        return []
    label, c, m = worst
    idle = 1 - m / f.pp_size
    severity = "critical" if idle >= 0.5 else "warning"
    return [Finding(
        "too_few_microbatches", severity,
        f"Only {m} micro-batch{'es' if m > 1 else ''} in flight for {f.pp_size} pipeline stages at {label}",
        f"pp_max_micro_batch_size={cap} (resolved) puts all {c} requests of {label} into {m} slot(s) of "
        f"{slots}; each stage idles at least {idle:.0%} of the time",
        f"Set pp.micro_batch_size={max(1, math.ceil(c / f.pp_size))} (ceil(C/pp)) so the {c} requests of "
        f"{label} spread over all {f.pp_size} stages.")]


def admission_cap(f: TrialFacts) -> list[Finding]:
    mrr = _int(f.resolved.get("max_running_requests"))
    if not mrr:
        return []
    over = {label: c for label, c in f.concurrency.items() if c > mrr}
    if not over:
        return []
    worst = max(over, key=lambda k: over[k])
    return [Finding(
        "admission_cap", "warning",
        f"Concurrency above max_running_requests={mrr} queues at the server",
        f"{worst} offers {over[worst]} concurrent requests; the engine admits at most {mrr} "
        f"(resolved max_running_requests)",
        "Raise server.max_running_requests (KV capacity permitting) or read those points as queueing.")]


def pp_bubble(f: TrialFacts) -> list[Finding]:
    if f.pp_size <= 1:
        return []
    busy = {label: m["sim_stage_busy_mean"] for label, m in f.points.items() if "sim_stage_busy_mean" in m}
    if not busy:
        return []
    label = max(busy, key=lambda k: f.concurrency.get(k, 0))
    if busy[label] >= 0.6:
        return []
    return [Finding(
        "pp_bubble", "warning" if busy[label] >= 0.3 else "critical",
        f"Pipeline stages idle {1 - busy[label]:.0%} of the time at {label}",
        f"simulated mean stage busy fraction {busy[label]:.2f} at {label} (parasweep_sim series)",
        "Put more micro-batches in flight (pp.micro_batch_size, concurrency) or hide per-step "
        "overhead with pp.async_depth.")]


def pp_stage_imbalance(f: TrialFacts) -> list[Finding]:
    """One stage busier than the others paces the whole ring (often the last: it carries the LM head)."""
    label = _busiest(f, "sim_stage_busy_max") if f.pp_size > 1 else None
    if label is None:
        return []
    m = f.points[label]
    low, high = m.get("sim_stage_busy_min", 0.0), m["sim_stage_busy_max"]
    if high <= 0 or (high - low) / high <= 0.15:
        return []
    return [Finding(
        "pp_stage_imbalance", "warning", f"Pipeline stages are unevenly loaded at {label}",
        f"simulated stage busy fraction ranges {low:.2f}..{high:.2f} at {label} (parasweep_sim series): "
        f"the busiest stage paces the ring",
        "Move layers off the busiest stage with SGLANG_PP_LAYER_PARTITION (the last stage also runs the "
        "LM head and sampling).")]


def cuda_graph_off(f: TrialFacts) -> list[Finding]:
    """Decode steps that run eagerly pay a kernel launch per kernel instead of one graph replay."""
    if str(f.resolved.get("disable_cuda_graph")).lower() == "true":
        return [Finding("cuda_graph_off", "warning", "CUDA graphs are disabled",
                        "resolved disable_cuda_graph=True: every decode step launches its kernels one by one",
                        "Leave server.cuda_graph=true unless debugging: small decode batches are "
                        "launch-bound.")]
    max_bs = _int(f.resolved.get("cuda_graph_max_bs_decode"))
    cap = _int(f.resolved.get("pp_max_micro_batch_size"))
    if not max_bs or not f.concurrency:
        return []
    label = max(f.concurrency, key=lambda k: f.concurrency[k])
    batch = min(f.concurrency[label], cap) if cap else f.concurrency[label]
    if batch <= max_bs:
        return []
    return [Finding(
        "cuda_graph_off", "info", f"Decode batches at {label} exceed the captured CUDA-graph sizes",
        f"up to {batch} requests per decode batch at {label}; graphs were captured up to bs={max_bs} "
        f"(resolved cuda_graph_max_bs_decode), so larger batches run eagerly",
        f"Raise --cuda-graph-max-bs-decode (server.extra_args) to at least {batch}, memory permitting.")]


def gpu_underused(f: TrialFacts) -> list[Finding]:
    """Power, not utilisation: NVML's utilisation counts any time a kernel is resident, including
    kernels spin-waiting on a peer (a stage blocked in a receive shows 100 %); power does not lie."""
    label = _busiest(f, "sim_gpu_power_w_mean")
    if label is None or f.power_limit_w <= f.idle_power_w:
        return []
    watts = f.points[label]["sim_gpu_power_w_mean"]
    threshold = f.idle_power_w + 0.25 * (f.power_limit_w - f.idle_power_w)
    if watts >= threshold:
        return []
    return [Finding(
        "gpu_underused", "warning", f"GPUs draw {watts:.0f} W of {f.power_limit_w:.0f} W at {label}",
        f"simulated mean GPU power {watts:.0f} W at {label}, below {threshold:.0f} W (idle "
        f"{f.idle_power_w:.0f} W + a quarter of the range to the {f.power_limit_w:.0f} W limit)",
        "The GPUs mostly wait: see the other findings (micro-batches in flight, communication), or "
        "offer more load.")]


RULES: list[Callable[[TrialFacts], list[Finding]]] = [
    client_bound, too_few_microbatches, admission_cap, pp_bubble, pp_stage_imbalance, cuda_graph_off,
    gpu_underused,
]


def diagnose(facts: TrialFacts) -> list[Finding]:
    findings = [finding for rule in RULES for finding in rule(facts)]
    return sorted(findings, key=lambda x: -SEVERITIES.index(x.severity))
