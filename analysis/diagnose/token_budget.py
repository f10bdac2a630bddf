"""A rule on vLLM's token budget: one budget per step (``--max-num-batched-tokens``) is shared by every
running request's decode token and the prompt chunks, decodes first, so many running requests leave a
prompt few tokens a step: its prefill is spread over several steps and the server takes prompts in
slower than they come."""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.diagnose.evidence import by_load, scheduler_evidence, some, suggest
from analysis.diagnose.facts import RESOLVED, TrialFacts
from analysis.diagnose.kv_pool import ttft_split_at
from vocab.findings import Finding
from vocab.telemetry import LOG_CACHE_HIT_RATE, RUNNING_MEAN
from vocab.values import float_or_none, int_or_none

# the decodes' share of the budget from which they starve the prompts
DECODE_SHARE = 0.2
# the largest budget suggested: vLLM's own default on the largest GPUs is 8,192, and the budget is also
# the largest forward the engine compiles and profiles memory for at start-up
MAX_BUDGET = 32768


@dataclass(frozen=True)
class Starved:
    budget: int  # tokens a step (--max-num-batched-tokens)
    running: float  # requests running: one decode token each a step
    prompt: float  # tokens a prompt needs computed (less its cached prefix)
    cached: bool  # some of the prompts were found in the prefix cache
    steps: int  # steps a prompt takes with what the decodes leave
    whole: int  # steps it would take with the whole budget

    def text(self) -> str:
        left = self.budget - self.running
        share = self.running / self.budget
        return (f"about {self.running:.0f} requests ran, each decoding one token a step from the "
                f"{self.budget:,}-token budget (max_num_batched_tokens, {RESOLVED}): {share:.0%} of it; "
                f"a {self.prompt:,.0f}-token prompt" + (" (less its cached prefix)" if self.cached else "")
                + f" then takes {self.steps} steps of the {left:,.0f} tokens left, where the whole budget "
                  f"would take it in {self.whole}")


def starved_at(f: TrialFacts, label: str) -> Starved | None:
    """vLLM only: the running requests' decode tokens take at least ``DECODE_SHARE`` of the budget and,
    with what they leave, a prompt takes at least two steps and one more than the whole budget would
    give it."""
    budget = int_or_none(f.resolved.get("chunked_prefill_size"))  # vLLM's --max-num-batched-tokens
    m = f.points[label]
    running = float_or_none(m.get(RUNNING_MEAN))
    if f.plays != "vllm" or not budget or budget <= 0 or f.input_len <= 0 or running is None:
        return None
    hit = float_or_none(m.get("cache_hit_rate")) or float_or_none(m.get(LOG_CACHE_HIT_RATE)) or 0.0
    prompt = f.input_len * (1.0 - min(max(hit, 0.0), 1.0))
    left = budget - running
    if running < DECODE_SHARE * budget or left <= 0 or prompt <= left:
        return None
    steps, whole = math.ceil(prompt / left), math.ceil(prompt / budget)
    return Starved(budget, running, prompt, hit > 0, steps, whole) if steps > whole else None


def prefill_starved(f: TrialFacts) -> list[Finding]:
    """At the busiest valid point where prompts are starved (:func:`starved_at`) and the TTFT is mostly
    queueing (:func:`ttft_split_at`: at least half and 100 ms; the prompts come in faster than the
    budget left takes them). The change: a budget that holds the running decodes and one whole prompt
    (rounded up to a power of two, at most ``MAX_BUDGET``); the alternative: twice the budget. Its goal
    is TTFT p99; a larger budget makes the steps that carry a prompt longer, which the predicted ITL p99
    beside it says."""
    for label in by_load(f, [x for x in f.points if f.points[x].get("valid", 1) != 0]):
        starved, split = starved_at(f, label), ttft_split_at(f, label)
        if starved is None or split is None or split.queue_ms < 100 or split.queue_ms < 0.5 * split.ttft_ms:
            continue
        budget = starved.budget
        fits = min(MAX_BUDGET, 1 << math.ceil(math.log2(starved.running + starved.prompt)))
        changes = some({"server.chunked_prefill_size": fits} if fits > budget else None,
                       {"server.chunked_prefill_size": 2 * budget}
                       if 2 * budget not in (fits, budget) and 2 * budget <= MAX_BUDGET else None)
        if not changes:
            return []
        return [Finding(
            "prefill_starved", "warning", f"Decodes leave prompts few tokens of each step at {label}",
            f"{starved.text()} at {label} {scheduler_evidence(f)}; {split.text()}",
            suggest("Give each step a budget that holds the running decodes and a whole prompt, so prompts "
                    "are taken in faster (each step carrying one is longer: a trade against ITL).",
                    changes[0]),
            point=label, change=changes[0], alternatives=changes[1:], goal="ttft_p99_ms")]
    return []
