"""Rules on the client, the GPUs and the engine's own settings: an invalid point (the client was the
limit), CUDA graphs off or too small for the batch, GPUs drawing little of their power, TP collectives
dominating the step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis.diagnose.evidence import busiest, by_load, gpu_evidence, more_load, per_replica, some, suggest
from analysis.diagnose.facts import COST_MODEL, RESOLVED, StepEstimate, TrialFacts
from vocab.findings import Finding
from vocab.records import ENGINE_FAILED, STOPPED_EARLY
from vocab.telemetry import (
    POWER_FRAC_MEAN,
)
from vocab.values import float_or_none, int_or_none


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
                    "its own cores.", point=by_load(f, bad)[0])]


def cuda_graph_off(f: TrialFacts) -> list[Finding]:
    """Decode steps that run eagerly pay a kernel launch per kernel instead of one graph replay."""
    # the busiest valid point, as every rule reads it (an invalid point's numbers describe the client)
    label = busiest(f) or ""
    if str(f.resolved.get("disable_cuda_graph")).lower() == "true":
        change: dict[str, Any] = {"server.cuda_graph": True}
        return [Finding("cuda_graph_off", "warning", "CUDA graphs are disabled",
                        f"disable_cuda_graph=True ({RESOLVED}): every decode step launches its kernels "
                        "one by one",
                        suggest("Use CUDA graphs unless debugging: small decode batches are launch-bound.",
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
        per = per_replica(f, f.concurrency[label])
        batch, where = (min(per, cap) if cap else per), "concurrency and the resolved micro-batch cap"
    if batch <= max_bs:
        return []
    change = {"server.extra_args.cuda-graph-max-bs": batch}
    return [Finding(
        "cuda_graph_off", "info", f"Decode batches at {label} exceed the captured CUDA-graph sizes",
        f"up to {batch} requests per decode batch at {label} ({where}); graphs were captured up to "
        f"bs={max_bs} ({name} {RESOLVED}), so larger batches run eagerly",
        suggest("Capture graphs up to the decode batch, memory permitting.", change),
        point=label, change=change)]


def gpu_underused(f: TrialFacts) -> list[Finding]:
    """Power, not utilisation: NVML's utilisation counts any time a kernel is resident, including
    kernels spin-waiting on a peer (a stage blocked in a receive shows 100 %); power does not lie."""
    evidence = gpu_evidence(f)
    label = busiest(f, POWER_FRAC_MEAN) if evidence else None
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
        point=label, more_load=more_load(f, label))]


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
    instead of two all-reduces per layer; with attention-DP ranks that gather every rank's tokens
    around each MoE layer, DeepEP's all-to-all is tried first."""
    if f.tp_size <= 1:
        return []
    steps = {label: s for label, s in f.steps.items() if s.step_s > 0 and label in f.points}
    if not steps:
        return []
    order = by_load(f, list(steps))
    found = _comm_bound_point(f, steps, order)
    if found is None:
        return []
    label, itl_text = found
    s = steps[label]
    pipeline = {"tp.size": 1, "pp.size": f.tp_size * f.pp_size}
    # attention-DP ranks gather every rank's tokens to every GPU around each MoE layer: an all-to-all
    # backend sends each token only to the GPUs holding its experts
    gathers = f.attn_dp > 1 and f.moe and str(f.resolved.get("moe_a2a_backend") or "none") == "none"
    a2a = {"ep.a2a_backend": "deepep"} if gathers else None
    halved = {"tp.size": f.tp_size // 2, "pp.size": f.pp_size * 2} if f.tp_size >= 4 else None
    change, *alternatives = some(a2a, pipeline, halved)
    what = (f"the collectives of {f.attn_dp} attention-DP ranks (each MoE layer's gather of every rank's "
            f"tokens and the reduction after it)" if f.attn_dp > 1 else "TP collectives")
    return [Finding(
        "tp_comm_bound", "warning", f"TP communication dominates the decode step at {label}",
        f"{what[0].upper() + what[1:]} take {s.comm_s / s.step_s:.0%} of a {s.step_s * 1e3:.2f} ms decode "
        f"step at {label} over {f.interconnect} with tp={f.tp_size} ({COST_MODEL}){itl_text}",
        suggest("Send each token only to the GPUs holding its experts (an all-to-all backend)." if a2a else
                "Split the model across the slow links by pipeline stages instead of tensor shards.", change),
        point=label, change=change, alternatives=alternatives)]
