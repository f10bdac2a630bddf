"""The changes the diagnosis and the end of a sweep try around a trial: every other split of the same
GPUs, with nothing ruled out by the link between them; and what "better than every trial" means."""

from __future__ import annotations

from orchestrator.config.schema import ParasweepConf
from orchestrator.prediction.at_load import Load, Predicted
from orchestrator.prediction.neighbourhood import ATTN_DP_KEY, layouts
from orchestrator.search.instead import _judge_one
from vocab.hardware import load_hardware


def config(model: str, hardware: str, tp: int = 1, pp: int = 1, dp: int = 1, depth: int = 0,
           micro_batch: int | None = None) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = model, f"models/{model}"
    cfg.hardware = load_hardware(hardware)
    cfg.tp.size, cfg.pp.size, cfg.dp.size = tp, pp, dp
    cfg.pp.async_depth, cfg.pp.micro_batch_size = depth, micro_batch
    return cfg


def splits(changes: list[dict]) -> set[tuple[int, int, int, int]]:
    """The aggregated splits among ``changes`` (tp, pp, dp, ep)."""
    return {(c.get("tp.size", 1), c.get("pp.size", 1), c.get("dp.size", 1), c.get("ep.size", 1))
            for c in changes
            if ATTN_DP_KEY not in c and "pd.prefill.workers" not in c and "spec.algorithm" not in c}


def deployments(changes: list[dict], tp: int = 8) -> set[tuple[int, int, int]]:
    """The disaggregated deployments among ``changes`` of a trial of ``tp``: (prefill servers, decode
    servers, the decode servers' TP)."""
    return {(c["pd.prefill.workers"], c["pd.decode.workers"], c.get("pd.decode.tp", c.get("tp.size", tp)))
            for c in changes if "pd.prefill.workers" in c}


def test_every_split_of_the_same_gpus_over_pcie_too() -> None:
    # Kimi K2 (MoE) in PP8 on the PCIe box: TP8 is tried (no rule of thumb keeps TP off PCIe), with and
    # without its experts over the TP group; the trial's own split is not
    around = layouts(config("kimi-k2", "rtx-pro-6000-pcie-x8", pp=8, depth=4, micro_batch=4))
    found = splits(around)
    assert (8, 1, 1, 1) in found and (8, 1, 1, 8) in found and (4, 2, 1, 4) in found
    assert (1, 8, 1, 1) not in found
    assert all(tp * pp * dp == 8 for tp, pp, dp, _ in found)
    # ten tp x pp x dp splits of 8, the current one left out, and six with experts over tp > 1
    assert len(found) == 9 + 6
    # without the pipeline its knobs mean nothing: depth back to 0, the cap to the engine's default
    tp8 = next(c for c in around if c.get("tp.size") == 8 and "ep.size" not in c and ATTN_DP_KEY not in c)
    assert tp8 == {"tp.size": 8, "pp.size": 1, "pp.async_depth": 0, "pp.micro_batch_size": None}
    # attention DP is named, for a MoE model only
    assert [c[ATTN_DP_KEY] for c in around if ATTN_DP_KEY in c] == [8]


def test_on_vllm_the_experts_span_every_dp_rank_and_no_moe_dp_rank_runs_a_pipeline() -> None:
    cfg = config("qwen3-30b-a3b", "h100-sxm-x8", tp=8)
    cfg.engine.name = "sim-vllm"
    found = splits(layouts(cfg))
    assert all(ep in (1, tp * dp) for tp, _, dp, ep in found)  # vLLM's only expert layouts
    assert (1, 1, 8, 8) in found and (2, 1, 4, 8) in found and (2, 1, 4, 1) in found
    assert not any(pp > 1 and dp > 1 for _, pp, dp, _ in found)
    assert (1, 8, 1, 1) in found and (2, 4, 1, 2) in found  # pipelines without DP stay
    assert not any(ATTN_DP_KEY in c for c in layouts(cfg))  # SGLang's key: vLLM's DP splits stand for it


def test_a_dense_model_gets_no_expert_or_attention_dp_splits() -> None:
    around = layouts(config("llama-3.1-70b", "h100-sxm-x8", tp=4))
    assert all("ep.size" not in c and ATTN_DP_KEY not in c for c in around)
    assert splits(around) == {(1, 1, 4, 1), (1, 2, 2, 1), (1, 4, 1, 1), (2, 1, 2, 1), (2, 2, 1, 1)}
    assert layouts(config("llama-3.1-8b", "h200-nvlink-x8")) == []  # one GPU: nothing else to split


def test_disaggregated_serving_on_the_same_gpus_is_a_layout_too() -> None:
    # Llama-3.1-70B on TP8: eight servers of one GPU, four of two or two of four, split every way into
    # prefill and decode servers (at least one of each)
    around = layouts(config("llama-3.1-70b", "h100-sxm-x8", tp=8))
    assert deployments(around) == ({(p, 8 - p, 1) for p in range(1, 8)}
                                   | {(p, 4 - p, 2) for p in range(1, 4)} | {(1, 1, 4)})
    one = next(c for c in around if c.get("pd.enabled") and c["tp.size"] == 4)
    assert one == {"pd.enabled": True, "pd.prefill.workers": 1, "pd.decode.workers": 1, "tp.size": 4}
    # a disaggregated trial (1P1D of TP4): every aggregated split of its 8 GPUs, its own TP8 included, and
    # every other deployment; a role's own layout gives way to the one tried
    cfg = config("llama-3.1-70b", "h100-sxm-x8", tp=4)
    cfg.pd.enabled, cfg.pd.decode.tp = True, 4
    around = layouts(cfg)
    aggregated = [c for c in around if "pd.prefill.workers" not in c and ATTN_DP_KEY not in c]
    assert (8, 1, 1, 1) in splits(around) and all(c["pd.enabled"] is False for c in aggregated)
    assert (1, 1, 4) not in deployments(around, 4) and (2, 2, 2) in deployments(around, 4)
    # the decode servers' TP is their own key: the deployment sets both roles' there, not the trial's
    two = next(c for c in around if (c.get("pd.prefill.workers"), c.get("pd.decode.workers")) == (2, 2))
    assert two == {"pd.prefill.workers": 2, "pd.decode.workers": 2, "pd.prefill.tp": 2, "pd.decode.tp": 2}
    # two nodes: servers up to a node wide, none across
    cfg = config("llama-3.1-70b", "h100-sxm-x8-2nodes-ib", tp=8, dp=2)
    assert max(t for _, _, t in deployments(layouts(cfg))) == 8 and (1, 1, 8) in deployments(layouts(cfg))


def predicted(name: str, **by_load: tuple[float, float, float, float]) -> Predicted:
    """Metrics per load: (tok/s, its relative 95 % interval, TTFT p99, ITL p99)."""
    return Predicted({"name": name}, {label: {"output_tok_s": t, "output_tok_s_ci95_rel": ci,
                                              "ttft_p99_ms": ttft, "itl_p99_ms": itl}
                                      for label, (t, ci, ttft, itl) in by_load.items()})


LOADS = [Load.closed(8), Load.closed(32)]


def test_better_than_every_trial_means_no_cost_anywhere_and_a_gain_beyond_noise() -> None:
    trials = {"#0": predicted("pp8", c8=(75, 0.1, 780, 560), c32=(160, 0.2, 890, 770)),
              "#1": predicted("pp8 d4", c8=(88, 0.1, 610, 540), c32=(155, 0.2, 900, 800))}
    tp8 = predicted("tp8", c8=(181, 0.16, 120, 125), c32=(384, 0.77, 1540, 47))
    assert _judge_one(tp8, trials, LOADS, {})
    # a gain bought with a larger latency loss at one load is a trade-off: not recommended
    slow_ttft = predicted("x", c8=(181, 0.1, 120, 125), c32=(200, 0.1, 2000, 47))
    assert not _judge_one(slow_ttft, trials, LOADS, {})
    # a gain only within the noise of both windows is not enough
    noisy = predicted("y", c8=(90, 0.5, 600, 500), c32=(170, 0.5, 880, 760))
    assert not _judge_one(noisy, trials, LOADS, {})
    # within the sweep's SLOs: a TTFT p99 over 1 s at c32, which every trial meets, rules it out
    assert not _judge_one(tp8, trials, LOADS, {"ttft_p99_ms": 1000})
    assert _judge_one(tp8, trials, LOADS, {"itl_p99_ms": 600})  # the trials miss it at c32, tp8 does not


def test_a_finding_about_the_measurement_is_not_answered_with_a_layout() -> None:
    from orchestrator.prediction.at_load import closed_point
    from orchestrator.trial.advice import check_findings
    from vocab.findings import Finding

    cfg = config("kimi-k2", "rtx-pro-6000-pcie-x8", pp=8)
    cfg.engine.name = "sim"
    cfg.workload.concurrency = [32]
    fell_behind = Finding("client_bound", "critical", "The load generator fell behind at c32", "valid=0",
                          "Do not read those points as server numbers.", point="c32")
    assert check_findings([fell_behind], cfg, [closed_point(32)]) == [fell_behind]


def test_a_speculative_trial_is_tried_without_speculation_and_with_one_draft_step() -> None:
    cfg = config("llama-3.1-8b", "h100-sxm-x8", tp=2)
    cfg.spec.algorithm = "eagle3"
    changes = layouts(cfg)
    assert {"spec.algorithm": "none"} in changes
    assert {"spec.num_steps": 1, "spec.topk": 1, "spec.num_draft_tokens": 2} in changes
    # a pipeline runs without speculation (SGLang refuses both together as parasweep launches it)
    assert all(c.get("spec.algorithm") == "none" for c in changes if c.get("pp.size", 1) > 1)
    cfg.spec.num_steps, cfg.spec.topk = 1, 1
    assert {"spec.num_steps": 1, "spec.topk": 1, "spec.num_draft_tokens": 2} not in layouts(cfg)
    cfg.spec.algorithm = "none"
    assert all("spec.algorithm" not in c for c in layouts(cfg))
