"""Whether a difference between two trials' numbers exceeds their noise: the one rule the summary
table's "best" marks, the HTML report's headline and ``compare`` follow.

Each number comes with the half-width of its 95 % confidence interval, from the load generator's
window (``<metric>_ci95`` for throughput: batch means; ``<metric>_ci95_lo``/``_hi`` for a latency
percentile: the distribution-free interval of an order statistic) or, for repeated trials, from the
spread of the repeats. Two numbers differ beyond noise when the gap between them exceeds the combined
half-width (the root of the sum of squares); a number whose noise is unknown (NaN, a window too
short to say) never differs beyond noise: no "best" is crowned on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NAN = float("nan")


@dataclass(frozen=True)
class Estimate:
    """A value with the half-width of its 95 % interval (NaN: unknown)."""

    value: float
    half_width: float = NAN

    @classmethod
    def scaled(cls, value: float, relative: float | None) -> Estimate:
        """``value`` with the relative half-width of another number's interval (a per-GPU score or J
        per token: their noise is the throughput's)."""
        rel = NAN if relative is None else float(relative)
        return cls(value, rel * value if math.isfinite(rel) else NAN)

    @property
    def relative(self) -> float:
        if self.value and math.isfinite(self.half_width):
            return abs(self.half_width / self.value)
        return NAN


def beyond_noise(a: Estimate, b: Estimate) -> bool:
    """True when ``a`` and ``b`` differ by more than their combined half-width."""
    if not (math.isfinite(a.half_width) and math.isfinite(b.half_width)):
        return False
    return abs(a.value - b.value) > math.hypot(a.half_width, b.half_width)


def point_estimate(metrics: Mapping[str, float], metric: str) -> Estimate:
    """``metric`` of one load point with its interval: ``<metric>_ci95`` (a half-width), else the
    bounds ``<metric>_ci95_lo``/``_hi`` (their larger distance from the value); J per token takes the
    throughput's relative interval (its tokens carry the noise)."""
    value = float(metrics.get(metric, NAN))
    half = metrics.get(f"{metric}_ci95")
    if half is None and f"{metric}_ci95_hi" in metrics:
        lo, hi = float(metrics[f"{metric}_ci95_lo"]), float(metrics[f"{metric}_ci95_hi"])
        half = max(value - lo, hi - value) if math.isfinite(lo) and math.isfinite(hi) else NAN
    if half is None and metric.startswith("j_per_output_token"):
        return Estimate.scaled(value, metrics.get("output_tok_s_ci95_rel"))
    return Estimate(value, NAN if half is None else float(half))


@dataclass(frozen=True)
class Verdict:
    """The best of several estimates, whether it beats the runner-up beyond noise, and the noise
    (the larger relative half-width of the two) to say so with."""

    best: int
    runner_up: int | None
    clear: bool
    noise_rel: float

    def noise(self) -> str:
        """``±x %`` (the larger relative half-width of the two), or ``noise unknown``."""
        if not math.isfinite(self.noise_rel):
            return "noise unknown"
        pct = self.noise_rel * 100
        return f"±{pct:.0f} %" if pct >= 1 else f"±{pct:.1g} %"

    def text(self) -> str:
        return f"within noise ({self.noise()})"


def judge(estimates: Sequence[Estimate], lower_is_better: bool = False) -> Verdict | None:
    """The verdict over ``estimates`` (None: fewer than two finite values)."""
    ranked = sorted((i for i, e in enumerate(estimates) if math.isfinite(e.value)),
                    key=lambda i: estimates[i].value, reverse=not lower_is_better)
    if len(ranked) < 2:
        return None
    best, second = ranked[0], ranked[1]
    a, b = estimates[best], estimates[second]
    noise = max(a.relative, b.relative) if math.isfinite(a.relative) and math.isfinite(b.relative) else NAN
    return Verdict(best, second, beyond_noise(a, b) and a.value != b.value, noise)
