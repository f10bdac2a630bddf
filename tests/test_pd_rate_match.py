"""The static rate match offline estimators price a disaggregated deployment with, on the simulator's
step costs: each role at its own batch under its bound, the smaller side derated (docs/disaggregation.md
sets it beside the search's answer: benchmarks/pd_rate_match.py)."""

from __future__ import annotations

import pytest

from orchestrator.prediction.modelled import apply_change, configured_deployment
from simulator.disagg.rate_match import DECODE_DERATE, PREFILL_DERATE, TTFT_CORRECTION, rate_match
from simulator.estimates import decode_step, static_prefill_s
from simulator.predict_disagg import PDLayout
from tests.test_pd_search import config


def layout(option: str, tp: int) -> PDLayout:
    base = config("llama-3.1-70b", "h100-sxm-x8-2nodes-ib", tp=8)
    return configured_deployment(*apply_change(base, {"pd": option, "tp.size": tp}))


def test_each_role_at_its_batch_and_the_smaller_side_derated() -> None:
    one = layout("1p3d", 4)
    assert one.prefill is not None
    match = rate_match(one.prefill, one.decode, 1, 3, 2000, 200, 2.0, 0.040)
    # the prefill side: a static batch whose corrected forward meets the TTFT bound, at its best rate
    forward = static_prefill_s(one.prefill, match.prefill_batch, 2000)
    assert match.prefill_s == forward and TTFT_CORRECTION * forward <= 2.0
    assert match.prefill_seq_s == pytest.approx(match.prefill_batch / forward)
    # the decode side: the largest batch (within the pool) whose step meets the ITL bound
    step = decode_step(one.decode, match.decode_batch, 2100).step_s
    assert match.decode_step_s == step <= 0.040
    assert 2 * match.decode_batch * 2200 > one.decode.max_total_num_tokens or \
        decode_step(one.decode, 2 * match.decode_batch, 2100).step_s > 0.040
    assert match.decode_seq_s == pytest.approx(match.decode_batch / (199 * step))
    sides = (1 * match.prefill_seq_s * PREFILL_DERATE, 3 * match.decode_seq_s * DECODE_DERATE)
    assert match.seq_s == pytest.approx(min(sides)) and match.output_tok_s == pytest.approx(200 * min(sides))
    assert match.bound_by == ("prefill" if sides[0] <= sides[1] else "decode")
    # three prefill servers: the prefill side three times as fast
    three = rate_match(one.prefill, one.decode, 3, 1, 2000, 200, 2.0, 0.040)
    assert three.prefill_seq_s == match.prefill_seq_s and three.seq_s == pytest.approx(
        min(3 * sides[0], sides[1] / 3))
    # a TTFT bound below one prompt's corrected forward: no prefill rate at all
    below = 0.5 * TTFT_CORRECTION * static_prefill_s(one.prefill, 1, 2000)
    tight = rate_match(one.prefill, one.decode, 1, 3, 2000, 200, below, 0.040)
    assert (tight.prefill_batch, tight.seq_s) == (0, 0.0)
