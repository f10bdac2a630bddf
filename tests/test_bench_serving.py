"""bench_serving's accounting (``workloads/bench_serving.py``): the requests it sends, when, and what it
prints. The length sampling is held to the token totals published runs printed (the corpus in
data/published/, each entry with its source); the metric definitions to records whose answer follows
from the definition alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.fidelity.corpus import read_corpus
from tests.conftest import ROOT
from vocab.records import RequestRecord
from workloads.bench_serving import (
    arrival_offsets,
    bench_metrics,
    random_lengths,
    sharegpt_lengths,
)

CORPUS = ROOT / "data" / "published" / "sglang.jsonl"


def _random_runs() -> list:
    """Published bench_serving runs of the random dataset that printed their token totals."""
    out = []
    for e in read_corpus(CORPUS):
        w, m = e.workload, e.numbers()
        if (e.workload.tool.startswith("sglang.bench_serving") and w.dataset.startswith("random")
                and "total_input_tokens" in m and "total_output_tokens" in m):
            out.append(e)
    return out


RANDOM_RUNS = _random_runs()


def test_the_corpus_has_random_runs_with_printed_totals() -> None:
    assert len(RANDOM_RUNS) >= 8  # DataCrunch, the cookbook, llm-ie, PR #1060, ...


@pytest.mark.parametrize("entry", RANDOM_RUNS, ids=lambda e: e.id)
def test_random_lengths_reproduce_the_printed_token_totals(entry) -> None:  # type: ignore[no-untyped-def]
    w, m = entry.workload, entry.numbers()
    rng = np.random.RandomState(w.seed if w.seed is not None else 1)
    ins, outs = random_lengths(w.num_prompts, w.random_input_len, w.random_output_len,
                               w.random_range_ratio or 0.0, rng)
    assert ins.sum() == pytest.approx(m["total_input_tokens"], rel=0.02)
    assert outs.sum() == pytest.approx(m["total_output_tokens"], rel=0.02)


def test_range_ratio_zero_means_one_to_the_length_and_one_means_fixed() -> None:
    ins, outs = random_lengths(5000, 100, 50, 0.0, np.random.RandomState(1))
    assert ins.min() == 1 and ins.max() == 100 and outs.min() == 0 and outs.max() == 50
    ins, outs = random_lengths(50, 100, 50, 1.0, np.random.RandomState(1))
    assert set(ins) == {100} and set(outs) == {50}


def test_an_infinite_rate_sends_everything_at_once_and_a_rate_spaces_the_sends() -> None:
    assert not arrival_offsets(100, math.inf, np.random.RandomState(1)).any()
    offsets = arrival_offsets(20_000, 4.0, np.random.RandomState(1))
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
    assert np.diff(offsets).mean() == pytest.approx(0.25, rel=0.03)


def test_sharegpt_sampling_skips_what_the_tool_skips() -> None:
    pairs = [(3, 100), (100, 3), (1025, 10), (1000, 1049), (10, 20), (500, 500)] * 10
    ins, outs = sharegpt_lengths(20, pairs, seed=1)
    assert set(zip(ins.tolist(), outs.tolist(), strict=True)) == {(10, 20), (500, 500)}
    with pytest.raises(ValueError, match="only 20 of the 21"):
        sharegpt_lengths(21, pairs, seed=1)


def _record(send: float, chunks: list[tuple[float, int]], tokens_asked: int) -> RequestRecord:
    r = RequestRecord(point="p", index=0, send_time=send, first_token_time=chunks[0][0],
                      end_time=chunks[-1][0], input_tokens=10, output_tokens=tokens_asked)
    r.chunk_times = [t for t, _ in chunks]
    r.chunk_tokens = [k for _, k in chunks]
    return r


def test_bench_metrics_follow_the_tools_definitions() -> None:
    # one request: first token at 0.1 s, then one token every 0.02 s for 3 tokens; another sent at 1 s
    # whose second chunk carries 2 tokens after 0.04 s
    a = _record(0.0, [(0.1, 1), (0.12, 1), (0.14, 1), (0.16, 1)], 4)
    b = _record(1.0, [(1.2, 1), (1.24, 2)], 3)
    m = bench_metrics([a, b])
    assert m["completed"] == 2
    assert m["duration_s"] == pytest.approx(1.24)  # first send to last response
    assert m["output_throughput"] == pytest.approx(7 / 1.24)
    assert m["mean_ttft_ms"] == pytest.approx(150.0)
    # TPOT per request: (e2e - ttft) / (output - 1)
    assert m["median_tpot_ms"] == pytest.approx((20.0 + 20.0) / 2)
    # ITL per token: b's chunk of 2 tokens after 40 ms counts two gaps of 20 ms
    assert m["mean_itl_ms"] == pytest.approx(20.0)
    assert m["concurrency"] == pytest.approx((0.16 + 0.24) / 1.24)
