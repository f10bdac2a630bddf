"""A decode batch replayed from a CUDA graph is padded to the next captured size (SGLang's capture list)
and the padded slots are priced as the real work they are; eager forwards and batches beyond the largest
captured graph are priced as they are."""

from __future__ import annotations

import pytest

from simulator.costs import decode_shape, prefill_shape
from simulator.cuda_graphs import capture_sizes, replayed_batch
from simulator.predict import load_config
from tests.conftest import ROOT


def test_the_capture_list_is_sglangs_clipped_to_the_largest() -> None:
    assert capture_sizes(160)[:8] == (1, 2, 4, 8, 12, 16, 24, 32)
    assert capture_sizes(160)[-1] == 160 and capture_sizes(100)[-1] == 100  # always captured itself
    assert capture_sizes(512)[-3:] == (480, 496, 512)
    assert [replayed_batch(n, 160) for n in (1, 3, 5, 13, 17, 160, 161)] == [1, 4, 8, 16, 24, 160, 161]


def _cost(model: str, *extra: str):  # type: ignore[no-untyped-def]
    return load_config(["--model-path", str(ROOT / "models" / model), "--sim-hardware", "h200-nvlink-x8",
                        *extra]).cost


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-30b-a3b"])
def test_a_padded_batch_costs_what_its_graph_runs(model: str) -> None:
    cost = _cost(model, "--cuda-graph-max-bs", "160")
    five = decode_shape([1000] * 5)
    padded = cost.replayed_shape(five)  # eight tokens through the GEMMs, experts and all-reduces
    assert (padded.tokens, padded.seqs, padded.kv_read_tokens) == (8, 5, 5000)  # five attend, as they are
    assert cost.source is not None
    assert cost.gpu_time(0, five) == pytest.approx(cost.source.gpu_time(0, padded))
    eight = decode_shape([1000] * 8)
    assert cost.replayed_shape(eight) == eight  # a captured size is not padded
    assert cost.comm_time(0, five) == pytest.approx(cost.comm_time(0, eight))  # eight rows all-reduced


def test_padded_tokens_route_to_experts_too() -> None:
    cost = _cost("qwen3-30b-a3b", "--cuda-graph-max-bs", "160")
    five = decode_shape([1000] * 5)
    assert cost.source is not None
    moe = cost.source.family_times(0, cost.replayed_shape(five))["moe"]
    assert moe > cost.source.family_times(0, five)["moe"]  # the three padded tokens load experts of their own


def test_eager_forwards_are_not_padded() -> None:
    cost = _cost("qwen3-30b-a3b", "--cuda-graph-max-bs", "16")
    beyond = decode_shape([500] * 17)  # past the largest graph: eager, as it is
    assert not cost.uses_cuda_graph(beyond) and cost.replayed_shape(beyond) == beyond
    prefill = prefill_shape([(700, 0)])
    assert cost.replayed_shape(prefill) == prefill
    off = _cost("qwen3-30b-a3b", "--disable-cuda-graph")
    assert off.replayed_shape(decode_shape([500] * 5)) == decode_shape([500] * 5)
