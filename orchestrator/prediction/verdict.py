"""What a predicted change is called, against the configuration it changes: the one judgement the
diagnosis's suggestions and the end of a sweep's "run this instead" share.

On throughput (the goal of most findings, and of "run this instead"): *helps* when throughput rises
by ``MIN_GAIN`` or more and by more than any p99 latency (TTFT, ITL) gets worse; *trade-off* when the
gain is bought with a larger latency loss; *latency only* when throughput stays within ``MIN_GAIN``
and a p99 falls by ``MIN_LATENCY_GAIN`` or more; *negligible*; *worse*. A change of load is judged
on throughput alone: more requests in flight always wait longer.

On one p99 latency (decodes stalled by prefills: ITL; requests queueing: TTFT): *helps* when it falls
by ``MIN_LATENCY_GAIN`` or more while throughput does not fall by ``MIN_GAIN`` and the other p99 rises
by less than the goal falls (in per cent); a larger cost on either side is a *trade-off*.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MIN_GAIN = 0.05  # a throughput gain below 5 % is within the model's error: not worth a GPU-hour
MIN_LATENCY_GAIN = 0.10
EFFECT_METRICS = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms")  # what a verdict reads
# verdicts that cost something: a change called so is never recommended
COSTLY = ("trade-off", "worse")


def change_pct(predicted: Mapping[str, float], baseline: Mapping[str, float]) -> dict[str, float]:
    """The relative change (%) of each of ``EFFECT_METRICS`` from ``baseline`` to ``predicted``. A
    metric without samples (NaN: no ITL when every request has one output token) moves nothing."""
    return {k: 100.0 * (predicted[k] - baseline[k]) / baseline[k] for k in EFFECT_METRICS
            if k in predicted and k in baseline and baseline[k] and math.isfinite(predicted[k] - baseline[k])}


def gain(effect: Mapping[str, Any], goal: str) -> float:
    """How much an effect does for the goal: the throughput change, or the fall of the goal's p99 (%)."""
    pct = effect["change_pct"]
    return pct.get("output_tok_s", 0.0) if goal == "throughput" else -pct.get(goal, 0.0)


def _latency_verdict(pct: Mapping[str, float], goal: str) -> str:
    """``helps`` | ``trade-off`` | ``negligible`` | ``worse`` for a latency goal (module docstring)."""
    fall = -pct.get(goal, 0.0) / 100
    tok = pct.get("output_tok_s", 0.0) / 100
    other = "ttft_p99_ms" if goal == "itl_p99_ms" else "itl_p99_ms"
    cost = pct.get(other, 0.0) / 100
    if fall >= MIN_LATENCY_GAIN:
        return "helps" if tok > -MIN_GAIN and cost < fall else "trade-off"
    if fall <= -MIN_LATENCY_GAIN or tok <= -MIN_GAIN:
        return "worse"
    return "negligible"


def verdict(pct: Mapping[str, float], load_change: bool = False, goal: str = "throughput") -> str:
    """``helps`` | ``trade-off`` | ``latency only`` | ``negligible`` | ``worse`` (module docstring). A
    change of load is judged on throughput alone: more requests in flight always wait longer."""
    if goal != "throughput":
        return _latency_verdict(pct, goal)
    tok = pct.get("output_tok_s", 0.0) / 100
    latencies = [] if load_change else [pct[k] / 100 for k in ("ttft_p99_ms", "itl_p99_ms") if k in pct]
    worst = max(latencies, default=0.0)
    if tok >= MIN_GAIN:
        return "helps" if worst < tok else "trade-off"
    if tok <= -MIN_GAIN:
        return "worse"
    if min(latencies, default=0.0) <= -MIN_LATENCY_GAIN:
        return "latency only"
    return "worse" if worst >= MIN_LATENCY_GAIN else "negligible"
