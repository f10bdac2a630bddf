"""The served vLLM runs aiconfigurator-core ships (its systems/silicon_sample.csv, read as installed):
read apart from SGLang's, mapped to a vLLM launch as each source's script ran it, replayed on the simulated
engine playing vLLM, and estimated by AIConfigurator with its vLLM tables."""

from __future__ import annotations

import pytest

from orchestrator.fidelity.catalog import NotModelled
from orchestrator.fidelity.replay import plan
from orchestrator.fidelity.served import aic_estimate, predict_row
from orchestrator.fidelity.silicon import Unreplayable, default_csv, measured_on, read_silicon
from orchestrator.fidelity.silicon_vllm import to_vllm_entry
from orchestrator.fidelity.vllm_launch import played_release

# InferenceX's MiniMax-M2.5 on four H100s with the experts spread (vLLM 0.18.0, measured 2026-03-27)
MINIMAX_H100 = "2026_03_25_minimax_m2_5_h100_sxm_vllm_fp8_agg_1024x8192_c4_tp4_0_ep4_0_215"


@pytest.fixture(scope="module")
def silicon():
    return read_silicon(default_csv(), "vllm")


def _row(rows, ident):
    return next(r for r in rows if r.id == ident or ident in r.duplicates)


def test_the_vllm_rows_are_read_apart_from_sglangs(silicon) -> None:
    rows, clean = silicon
    assert clean.backend_rows == 1345 and clean.disaggregated == 17
    assert clean.distinct == len(rows) == 1345 - 17 - clean.duplicates
    assert {r.backend for r in rows} == {"vllm"}
    assert {r.version for r in rows} >= {"0.11.2", "0.12.0", "0.15.1", "0.16.0", "0.17.0", "0.18.0", "0.19.0"}


def test_a_row_is_launched_as_its_script_launched_it(silicon, tmp_path) -> None:
    rows, _ = silicon
    row = _row(rows, MINIMAX_H100)
    entry, _ = to_vllm_entry(row)
    # minimaxm2.5_fp8_h100.sh: 0.90 of the GPU, 256 sequences, the experts over the TP group
    assert entry.server_args["gpu_memory_utilization"] == 0.9 and entry.server_args["max_num_seqs"] == 256
    p = plan(entry, tmp_path)
    argv = p.argv
    assert argv[:2] == ["serve", argv[1]] and argv[1].endswith("models/minimax-m2.5")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4" and "--enable-expert-parallel" in argv
    assert argv[argv.index("--sim-vllm-release") + 1] == "0.18.0"
    assert argv[argv.index("--max-model-len") + 1] == str(1024 + 8192 + 256)
    assert len(p.requests) == 10 * row.concurrency  # InferenceX's client: 10 requests per stream


def test_what_is_not_modelled_is_said(silicon) -> None:
    rows, _ = silicon
    gpt = next(r for r in rows if "gpt-oss" in r.model)
    with pytest.raises(Unreplayable, match="MXFP4"):
        to_vllm_entry(gpt)
    odd = next(r for r in rows if r.dp > 1)
    odd.dp = odd.tp // 2
    with pytest.raises(Unreplayable, match="one DP rank per GPU"):
        to_vllm_entry(odd)


def test_an_unreleased_build_is_played_as_the_newest_release() -> None:
    assert played_release("nightly-5b8c30d62b754b57")[0] == "0.34.0"
    assert played_release("0.13.0") == ("0.12.0", "vLLM 0.13.0 played as 0.12.0")
    assert played_release("0.19.0") == ("0.19.0", "")


def test_one_row_predicted_and_estimated_side_by_side(silicon) -> None:
    rows, _ = silicon
    row = _row(rows, MINIMAX_H100)
    kind, served = predict_row(row, with_aic=False)
    assert kind == "ok", served
    assert served.parasweep["ttft_ms"] > 0 and served.parasweep["tpot_ms"] > 0
    # a single stream of four: TPOT within a factor of two of the measurement either way, not a match
    assert 0.5 < served.parasweep["tpot_ms"] / row.tpot_ms < 2.0
    est = aic_estimate(row)  # AIConfigurator with its vLLM tables
    assert est.version and (est.tpot_ms is not None or est.why_none)


def test_an_attention_dp_row_runs_one_dp_rank_per_gpu_with_the_experts_over_all(silicon, tmp_path) -> None:
    """InferenceX's DP_ATTENTION runs: --tensor-parallel-size=1 --data-parallel-size=$TP
    --enable-expert-parallel on TP GPUs; the CSV stores TP, the DP ranks, and TP x DP as moe_ep_size."""
    rows, _ = silicon
    row = next(r for r in rows if r.dp == 4 and "MiniMax" in r.model and r.system == "h100_sxm")
    assert (row.tp, row.dp, row.ep) == (4, 4, 16)  # as the CSV records it
    entry, notes = to_vllm_entry(row)
    par = entry.parallelism
    assert entry.gpu_count == 4 and (par.tp, par.dp, par.ep) == (1, 4, 4)
    assert any("--data-parallel-size 4" in n for n in notes)
    assert "DP4 EP4" in row.family
    argv = plan(entry, tmp_path).argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert argv[argv.index("--data-parallel-size") + 1] == "4" and "--enable-expert-parallel" in argv
    entry.parallelism.ep = 2  # experts over some of the engine's GPUs: vLLM has no such layout
    with pytest.raises(NotModelled, match="spreads them over every GPU"):
        plan(entry, tmp_path)


def test_the_b200_script_s_moe_kernels_follow_its_environment(silicon, tmp_path) -> None:
    """minimaxm2.5_fp8_b200.sh switched FlashInfer's and DeepGEMM's MoE off (VLLM_USE_FLASHINFER_MOE_FP8=0,
    VLLM_MOE_USE_DEEP_GEMM=0) until bddbf403 (2026-04-03): Triton's kernels, then vLLM's own choice."""
    rows, _ = silicon
    b200 = [r for r in rows if "MiniMax" in r.model and r.system == "b200_sxm" and r.precision == "fp8"
            and r.dp == 1]
    before = next(r for r in b200 if measured_on(r) < "2026-04-03")
    after = next(r for r in b200 if measured_on(r) >= "2026-04-03")
    argv = plan(to_vllm_entry(before)[0], tmp_path).argv
    assert argv[argv.index("--moe-backend") + 1] == "triton"
    assert "--moe-backend" not in plan(to_vllm_entry(after)[0], tmp_path).argv  # auto: FlashInfer's


def test_the_h200_script_spread_the_experts_on_every_run(silicon, tmp_path) -> None:
    # minimaxm2.5_fp8_h200.sh from 2026-03-13: --enable-expert-parallel whenever EP_SIZE -ge 1, always true
    rows, _ = silicon
    row = _row(rows, "minimaxm2_5_h200_vllm_fp8_agg_8192x1024_c8_cfg637")
    assert (row.tp, row.ep) == (8, 1)  # as the CSV records it
    entry, notes = to_vllm_entry(row)
    assert entry.parallelism.ep == 8 and any("EP_SIZE -ge 1" in n for n in notes)
    assert "--enable-expert-parallel" in plan(entry, tmp_path).argv
