"""vLLM's data parallelism in the simulated engine playing it: a dense model's DP ranks are engine cores
of their own; a MoE model's run in lockstep with the experts over every rank's GPUs, each rank with
vLLM's scheduler and its own caps."""

from __future__ import annotations

import re

import pytest

from simulator.attention_dp.costs import LockstepCosts
from simulator.costs import decode_shape, prefill_shape
from simulator.lockstep import LockstepGroup
from simulator.predict import VirtualTrial, load_config
from simulator.vllm.scheduler import VLLMReplica
from vocab.load import LoadPoint, RequestSpec

DENSE = "models/llama-3.1-8b"
MOE = "models/qwen3-30b-a3b"


def _serve(model: str, *flags: str) -> list[str]:
    return ["serve", model, "--sim-hardware", "h100-sxm-x8", "--seed", "1", *flags]


def test_a_dense_model_s_dp_ranks_are_engine_cores_of_their_own_each_with_its_caps() -> None:
    one = load_config(_serve(DENSE, "--max-num-seqs", "16"))
    cfg = load_config(_serve(DENSE, "--data-parallel-size", "2", "--max-num-seqs", "16"))
    assert (cfg.dp, cfg.schedulers, cfg.lockstep) == (2, 2, None)
    # vLLM's caps are each engine core's, not the server's split over its ranks
    assert (cfg.max_running_requests, cfg.chunked_prefill_size) == (16, one.chunked_prefill_size)
    assert cfg.max_total_num_tokens == one.max_total_num_tokens
    assert cfg.router == "total_requests"  # the API server sends a request to the least-loaded rank
    trial = VirtualTrial(cfg)
    assert len(trial.replicas) == 2 and all(isinstance(r, VLLMReplica) for r in trial.replicas)
    result = trial.run_point(LoadPoint(concurrency=24, num_requests=48),
                             RequestSpec(api="completions", input_len=300, output_len=48, seed=2))
    assert result.metrics["completed"] == 48
    peaks = [r.admission.peak_pool_used for r in trial.replicas]
    assert peaks == [12, 12]  # 24 streams balanced over the two, under each one's 16


def test_a_moe_model_s_dp_ranks_step_in_lockstep_with_the_experts_over_every_gpu() -> None:
    cfg = load_config(_serve(MOE, "--data-parallel-size", "4", "--enable-expert-parallel",
                             "--max-num-seqs", "8", "--max-num-batched-tokens", "2048"))
    assert cfg.attention_dp is not None and cfg.attention_dp.ranks == 4
    assert (cfg.tp, cfg.ep, cfg.attention_dp.attn_tp, cfg.schedulers) == (4, 4, 1, 4)
    assert cfg.attention_dp.dp_lm_head  # each rank's LM head on its own GPU
    assert (cfg.max_running_requests, cfg.chunked_prefill_size) == (8, 2048)  # per rank, unsplit
    assert not cfg.warnings  # none of SGLang's words about splitting the caps
    trial = VirtualTrial(cfg)
    ranks = trial.replicas
    assert all(isinstance(r, VLLMReplica) for r in ranks)
    group = ranks[0].lockstep
    assert isinstance(group, LockstepGroup) and all(r.lockstep is group for r in ranks)
    result = trial.run_point(LoadPoint(concurrency=6, num_requests=24),
                             RequestSpec(api="completions", input_len=400, output_len=64, seed=4))
    assert result.metrics["completed"] == 24 and result.metrics["errors"] == 0
    # 6 streams over 4 ranks: two ranks hold two at times, and every rank's GPU is busy for every
    # forward of the group, its own batch or a dummy one
    end = trial.sim.now
    busy = [r.busy[0].busy_total(end) for r in ranks]
    assert min(busy) > 0
    assert max(busy) == pytest.approx(min(busy), rel=1e-9)
    # without --enable-expert-parallel the experts are sharded over the same GPUs instead
    sharded = load_config(_serve(MOE, "--data-parallel-size", "4"))
    assert (sharded.tp, sharded.ep, sharded.attention_dp.ranks) == (4, 1, 4)  # type: ignore[union-attr]


def test_a_lockstep_step_no_full_graph_replays_is_priced_as_graph_pieces_up_to_the_captured_size() -> None:
    cfg = load_config(_serve(MOE, "--data-parallel-size", "2", "--enable-expert-parallel",
                             "--max-num-seqs", "64"))
    costs = cfg.lockstep
    assert isinstance(costs, LockstepCosts)
    g = costs.group_cost
    assert g.piecewise and g.cuda_graph_max_bs == 64  # min(2 x max_num_seqs, 512), then max_num_seqs
    small, large = prefill_shape([(60, 0)]), prefill_shape([(1000, 0)])
    pieces = costs.step([small, None])
    assert not pieces.graph
    assert pieces.dispatch == pytest.approx(g.dispatch_time(0, False, True) + costs.sync_s, rel=1e-12)
    work = pieces.attention + pieces.shared + pieces.comm
    assert pieces.total == pytest.approx(max(work, pieces.dispatch), rel=1e-12)
    eager = costs.step([large, None])  # above the largest captured size: every kernel from Python
    kernels = g.stages[0].kernels * (g.p.host_op_us + g.hw.kernel_launch_us) * 1e-6
    assert eager.dispatch == pytest.approx(kernels + costs.sync_s, rel=1e-12)
    decode = costs.step([decode_shape([500] * 8), decode_shape([500] * 3)])
    assert decode.graph  # every rank decoding within the captured sizes: the full graph
    # --enforce-eager: no pieces
    eager_cfg = load_config(_serve(MOE, "--data-parallel-size", "2", "--enable-expert-parallel",
                                   "--max-num-seqs", "64", "--enforce-eager"))
    assert eager_cfg.lockstep is not None
    assert eager_cfg.lockstep.step([small, None]).dispatch > pieces.dispatch


@pytest.mark.parametrize(("model", "flags", "says"), [
    (MOE, ["--data-parallel-size", "2", "--pipeline-parallel-size", "2"],
     "--data-parallel-size > 1 with --pipeline-parallel-size > 1 on a MoE model is not modelled"),
    (DENSE, ["--data-parallel-size", "0"], "--data-parallel-size must be >= 1, got 0"),
])
def test_what_is_refused_with_data_parallelism(model: str, flags: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        load_config(_serve(model, *flags))
