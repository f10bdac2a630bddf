"""vLLM's published PP-vs-TP pairs (data/published/vllm_pp.jsonl), each run replayed on the simulated
engine playing vLLM, and the predicted order of the two layouts against the measured one."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import UserError
from orchestrator.fidelity.pairs import DEFAULT_PAIRS, judge, read_pairs
from simulator.predict import load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pairs():
    return read_pairs(ROOT / DEFAULT_PAIRS)


def test_the_shipped_pairs_are_vllm_runs_with_their_sources(pairs) -> None:
    assert set(pairs) == {"vllm-substratus-l4", "vllm-llama31-405b-ib"}
    for entries in pairs.values():
        assert len(entries) == 2 and all(e.parasweep["engine"] == "vllm" for e in entries)
        assert all(e.source_url.startswith("https://") for e in entries)
        assert {e.parallelism.pp for e in entries} != {1}  # a PP layout against another


def test_llama_405b_on_two_h100_nodes_pipeline_ahead_of_tensor_parallelism(pairs) -> None:
    # vLLM's blog: PP2 x TP8 5.08 req/s against TP16's 4.52 with InfiniBand between the nodes
    pair = judge("vllm-llama31-405b-ib", pairs["vllm-llama31-405b-ib"])
    assert pair.measured_order == ["TP8 PP2", "TP16"]
    assert pair.right is True, pair


def test_llama_70b_on_eight_l4s_four_stages_of_tp2_ahead_of_two_of_tp4(pairs) -> None:
    # Substratus: PP4 x TP2 307.6 output tok/s against PP2 x TP4's 261.2 over PCIe; what orders them is the
    # all-reduce among four Ada GPUs on PCIe (NCCL's, several times two GPUs' custom all-reduce)
    pair = judge("vllm-substratus-l4", pairs["vllm-substratus-l4"])
    assert pair.measured_order == ["TP2 PP4", "TP4 PP2"]
    assert pair.right is True, pair


def test_a_vllm_layout_wider_than_a_node_takes_the_nodes_it_needs() -> None:
    model = str(ROOT / "models" / "llama-3.1-405b")
    cfg = load_config(["serve", model, "--sim-hardware", "h100-sxm-x8-2nodes-ib", "-tp", "16"])
    assert (cfg.tp, cfg.args.nnodes) == (16, 2)
    with pytest.raises(ValueError, match="exceeds"):  # one node's profile has no second node
        load_config(["serve", model, "--sim-hardware", "h100-sxm-x8", "--tensor-parallel-size", "16"])


def test_a_file_that_is_not_a_corpus_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    with pytest.raises(UserError, match=r"^--pairs .*bad\.jsonl: cannot read it as a corpus of entries"):
        read_pairs(bad)
