"""vLLM's compilation settings on the simulated engine playing it: which steps replay full graphs or graph
pieces (``cudagraph_mode``, ``--optimization-level``, ``--enforce-eager``), whether the TP all-reduces are
fused, and what is refused or said to price nothing."""

from __future__ import annotations

import re

import pytest

from simulator.costs import decode_shape, prefill_shape
from simulator.predict import load_config
from simulator.vllm.info import played_info

BASE = ["serve", "models/llama-3.1-70b", "--sim-hardware", "b200-sxm-x8", "--tensor-parallel-size", "8",
        "--sim-vllm-release", "0.19.0", "-q", "fp8"]
FUSED_B200_TP8 = 2**20  # FI_ALLREDUCE_FUSION_MAX_SIZE_MB: 1 MB at 8 GPUs of compute capability 10.0


def served(*flags: str):  # type: ignore[no-untyped-def]
    """The simulated vLLM's configuration for Llama-3.1-70B FP8 at TP8 on B200 with ``flags``."""
    return load_config([*BASE, *flags])


@pytest.mark.parametrize(("flags", "full", "pieces", "fused"), [
    ([], True, True, 0),  # O2: FULL_AND_PIECEWISE; vLLM's default fusion is not priced (docs/simulator.md)
    (["-cc", '{"cudagraph_mode": "PIECEWISE"}'], False, True, 0),
    (["-cc", '{"cudagraph_mode": "full_decode_only"}'], True, False, 0),
    (["-O", "0"], False, False, 0),
    (["-O1"], False, True, 0),
    (["-O1", "-cc", '{"pass_config": {"fuse_allreduce_rms": true}}'], False, True, FUSED_B200_TP8),
    (["--enforce-eager", "-cc", '{"pass_config": {"enable_fi_allreduce_fusion": true}}'], False, False,
     FUSED_B200_TP8),
    (["-cc", '{"pass_config": {"fuse_allreduce_rms": false}}'], True, True, 0),
])
def test_what_each_setting_replays_and_fuses(flags: list[str], full: bool, pieces: bool, fused: int) -> None:
    cost = served(*flags).cost
    assert (not cost.disable_cuda_graph, cost.piecewise, cost.fused_allreduce_bytes) == (full, pieces, fused)


def test_each_mode_prices_the_steps_it_replays() -> None:
    decode, mixed = decode_shape([1500] * 16), prefill_shape([(300, 0)])
    pieces = served("-cc", '{"cudagraph_mode": "PIECEWISE"}').cost
    # a decode step replays pieces, not a full graph: the attention op launched between them
    assert pieces.host_time(0, decode) == pytest.approx(pieces.dispatch_time(0, False, True), rel=1e-12)
    decode_only = served("-cc", '{"cudagraph_mode": "FULL_DECODE_ONLY"}').cost
    default = served().cost
    assert decode_only.stage_time(0, decode) == pytest.approx(default.stage_time(0, decode), rel=1e-12)
    # a mixed step under FULL_DECODE_ONLY runs the compiled model without graphs: every kernel launched
    assert decode_only.stage_time(0, mixed) > 2 * default.stage_time(0, mixed)
    p, hw = decode_only.p, decode_only.hw
    eager = decode_only.stages[0].kernels * (p.host_op_us + hw.kernel_launch_us) * 1e-6
    assert decode_only.host_time(0, mixed) == pytest.approx(eager, rel=1e-12)


def test_the_largest_captured_size_comes_from_the_config_where_the_flag_leaves_it() -> None:
    sizes = served("--max-num-seqs", "64", "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 24]}')
    assert sizes.cost.cuda_graph_max_bs == 24
    flag = served("--max-num-seqs", "64", "--max-cudagraph-capture-size", "32",
                  "-cc", '{"max_cudagraph_capture_size": 16}')
    assert flag.cost.cuda_graph_max_bs == 32
    # clipped to the running requests (vLLM clips to its token budget: not priced so, docs/simulator.md)
    assert served("--max-num-seqs", "4").cost.cuda_graph_max_bs == 4


def test_keys_that_price_nothing_are_said_and_the_mode_is_reported() -> None:
    cfg = served("-cc", '{"cudagraph_mode": "FULL_DECODE_ONLY", "custom_ops": ["+rms_norm"], '
                        '"pass_config": {"enable_noop": true, "enable_fi_allreduce_fusion": true}}')
    assert cfg.warnings == ["--compilation-config keys that price nothing in the simulated engine: "
                            "custom_ops, pass_config.enable_noop"]
    info = played_info(cfg)
    assert info["cudagraph_mode"] == "FULL_DECODE_ONLY" and info["enforce_eager"] is False
    assert played_info(served("--enforce-eager"))["enforce_eager"] is True


@pytest.mark.parametrize(("flags", "says"), [
    (["-cc", '{"cudagraph_mode": "FULL"}'], "cudagraph_mode FULL (full graphs of mixed steps) is not"),
    (["-cc", '{"cudagraph_mode": "SOMETIMES"}'], "cudagraph_mode 'SOMETIMES': valid: NONE, PIECEWISE,"),
    (["-cc", "{cudagraph_mode: NONE}"], "not JSON"),
    (["-cc", '{"cudagraph_capture_sizes": []}'], "cudagraph_capture_sizes: a non-empty list of sizes"),
    (["-O", "5"], "--optimization-level 5: valid: 0, 1, 2, 3"),
])
def test_what_is_refused_in_one_line(flags: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        served(*flags)
