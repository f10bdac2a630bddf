"""Which trials differ beyond their noise at one load point, and whether the differences the simulator's
model predicted between them were seen.

The summary's ``*`` answers "is there one best?". A sweep is often run to ask something else: which of
its settings change the number at all (does async depth change throughput at c32?). Every pair of
trials is judged by the rule the best is judged by (:mod:`analysis.noise`: the gap against the root of
the sum of the squared half-widths of the two 95 % intervals).

Where the trials also carry the model's prediction (``pred/``), each pair the model puts apart (its two
predictions differ beyond the predictions' own noise) is checked against the measurement:

* confirmed: measured apart, the same way round;
* reversed: measured apart, the other way round;
* not there: the measured gap's interval lies wholly below the predicted gap (the same relative size);
* not resolved: the interval holds both no gap and the predicted one: the window was too short to say.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from analysis.noise import Estimate, beyond_noise


@dataclass(frozen=True)
class Gap:
    """Trial ``ahead`` better than trial ``behind`` by ``rel`` of the latter's value (indices into the
    estimates judged)."""

    ahead: int
    behind: int
    rel: float


class Seen(StrEnum):
    CONFIRMED = "confirmed"
    REVERSED = "reversed"
    NOT_THERE = "not there"
    NOT_RESOLVED = "not resolved"


@dataclass(frozen=True)
class CheckedGap:
    """A gap the model predicted, with the measured gap (relative to the measured value of ``behind``),
    its noise (the gap's half-width, likewise relative) and what that makes of the prediction."""

    predicted: Gap
    measured_rel: float
    noise_rel: float
    seen: Seen


def gaps_beyond_noise(estimates: Sequence[Estimate | None], lower_is_better: bool = False) -> list[Gap]:
    """Every pair whose values differ beyond the noise of both, the largest gap first (None: a trial
    without a usable number, e.g. failed or invalid there)."""
    gaps = []
    for i, a in enumerate(estimates):
        for j, b in enumerate(estimates):
            if a is None or b is None or not _better(a.value, b.value, lower_is_better) or not b.value:
                continue
            if beyond_noise(a, b):
                gaps.append(Gap(i, j, abs(a.value - b.value) / abs(b.value)))
    return sorted(gaps, key=lambda g: (-g.rel, g.ahead, g.behind))


def check_predicted(measured: Sequence[Estimate | None], predicted: Sequence[Estimate | None],
                    lower_is_better: bool = False) -> list[CheckedGap]:
    """The gaps the model predicts (beyond its own noise) between trials measured on both sides, each
    checked against the measured one; the largest predicted gap first."""
    checked = []
    for gap in gaps_beyond_noise(predicted, lower_is_better):
        a, b = measured[gap.ahead], measured[gap.behind]
        if a is None or b is None or not b.value:
            continue
        sign = -1.0 if lower_is_better else 1.0
        gap_rel = sign * (a.value - b.value) / abs(b.value)
        noise_rel = math.hypot(a.half_width, b.half_width) / abs(b.value)
        if not math.isfinite(noise_rel):
            seen = Seen.NOT_RESOLVED  # a window too short to say: never a verdict
        elif gap_rel > noise_rel:
            seen = Seen.CONFIRMED
        elif gap_rel < -noise_rel:
            seen = Seen.REVERSED
        elif gap_rel + noise_rel < gap.rel:
            seen = Seen.NOT_THERE
        else:
            seen = Seen.NOT_RESOLVED
        checked.append(CheckedGap(gap, gap_rel, noise_rel, seen))
    return checked


def _better(a: float, b: float, lower_is_better: bool) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return a < b if lower_is_better else a > b
