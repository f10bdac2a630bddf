"""The diagnosis end to end on scenarios whose truth is known by construction: each trial is run on the
simulated engine in virtual time (its telemetry summaries come from the simulator's power model,
through the same names NVML's do), diagnosed, and every suggestion searched for and checked by
prediction: the finding's own knobs and every other layout of the same GPUs, at the finding's point.

Each rule fires on the scenario built for it and a healthy trial stays quiet; every suggested change
carries its predicted effect and is the one the prediction ranks first, whatever the layout: TP8 for
Kimi K2's pipeline over PCIe, a pipeline across two nodes for a TP group that would span them. On a
dense model split into 8 pipeline stages, decoding long outputs, the micro-batch change is still
predicted not to help (decode of a dense model reads the same weights however the batch is split).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.diagnose import diagnose
from analysis.report import advice_text
from orchestrator.config.schema import ParasweepConf
from orchestrator.prediction.verdict import MIN_GAIN, gain
from orchestrator.trial.advice import check_findings
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan
from orchestrator.trial.session import VirtualSession
from orchestrator.trial.summary import trial_facts
from vocab.findings import Finding
from vocab.hardware import load_hardware
from vocab.telemetry import GpuSource

# each scenario predicts the finding's changes and every layout of its GPUs on a pool of processes
pytestmark = pytest.mark.slow


def scenario(model: str, hardware: str, tp: int = 1, pp: int = 1, concurrency: int = 8, input_len: int = 256,
             output_len: int = 32, micro_batch: int | None = None, **server: object) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = model, f"models/{model}"
    cfg.hardware = load_hardware(hardware)
    cfg.tp.size, cfg.pp.size, cfg.pp.micro_batch_size = tp, pp, micro_batch
    cfg.workload.concurrency = [concurrency]
    cfg.workload.input_len, cfg.workload.output_len = input_len, output_len
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 2, 1
    for key, value in server.items():
        setattr(cfg.server, key, value)
    return cfg


def predicted_findings(cfg: ParasweepConf, tmp_path: Path) -> list[Finding]:
    """The trial ``cfg`` predicted in virtual time, diagnosed, every suggestion checked by prediction."""
    plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(0, "scenario", tmp_path / "trial", ()))
    with VirtualSession(plan) as session:
        results = [session.run_point(p, plan.spec, tmp_path / "records.jsonl", lambda done, total: None)
                   for p in plan.points]
    assert session.gpu.source is GpuSource.SIMULATED
    facts = trial_facts(cfg, session.resolved, results, {}, session.gpu.source, "sim-predict")
    assert facts.engine == "sim-predict"
    return check_findings(diagnose(facts), cfg, plan.points)


def diagnosed(cfg: ParasweepConf, tmp_path: Path) -> dict[str, Finding]:
    findings = predicted_findings(cfg, tmp_path)
    for f in findings:
        if f.id != "client_bound":  # advice about the measurement itself has no config change
            assert f.predicted_effect, f  # every suggestion was predicted before it was made
            assert "prediction, not a measurement" in f.predicted_effect["source"]
        if f.change:
            effect = f.predicted_effect
            assert effect["verdict"] == "helps", f
            # the change that helps most of every one tried, at the finding's own load (or, on throughput,
            # one within the model's error of it on fewer GPUs or earlier in the rule's order: a
            # difference the model cannot resolve crowns nothing): never a load change
            helping = [t for t in effect["tried"] if t["verdict"] == "helps"]
            most = max(gain(t, f.goal) for t in helping)
            if f.goal == "throughput":
                ratio = [1 + t["change_pct"]["output_tok_s"] / 100 for t in helping]
                assert 1 + effect["change_pct"]["output_tok_s"] / 100 >= max(ratio) * (1 - MIN_GAIN)
            else:
                assert gain(effect, f.goal) == most
            assert "workload.concurrency" not in f.change
        assert "parasweep_sim" not in f.evidence
    return {f.id: f for f in findings}


def tried(finding: Finding, change: dict[str, object]) -> dict[str, object]:
    """The prediction of one change among those tried for ``finding``."""
    return next(t for t in finding.predicted_effect["tried"] if t["change"] == change)


def test_a_healthy_trial_is_quiet(tmp_path: Path) -> None:
    # 8B on one H200 at C=32: the GPU is busy, nothing queues, the KV pool is nearly empty
    assert diagnosed(scenario("llama-3.1-8b", "h200-nvlink-x8", concurrency=32), tmp_path) == {}


def test_dense_pp8_gets_no_micro_batch_suggestion(tmp_path: Path) -> None:
    # decode-dominated (256 output tokens): splitting the batch re-reads the same weights, so the
    # model predicts no throughput gain (only a shorter TTFT); a layout that helps is suggested instead
    found = diagnosed(scenario("llama-3.1-70b", "h100-sxm-x8", pp=8, concurrency=8, output_len=256),
                      tmp_path)
    micro = found["too_few_microbatches"]  # the fact stands: one micro-batch for 8 stages
    assert micro.point == "c8"
    assert all("pp.micro_batch_size" not in f.change for f in found.values()), found
    rejected = micro.predicted_effect["instead_of"]
    assert rejected["change"] == {"pp.micro_batch_size": 1}
    assert rejected["verdict"] != "helps" and rejected["change_pct"]["output_tok_s"] < 5
    assert "is predicted not to help" in micro.suggestion and "Set tp.size=" in micro.suggestion
    assert "simulated GPU telemetry, not measured" in found["pp_bubble"].evidence  # read from its power


def test_kimi_pp8_gets_the_micro_batch_suggestion(tmp_path: Path) -> None:
    cfg = scenario("kimi-k2", "rtx-pro-6000-pcie-x8", pp=8, concurrency=32)
    # The roofline's verdict: more micro-batches raise the throughput by about a third (each of the four
    # pays every stage's host work per micro-batch, and the last stage idles through its host work
    # between forwards at depth 0, docs/simulator.md, "What each stage's host does"). In a steady
    # closed loop (streams ramped in, the window after the ramp) it also lengthens the ITL tail (new
    # streams' prefills interrupt four decoding micro-batches instead of one), so it may come back as a
    # trade-off; either way it is predicted, and a layout that gains more is suggested before it.
    cfg.simulator.step_costs = "roofline"
    found = diagnosed(cfg, tmp_path)
    micro = found["too_few_microbatches"]
    first = tried(micro, {"pp.micro_batch_size": 4})
    assert first["change_pct"]["output_tok_s"] > 25
    assert "simulated GPU telemetry, not measured" in found["pp_bubble"].evidence


def test_kimi_pp8_over_pcie_is_told_to_run_tp8(tmp_path: Path) -> None:
    """The demo's deployment: Kimi K2 in eight pipeline stages over PCIe at c32, on the measured kernel
    tables. Nothing rules TP out over PCIe: the prediction ranks a layout of fewer stages and wider TP
    groups first (TP8, or TP4 x PP2 where a prefill's dispatch on eight ranks costs more; their
    collectives cost less than the stages' idle time), and the findings say so; more load is said apart,
    not as the fix."""
    cfg = scenario("kimi-k2", "rtx-pro-6000-pcie-x8", pp=8, concurrency=32)
    cfg.simulator.step_costs = "measured"
    found = diagnosed(cfg, tmp_path)
    micro = found["too_few_microbatches"]
    effect = micro.predicted_effect
    assert micro.change in ({"tp.size": 8, "pp.size": 1}, {"tp.size": 4, "pp.size": 2})
    assert effect["change_pct"]["output_tok_s"] > 50
    assert found["pp_bubble"].change == micro.change  # one voice
    first = tried(micro, {"pp.micro_batch_size": 4})  # the finding's own knob, predicted behind the layout
    assert first["change_pct"]["output_tok_s"] < effect["change_pct"]["output_tok_s"]
    assert "step costs: measured (aiconfigurator-core" in effect["source"]
    # the runner-up is behind, or ahead by less than the model can resolve (MIN_GAIN) where the suggestion
    # was preferred for its place in the finding's order, and the advice says which
    runner = effect["runner_up"]
    assert runner["change"] != micro.change and runner["behind_pct"] > -100 * MIN_GAIN
    said = advice_text(micro.to_dict())
    assert ("more tok/s, inside the model's error" in said) is (runner["behind_pct"] < 0)
    # what the pipeline needs, apart: the same configuration at twice the load
    assert effect["load"]["predicted_at"] == "c64" and effect["load"]["change"] == {}
    assert "More load is what this configuration needs, not a fix" in micro.suggestion
    line = advice_text(micro.to_dict())
    layout = " ".join(f"{k}={v}" for k, v in micro.change.items())
    assert line.startswith(f"set {layout}: predicted ") and "runner-up" in line
    # attention DP over the node is one of the layouts tried: on 96 GB cards Kimi K2's experts leave no
    # room for the attention weights every rank keeps, and the verdict says so
    attn = next(t for t in effect["tried"] if "dp.attention" in t["change"])
    assert attn["change"]["dp.attention"] == 8
    assert "not possible: Not enough memory" in attn["verdict"]
    assert "Every attention-DP rank keeps the attention weights and the embedding whole" in attn["verdict"]


def test_a_tp_group_across_two_nodes_is_told_to_pipeline(tmp_path: Path) -> None:
    """The prediction's choice, not a rule's: Llama 3.1 70B with TP16 spanning two H100 nodes joined by
    InfiniBand. Every layer's all-reduces cross the slow link; the prediction's first choice keeps each
    TP group within a node (TP8: a pipeline stage per node, or a prefill server on one node and a decode
    server on the other), and a pipeline stage per node (tp.size=8 pp.size=2) is predicted to raise the
    throughput by a fifth or more (helping, or a trade-off against a latency)."""
    cfg = scenario("llama-3.1-70b", "h100-sxm-x8-2nodes-ib", tp=16, concurrency=16)
    cfg.predict = True  # a trial across nodes is predicted here (a local Ray is one node)
    comm = diagnosed(cfg, tmp_path)["tp_comm_bound"]
    assert comm.change is not None and comm.change["tp.size"] == 8
    assert comm.predicted_effect["change_pct"]["output_tok_s"] > 20
    pipeline = tried(comm, {"tp.size": 8, "pp.size": 2})
    assert pipeline["verdict"] in ("helps", "trade-off") and pipeline["change_pct"]["output_tok_s"] > 20
    # data-parallel replicas across nodes are tried, and say why they cannot run
    across = tried(comm, {"tp.size": 8, "pp.size": 1, "dp.size": 2})
    assert across["verdict"].startswith("not possible")


def test_admission_cap(tmp_path: Path) -> None:
    found = diagnosed(scenario("llama-3.1-8b", "h200-nvlink-x8", concurrency=32, max_running_requests=8),
                      tmp_path)
    assert set(found) == {"admission_cap"}
    assert found["admission_cap"].change == {"server.max_running_requests": 32}


def test_kv_capacity(tmp_path: Path) -> None:
    # long contexts, many of them, a KV pool squeezed by a low static memory fraction
    cfg = scenario("llama-3.1-8b", "h100-sxm-x8", concurrency=64, input_len=3000, output_len=256,
                   mem_fraction_static=0.25)
    found = diagnosed(cfg, tmp_path)
    kv = found["kv_capacity"]
    # requests wait while the running ones sit below every cap: the pool (with the running requests'
    # reservation) has no room; read from the simulated engine's own series, so labelled not measured
    assert "requests waited on average while about" in kv.evidence and "not measured" in kv.evidence
    # its own changes are predicted (more static memory first), and the best of all is suggested
    assert tried(kv, {"server.mem_fraction_static": 0.3})["verdict"] == "helps"
    fp8 = {"server.extra_args.kv-cache-dtype": "fp8_e4m3"}
    assert kv.change in ({"server.mem_fraction_static": 0.3}, fp8)


def test_vllm_preempting_for_want_of_kv_cache(tmp_path: Path) -> None:
    """The simulated engine playing vLLM: a KV cache squeezed by --gpu-memory-utilization 0.6 for
    Llama-3.1-70B at TP4 and 96 long streams. vLLM reserves no decode tokens at admission, so it runs
    full and preempts; the finding says so in vLLM's words, and its fixes are predicted on vLLM's
    scheduler."""
    cfg = scenario("llama-3.1-70b", "h100-sxm-x8", tp=4, concurrency=96, input_len=2000, output_len=1000,
                   mem_fraction_static=0.6)
    cfg.engine.name = "sim-vllm"
    found = diagnosed(cfg, tmp_path)
    kv = found["kv_capacity"]
    assert kv.severity == "critical" and "requests preempted" in kv.evidence and "not measured" in kv.evidence
    assert "--gpu-memory-utilization" in kv.suggestion
    assert "ttft_queueing" not in found  # the KV finding carries the queueing
    # the memory the user's key gives vLLM (--gpu-memory-utilization 0.6), raised: not its KV share
    assert tried(kv, {"server.mem_fraction_static": 0.65})["verdict"] in ("helps", "trade-off")
    assert "vLLM 0.24.0" in kv.predicted_effect["source"]  # priced by vLLM's kernels


def test_vllm_decodes_starving_prompts_of_the_token_budget(tmp_path: Path) -> None:
    """vLLM's one token budget per step, shrunk to 512: about 120 running requests' decode tokens take a
    fifth of it, a 1,000-token prompt then needs three steps, and requests queue. A budget that holds the
    decodes and a prompt (2,048) and twice the budget are predicted: each cuts the TTFT p99 by more than
    half, and costs throughput (its steps run above the largest captured size, without CUDA graphs) and
    ITL; the finding says so as trade-offs, suggesting no change the prediction does not back."""
    cfg = scenario("llama-3.1-8b", "h100-sxm-x8", concurrency=256, input_len=1000, output_len=300,
                   chunked_prefill_size=512)
    cfg.engine.name = "sim-vllm"
    found = diagnosed(cfg, tmp_path)
    starved = found["prefill_starved"]
    assert "512-token budget" in starved.evidence and "queueing" in starved.evidence
    assert starved.goal == "ttft_p99_ms" and "ttft_queueing" not in found
    for budget in (1024, 2048):
        effect = tried(starved, {"server.chunked_prefill_size": budget})
        assert effect["change_pct"]["ttft_p99_ms"] < -50, effect
        assert effect["verdict"] in ("helps", "trade-off")
    if starved.change:  # suggested only where predicted to help
        assert starved.predicted_effect["verdict"] == "helps"
    else:
        assert "trade-off: server.chunked_prefill_size=" in starved.suggestion


def test_tp_comm_bound_on_pcie(tmp_path: Path) -> None:
    found = diagnosed(scenario("llama-3.1-70b", "rtx-pro-6000-pcie-x8", tp=8, concurrency=16), tmp_path)
    comm = found["tp_comm_bound"]
    assert "cost model estimate" in comm.evidence and "pcie" in comm.evidence
    # the layouts it would try instead are predicted, and reported whatever the verdict
    tried = comm.predicted_effect.get("tried") or [comm.predicted_effect]
    assert {"tp.size": 1, "pp.size": 8} in [t["change"] for t in tried] + [comm.predicted_effect.get(
        "instead_of", {}).get("change")]


def test_cuda_graph_off(tmp_path: Path) -> None:
    found = diagnosed(scenario("llama-3.1-8b", "h200-nvlink-x8", concurrency=4, cuda_graph=False), tmp_path)
    graph = found["cuda_graph_off"]
    assert graph.change == {"server.cuda_graph": True}
    assert graph.predicted_effect["change_pct"]["output_tok_s"] > 5


def test_pp_stage_imbalance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a lopsided layer split, exported the way a user would
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "4,4,4,20")
    found = diagnosed(scenario("llama-3.1-8b", "h200-nvlink-x8", pp=4, concurrency=32, micro_batch=8),
                      tmp_path)
    imbalance = found["pp_stage_imbalance"]
    # a layout of the four GPUs without the pipeline helps most; the finding's own change, a layer
    # partition that evens the stages, is named beside it for a user who keeps the pipeline
    own = imbalance.predicted_effect["own"]
    partition = own["change"]["env.SGLANG_PP_LAYER_PARTITION"]
    layers = [int(n) for n in partition.split(",")]
    assert sum(layers) == 32 and layers[-1] < 20
    assert own["change_pct"]["output_tok_s"] > 5
    assert "Of this finding's own changes: SGLANG_PP_LAYER_PARTITION=" in imbalance.suggestion


def test_kv_bound_admission_in_virtual_time(tmp_path: Path) -> None:
    # long prompts and a small static memory share: the pool holds 3 of the 16 requests; predict=true
    # reads the queue and the running requests from the model's own per-request times
    cfg = scenario("llama-3.1-70b", "h100-sxm-x8", tp=4, concurrency=16, input_len=2048, output_len=256,
                   mem_fraction_static=0.42)
    found = diagnosed(cfg, tmp_path)
    kv = found["kv_capacity"]
    assert "the 7,736-token KV pool holds 3 requests" in kv.evidence
    assert "(simulated engine's log / metrics, not measured)" in kv.evidence
    assert "queueing (each request's queue time, simulated engine's report, not measured)" in kv.evidence
    assert "ttft_queueing" not in found and "prefill_interference" not in found


def shared_prefix_scenario(groups: int, per_group: int, system: int, concurrency: int,
                           **server: object) -> ParasweepConf:
    cfg = scenario("llama-3.1-8b", "h200-nvlink-x8", concurrency=concurrency, **server)
    cfg.workload.source = "shared-prefix"
    sp = cfg.workload.shared_prefix
    sp.groups, sp.prompts_per_group, sp.system_len, sp.question_len, sp.output_len = (
        groups, per_group, system, 64, 32)
    cfg.workload.requests_per_concurrency = max(2, groups * per_group // concurrency)
    return cfg


def test_a_pool_too_small_for_the_shared_prefixes(tmp_path: Path) -> None:
    # four groups of a 3,000-token system prompt through a 12,000-token pool with at most 8 running:
    # first come first served mixes the groups and evicts one prefix to compute another
    cfg = shared_prefix_scenario(4, 16, 3000, 64, max_running_requests=8)
    cfg.server.extra_args = {"max_total_tokens": 12000}
    found = diagnosed(cfg, tmp_path)
    thrash = found["prefix_cache_thrash"]
    # offered: every prompt's prefix was sent before it in the window (the groups all came round in the
    # ramp), so an unbounded cache would find all of it
    assert "where the prompts offered 100%" in thrash.evidence
    assert "capped by --max-total-tokens=12,000" in thrash.evidence
    assert thrash.change == {"server.extra_args.max_total_tokens": 24000}
    assert "(simulated engine's log / metrics, not measured)" in thrash.evidence


def test_two_replicas_behind_round_robin_split_the_cache(tmp_path: Path) -> None:
    cfg = shared_prefix_scenario(8, 16, 2000, 32)
    cfg.dp.size = 2
    cfg.server.extra_args = {"max_total_tokens": 10000}
    found = diagnosed(cfg, tmp_path)
    split = found["prefix_cache_split"]
    assert split.change == {"dp.router": "cache_aware"} and "prefix_cache_thrash" not in found
    assert split.predicted_effect is not None and split.predicted_effect["change_pct"]["output_tok_s"] > 20


def disaggregated(tmp_path: Path, prefill_pp: int, decode_pp: int) -> set[str]:
    """Llama-3.1-70B on two H100 nodes, its trial keys a TP8 PP2 layout, served disaggregated by one
    prefill and one decode server of 8 GPUs each with their own pipelines: the findings' ids (diagnosed
    only, no fix predicted)."""
    cfg = scenario("llama-3.1-70b", "h100-sxm-x8-2nodes-ib", tp=8, pp=2, concurrency=32, input_len=512,
                   output_len=64)
    cfg.predict = True  # a deployment across two nodes runs in prediction
    cfg.pd.enabled = True
    cfg.pd.prefill.workers = cfg.pd.decode.workers = 1
    cfg.pd.prefill.tp, cfg.pd.prefill.pp = 8 // prefill_pp, prefill_pp
    cfg.pd.decode.tp, cfg.pd.decode.pp = 8 // decode_pp, decode_pp
    plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(0, "pd", tmp_path / "trial", ()))
    with VirtualSession(plan) as session:
        results = [session.run_point(p, plan.spec, tmp_path / "records.jsonl", lambda done, total: None)
                   for p in plan.points]
    facts = trial_facts(cfg, session.resolved, results, {}, session.gpu.source, "sim-predict")
    assert (facts.pp_size, facts.tp_size) == (decode_pp, 8 // decode_pp)  # the decode servers' layout
    return {f.id for f in diagnose(facts)}


@pytest.mark.parametrize(("prefill_pp", "decode_pp", "pipelined"),
                         [(1, 1, False), (2, 1, False), (1, 2, True)])
def test_a_disaggregated_trial_is_diagnosed_on_its_roles_layout(
        tmp_path: Path, prefill_pp: int, decode_pp: int, pipelined: bool) -> None:
    # the trial's own pp.size=2 is not what serves: the decode servers' pipeline (or none) decides whether
    # their micro-batches fill its stages (one micro-batch of 32 requests for two stages)
    found = disaggregated(tmp_path, prefill_pp, decode_pp)
    assert ("too_few_microbatches" in found) is pipelined, found


def test_requests_dealt_in_turn_queue_on_some_ranks_while_others_have_room(tmp_path: Path) -> None:
    """DeepSeek-V3 with eight attention-DP ranks of 8 requests each, 64 streams of answers of
    exponentially spread lengths: round-robin dealing leaves some ranks over their 8 while others run
    fewer. The finding reads each rank's own reports; sending each request to the rank holding the
    fewest is predicted to cut the TTFT p99."""
    cfg = scenario("deepseek-v3", "h200-nvlink-x8", tp=8, concurrency=64, input_len=256, output_len=256,
                   max_running_requests=64)
    cfg.dp.attention, cfg.ep.size = 8, 8
    cfg.workload.output_dist = "exponential"
    found = diagnosed(cfg, tmp_path)
    assert set(found) == {"dp_dispatch_imbalance"}
    finding = found["dp_dispatch_imbalance"]
    assert finding.change == {"dp.router": "total_requests"} and finding.goal == "ttft_p99_ms"
    assert "requests waiting on average while rank" in finding.evidence
    assert finding.predicted_effect["change_pct"]["ttft_p99_ms"] < -50


def test_a_kv_bound_mla_deployment_is_offered_attention_dp(tmp_path: Path) -> None:
    """DeepSeek-V3 on TP8 caches each request's latent on all eight GPUs; at 384 streams of 1,000 + 256
    tokens with 72 % of memory static, the pool holds about 220 of them. The finding says why and tries
    attention DP 8 first, which holds each rank's own requests only (the replicated weights taken out
    of the same memory): predicted to serve more tokens with far less queueing (its inter-token tail
    pays for every rank's prefills: the prediction weighs that against the other changes). The
    finding the dispatch scenario names stays quiet here."""
    cfg = scenario("deepseek-v3", "h200-nvlink-x8", tp=8, concurrency=384, input_len=1000, output_len=256,
                   mem_fraction_static=0.72)
    found = diagnosed(cfg, tmp_path)
    assert "kv_capacity" in found and "dp_dispatch_imbalance" not in found
    finding = found["kv_capacity"]
    assert "latent KV cache (MLA), where 8 attention-DP ranks" in finding.evidence
    attention_dp = tried(finding, {"dp.attention": 8})
    assert attention_dp["change_pct"]["output_tok_s"] > 5 and attention_dp["change_pct"]["ttft_p99_ms"] < -50


def test_hot_experts_on_an_expert_parallel_group_are_balanced(tmp_path: Path) -> None:
    """DeepSeek-V3 with its experts over 8 H200s (EP8) at 8 streams: each decode step touches few
    experts, and the GPU holding most of them sets the step (routing skewed as a trained router's).
    EPLB is suggested and predicted to help; nothing else fires."""
    cfg = scenario("deepseek-v3", "h200-nvlink-x8", tp=8, concurrency=8, input_len=256, output_len=128)
    cfg.ep.size = 8
    found = diagnosed(cfg, tmp_path)
    assert set(found) == {"expert_imbalance"}
    finding = found["expert_imbalance"]
    assert finding.change == {"ep.eplb": True} and "(cost model estimate)" in finding.evidence
    assert finding.predicted_effect["change_pct"]["output_tok_s"] > 10
