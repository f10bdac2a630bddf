"""Rules on the routed experts of a MoE model spread over an expert-parallel group."""

from __future__ import annotations

from analysis.diagnose.evidence import by_load, suggest
from analysis.diagnose.facts import COST_MODEL, TrialFacts
from vocab.findings import Finding
from vocab.values import int_or_none

MIN_SAVING = 0.10  # of the decode step: less is within what the cost model gets wrong


def expert_imbalance(f: TrialFacts) -> list[Finding]:
    """Hot experts: with the experts spread over ``ep_size`` GPUs and no EPLB, the GPU holding the most
    of a step's routed experts sets the step's time (a trained router sends more tokens to some
    experts than to others, and a small batch touches a few). Fires at the busiest point where the cost
    model's step with every EP rank given an even share (``StepEstimate.balanced_step_s``) is at least
    ``MIN_SAVING`` shorter. The change: ``ep.eplb=true`` (SGLang's load balancer moves experts so that
    each GPU gets an even share); redundant copies of the hottest experts are the alternative."""
    ep = int_or_none(f.resolved.get("ep_size")) or 1
    if ep <= 1 or f.resolved.get("enable_eplb"):
        return []
    fired = [label for label, s in f.steps.items()
             if label in f.points and s.balanced_step_s > 0 and s.step_s > 0
             and s.step_s - s.balanced_step_s >= MIN_SAVING * s.step_s]
    if not fired:
        return []
    label = by_load(f, fired)[0]
    s = f.steps[label]
    change = {"ep.eplb": True}
    return [Finding(
        "expert_imbalance", "info", f"The busiest expert-parallel GPU sets the decode step at {label}",
        f"with the experts over {ep} GPUs and routing skewed as a trained router's, a {s.batch}-request "
        f"decode step takes {s.step_s * 1e3:.2f} ms where an even share of the routed experts on every "
        f"GPU would take {s.balanced_step_s * 1e3:.2f} ms ({COST_MODEL})",
        suggest("Balance the experts over the GPUs (EPLB).", change),
        point=label, change=change, alternatives=[{"ep.eplb": True, "ep.redundant_experts": 32}])]
