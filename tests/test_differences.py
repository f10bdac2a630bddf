"""Which trials differ beyond noise, and what became of the gaps the model predicted between them
(analysis/differences.py): each outcome on numbers placed on either side of its boundary."""

from __future__ import annotations

import math

import pytest

from analysis.differences import Gap, Seen, check_predicted, gaps_beyond_noise
from analysis.noise import Estimate


def test_every_pair_apart_beyond_the_noise_of_both_is_listed_largest_first() -> None:
    # 150 ±6 and 143 ±4 are within noise (7 < 7.2); both are apart from 125 ±5 (and 130 ±6)
    tok = [Estimate(150, 6), Estimate(143, 4), Estimate(125, 5), Estimate(130, 6), None]
    gaps = gaps_beyond_noise(tok)
    assert [(g.ahead, g.behind) for g in gaps] == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert gaps[0].rel == pytest.approx(25 / 125)
    # 143 - 130 = 13 against hypot(4, 6) = 7.2: apart; a trial without a number takes no part
    assert Gap(1, 3, 13 / 130) in gaps


def test_lower_is_better_turns_the_pairs_round_and_unknown_noise_puts_nothing_apart() -> None:
    ttft = [Estimate(900, 20), Estimate(1200, 30)]
    assert gaps_beyond_noise(ttft, lower_is_better=True) == [Gap(0, 1, 300 / 1200)]
    assert gaps_beyond_noise([Estimate(900), Estimate(1200, 30)]) == []


@pytest.mark.parametrize(("measured_b", "half_width", "seen"), [
    (85.0, 4.2, Seen.CONFIRMED),      # +17.6 % against ±7.0 %: apart, the predicted way
    (97.0, 12.0, Seen.NOT_RESOLVED),  # +3.1 % ±17.5 %: holds both no gap and the predicted +18 %
    (97.0, 4.2, Seen.NOT_THERE),      # +3.1 % ±6.1 %: wholly below the predicted +18 %
    (120.0, 4.2, Seen.REVERSED),      # −16.7 % against ±5.0 %: apart, the other way round
])
def test_a_predicted_gap_is_confirmed_reversed_not_there_or_not_resolved(
        measured_b: float, half_width: float, seen: Seen) -> None:
    predicted = [Estimate(118, 3), Estimate(100, 3)]  # the model: +18 %, beyond its noise
    measured = [Estimate(100, half_width), Estimate(measured_b, half_width)]
    (checked,) = check_predicted(measured, predicted)
    assert checked.predicted == Gap(0, 1, 0.18)
    assert checked.seen is seen, checked
    assert checked.measured_rel == pytest.approx((100 - measured_b) / measured_b)
    assert checked.noise_rel == pytest.approx(math.hypot(half_width, half_width) / measured_b)


def test_only_gaps_the_model_puts_beyond_its_own_noise_are_checked() -> None:
    measured = [Estimate(100, 1), Estimate(80, 1), Estimate(60, 1)]
    # 100 against 95 ±4 each: within the prediction's noise; 60 apart from both
    predicted = [Estimate(100, 4), Estimate(95, 4), Estimate(60, 4)]
    checked = check_predicted(measured, predicted)
    assert [(c.predicted.ahead, c.predicted.behind) for c in checked] == [(0, 2), (1, 2)]
    assert all(c.seen is Seen.CONFIRMED for c in checked)
    # a measured number with no interval never decides: not resolved
    (unknown,) = check_predicted([Estimate(100), Estimate(60, 1)], [Estimate(100, 4), Estimate(60, 4)])
    assert unknown.seen is Seen.NOT_RESOLVED
