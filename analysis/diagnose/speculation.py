"""Rules on speculative decoding: where drafting tokens would pay at the trial's load, and where the
verify has grown compute-bound so that the drafts cost more than they save. Both read the cost model's
decode step at the point (a plain step, and the draft-verify-extend iteration when speculation is on);
the advice check predicts every change before it is suggested."""

from __future__ import annotations

from analysis.diagnose.evidence import by_load, per_replica, suggest
from analysis.diagnose.facts import COST_MODEL, TrialFacts
from vocab.findings import Finding
from vocab.telemetry import SPEC_ACCEPT_LEN
from vocab.values import float_or_none

# SGLang's own adaptive speculation keeps its deepest drafts only below 8 requests a batch
# (adaptive_spec_params.py: steps [1, 3, 5, 7] below 8, [0, 1, 3] from 8, [0, 1] from 32, off from 64)
SMALL_BATCH = 8
# a verify this many times a plain step no longer rides on the weights' streaming: its tokens are computed
# (or, for a MoE, reach more experts)
COSTLY_VERIFY = 1.5
# the smallest speculation SGLang runs (one draft step, a chain): what remains when the tree is too dear
FEWEST_STEPS = {"spec.num_steps": 1, "spec.topk": 1, "spec.num_draft_tokens": 2}
# vLLM has no draft depth of its own (--speculative-config needs num_speculative_tokens): a suggestion to
# turn speculation on there names one, the three-token chain SGLang chooses for most models
VLLM_STEPS = 3


def _on_vllm(f: TrialFacts) -> bool:
    return f.plays == "vllm"


def _valid(f: TrialFacts) -> list[str]:
    return [x for x in f.points if f.points[x].get("valid", 1) != 0]


def speculation_would_pay(f: TrialFacts) -> list[Finding]:
    """Speculation is off, the model has a draft, there is no pipeline (SGLang runs speculation with one
    only for EAGLE behind an environment switch parasweep does not set), and at the least loaded valid
    closed-loop point each replica decodes fewer than 8 requests a step, a step the cost model prices at
    no more than twice its memory-bound floor: the weights are streamed for a handful of tokens, so
    verifying several at once costs little more. The change turns on the first draft the model has; the
    rest are alternatives. Judged on throughput (at such loads, each request's own token rate)."""
    if f.spec_algorithm != "none" or not f.spec_drafts or f.pp_size > 1:
        return []
    for label in reversed(by_load(f, [x for x in _valid(f) if x in f.concurrency])):
        step = f.steps.get(label)
        c = per_replica(f, f.concurrency[label])
        if step is None or c >= SMALL_BATCH or step.step_s > 2 * step.memory_bound_s:
            continue
        depth = {"spec.num_steps": VLLM_STEPS} if _on_vllm(f) else {}
        options = [{"spec.algorithm": a, **depth} for a in f.spec_drafts]
        change, alternatives = options[0], options[1:]
        first = next(iter(f.spec_drafts))
        return [Finding(
            "speculation_would_pay", "info", f"Speculative decoding would pay at {label}",
            f"{c} request(s) per replica at {label}; a decode step {step.step_s * 1e3:.2f} ms of which "
            f"{step.memory_bound_s * 1e3:.2f} ms is streaming weights and KV ({COST_MODEL}): a verify of "
            f"several drafted tokens costs little more than one. The model has drafts for "
            f"{', '.join(f.spec_drafts)}; the prediction assumes {f.spec_drafts[first]}",
            suggest("Let a draft propose tokens that the target verifies in one forward (speculative "
                    "decoding); the gain depends on how many the target accepts, which the measured "
                    "trial reports (accept length).", change),
            point=label, change=change, alternatives=alternatives)]
    return []


def speculation_costs(f: TrialFacts) -> list[Finding]:
    """Speculation is on and at the busiest valid point its verify costs at least 1.5 plain steps (cost
    model): the tree's tokens no longer ride along with the weights (they are computed, or reach more
    of a MoE's experts), and the accepted tokens must pay for it. Suggests the smallest speculation
    SGLang runs (one draft step), then none; a trial already at one step is offered none. Judged on
    throughput; the accept length quoted is the trial's own (engine log or metrics) where it reported
    one, else the model's."""
    if f.spec_algorithm == "none":
        return []
    for label in by_load(f, [x for x in _valid(f) if x in f.concurrency]):
        step = f.steps.get(label)
        if step is None or not step.spec_step_s or step.verify_s < COSTLY_VERIFY * step.step_s:
            continue
        measured = float_or_none(f.points[label].get(SPEC_ACCEPT_LEN))
        tokens, source = ((measured, "the engine's accept len") if measured else
                          (step.spec_tokens, f"the model's expectation ({COST_MODEL})"))
        gain = tokens * step.step_s / step.spec_step_s
        fewest = str(f.resolved.get("speculative_num_steps")) == "1"
        change, alternatives = (({"spec.algorithm": "none"}, []) if fewest
                                else (dict(FEWEST_STEPS), [{"spec.algorithm": "none"}]))
        return [Finding(
            "speculation_costs", "warning",
            f"The speculative verify costs {step.verify_s / step.step_s:.1f} plain decode steps at {label}",
            f"at {label} ({step.batch} requests a step) the verify takes {step.verify_s * 1e3:.2f} ms "
            "against "
            f"{step.step_s * 1e3:.2f} ms for a plain decode step and the whole iteration "
            f"{step.spec_step_s * 1e3:.2f} ms ({COST_MODEL}); {tokens:.2f} tokens per request per "
            f"iteration ({source}) make it {gain:.2f}x a plain step's rate",
            suggest("Draft fewer tokens (one step, no tree) so the verify stays near a plain step, or turn "
                    "speculation off at this load" + ("." if _on_vllm(f) else " (SGLang's "
                                                      "--speculative-adaptive does so from 64 requests)."),
                    change),
            point=label, change=change, alternatives=alternatives)]
    return []
