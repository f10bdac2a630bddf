"""What a predicted change is called, by the goal of the finding it answers: throughput for capacity
findings, one p99 latency for the findings about stalls (ITL) and queueing (TTFT)."""

from __future__ import annotations

import pytest

from orchestrator.prediction.verdict import verdict


@pytest.mark.parametrize(("pct", "expected"), [
    ({"output_tok_s": 40.0, "ttft_p99_ms": 10.0, "itl_p99_ms": 5.0}, "helps"),
    ({"output_tok_s": 40.0, "itl_p99_ms": 60.0}, "trade-off"),       # bought with a larger ITL loss
    ({"output_tok_s": 1.0, "ttft_p99_ms": -30.0}, "latency only"),
    ({"output_tok_s": -8.0}, "worse"),
    ({"output_tok_s": 2.0, "itl_p99_ms": 3.0}, "negligible"),
])
def test_throughput_goal(pct: dict[str, float], expected: str) -> None:
    assert verdict(pct) == expected


@pytest.mark.parametrize(("pct", "expected"), [
    # ITL p99 -74 % for TTFT p99 +13 %: the stall is gone at a smaller cost than it had
    ({"output_tok_s": 3.0, "itl_p99_ms": -74.0, "ttft_p99_ms": 13.0}, "helps"),
    ({"output_tok_s": 3.0, "itl_p99_ms": -20.0, "ttft_p99_ms": 45.0}, "trade-off"),  # TTFT pays more
    ({"output_tok_s": -12.0, "itl_p99_ms": -50.0}, "trade-off"),                     # throughput pays
    ({"output_tok_s": 0.0, "itl_p99_ms": -4.0}, "negligible"),
    ({"output_tok_s": 0.0, "itl_p99_ms": 25.0}, "worse"),
])
def test_itl_goal(pct: dict[str, float], expected: str) -> None:
    assert verdict(pct, goal="itl_p99_ms") == expected


def test_ttft_goal_reads_ttft_and_weighs_itl() -> None:
    wider = {"output_tok_s": 50.0, "ttft_p99_ms": -50.0, "itl_p99_ms": -24.0}
    assert verdict(wider, goal="ttft_p99_ms") == "helps"
    assert verdict({"ttft_p99_ms": -15.0, "itl_p99_ms": 30.0}, goal="ttft_p99_ms") == "trade-off"
    # the same numbers judged on throughput: a latency change only
    assert verdict({"ttft_p99_ms": -50.0}, goal="throughput") == "latency only"
