"""A point's prediction does not depend on the points predicted before it: a trial's points predicted in
sequence (the sweep's ``(pred)`` column, ``predict=true``) give each point what it gives alone (the search,
the diagnosis). The case that moved by 20 % when the PP loop's phase carried over from the previous point:
Kimi K2, PP8, async depth 16, on the PCIe node, c32 after c8, ramped as a trial ramps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.predict import predict_point, predict_trial
from vocab.load import LoadPoint, RequestSpec

REPO = Path(__file__).resolve().parent.parent
KIMI_PP8 = ["--model-path", str(REPO / "models" / "kimi-k2"), "--pp-size", "8",
            "--pp-async-batch-depth", "16",
            "--sim-hardware", "rtx-pro-6000-pcie-x8", "--sim-step-costs", "auto"]
SPEC = RequestSpec(api="generate", input_len=256, output_len=32)
C8 = LoadPoint(concurrency=8, num_requests=24, ramp_s=3.131, ci_target=0.03)
C32 = LoadPoint(concurrency=32, num_requests=96, ramp_s=8.148, ci_target=0.03)


@pytest.mark.parametrize("argv", [KIMI_PP8, [*KIMI_PP8[:2], "--tp-size", "8", *KIMI_PP8[6:]]],
                         ids=["pp8-depth16", "tp8"])
def test_a_point_predicts_the_same_alone_and_after_others(argv: list[str]) -> None:
    alone = predict_point(argv, C32, SPEC).metrics
    after = predict_trial(argv, [C8, C32], SPEC)[1].metrics
    for key in ("output_tok_s", "ttft_p99_ms", "itl_p50_ms"):
        assert after[key] == pytest.approx(alone[key], rel=0.02), key


def test_points_in_sequence_stay_on_one_clock() -> None:
    first, second = predict_trial(KIMI_PP8, [C8, C32], SPEC)
    assert min(r.send_time for r in second.records) >= max(r.end_time for r in first.records)
