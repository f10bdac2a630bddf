"""Diagnosis rules on hand-made facts whose truth is known by construction: a healthy trial where no
rule fires, and for every rule a trial that differs from it in the one signal the rule reads, where it
fires at the right point, with the right change and evidence that names its source."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Any

import pytest

import analysis.diagnose as diagnose_module
from analysis.diagnose import RULES, StepEstimate, TrialFacts, diagnose, overrides_text
from vocab.findings import Finding
from vocab.records import ENGINE_FAILED, STOPPED_EARLY
from vocab.telemetry import (
    KV_USAGE_MAX,
    POWER_FRAC_MEAN,
    PREFILL_TOKENS_MAX,
    PREFILL_TOKENS_MEAN,
    PREFILL_WITH_DECODES,
    QUEUE_GROWTH,
    QUEUE_MEAN,
    RANK_QUEUE,
    RANK_QUEUE_SPREAD,
    RANK_RUNNING,
    RETRACTED,
    RUNNING_MEAN,
    STAGE_ACTIVITY_MAX,
    STAGE_ACTIVITY_MEAN,
    STAGE_ACTIVITY_MIN,
    per_replica,
    per_stage,
)

SOURCES = ("(NVML, measured)", "(simulated GPU telemetry, not measured)", "(cost model estimate)",
           "(engine log / metrics)", "(simulated engine's log / metrics, not measured)",
           "(resolved by the engine)", "resolved by the engine", "load generator",
           "each request's queue time, reported by the engine", "engine log / metrics")
PP, TP = 4, 2
FP8_KV = {"server.extra_args.kv-cache-dtype": "fp8_e4m3"}


def stage_activity(*values: float) -> dict[str, float]:
    out = {per_stage(s, "activity_mean"): v for s, v in enumerate(values)}
    out.update({STAGE_ACTIVITY_MEAN: sum(values) / len(values), STAGE_ACTIVITY_MIN: min(values),
                STAGE_ACTIVITY_MAX: max(values)})
    return out


def busy_point(**overrides: float) -> dict[str, float]:
    """c32 of a healthy pp=4 tp=2 trial: stages busy, power high, KV half full, no queue."""
    m: dict[str, float] = {"valid": 1.0, "output_tok_s": 3000.0, "itl_p50_ms": 12.0,
                           POWER_FRAC_MEAN: 0.8, KV_USAGE_MAX: 0.5, RETRACTED: 0.0, QUEUE_GROWTH: 0.0,
                           RUNNING_MEAN: 8.0, **stage_activity(0.8, 0.78, 0.79, 0.82)}
    m.update({per_stage(s, "queue_mean"): 0.0 for s in range(PP)})
    m.update(overrides)
    return m


def facts(c32: dict[str, float] | None = None, resolved: dict[str, Any] | None = None,
          **kw: Any) -> TrialFacts:
    """A healthy trial: 32 requests over 4 micro-batches of 8 (the resolved cap) on 4 stages."""
    base: dict[str, Any] = dict(
        pp_size=PP, async_depth=0, tp_size=TP,
        resolved={"max_running_requests": 256, "pp_max_micro_batch_size": 8, "cuda_graph_max_bs_decode": 256,
                  "disable_cuda_graph": False, "mem_fraction_static": 0.85, **(resolved or {})},
        points={"c1": {"valid": 1.0}, "c32": busy_point(**(c32 or {}))}, concurrency={"c1": 1, "c32": 32},
        idle_power_w=100.0, power_limit_w=700.0, gpu_source="nvml", interconnect="nvlink",
        steps={"c32": StepEstimate(batch=8, step_s=0.012, comm_s=0.0012, memory_bound_s=0.009)},
        stage_layers=(8, 8, 8, 8))
    base.update(kw)
    return TrialFacts(**base)


def found(f: TrialFacts) -> dict[str, Finding]:
    findings = diagnose(f)
    for x in findings:  # every finding, whatever the scenario: a point, a source, its change in words
        assert x.point in f.points, x
        assert any(s in x.evidence for s in SOURCES), x.evidence
        if x.change:
            assert f"Set {overrides_text(x.change)}." in x.suggestion, x.suggestion
        # alternatives are named only once the change is predicted not to help (the advice check)
        assert all(overrides_text(alt) not in x.suggestion for alt in x.alternatives
                   if not alt.items() <= x.change.items()), x.suggestion  # (a part of the change is)
    return {x.id: x for x in findings}


def test_a_healthy_trial_is_quiet() -> None:
    assert found(facts()) == {}


def test_client_bound() -> None:
    bad = {"valid": 0.0, "invalid_reason": "achieved concurrency 20 < 30.4"}
    f = found(facts(points={"c1": {"valid": 1.0}, "c32": bad}))
    assert set(f) == {"client_bound"}
    x = f["client_bound"]
    assert x.point == "c32" and x.change == {} and x.severity == "critical"
    assert "achieved concurrency 20" in x.evidence and "load generator" in x.evidence


def test_a_point_cut_short_is_not_blamed_on_the_client() -> None:
    """A point the trial's watcher stopped (the engine died, hung or timed out) is invalid, but the
    trial_failed finding tells that story; client_bound stays quiet for it."""
    for reason in (STOPPED_EARLY + "engine exited with code -9", ENGINE_FAILED + "engine exited with code 1"):
        cut = {"valid": 0.0, "invalid_reason": reason}
        assert "client_bound" not in found(facts(points={"c1": {"valid": 1.0}, "c32": cut}))


def test_too_few_microbatches() -> None:
    f = found(facts(resolved={"pp_max_micro_batch_size": 64}))
    x = f["too_few_microbatches"]
    assert x.point == "c32" and x.severity == "critical"  # 1 micro-batch for 4 stages
    assert x.change == {"pp.micro_batch_size": 8}  # ceil(32 / 4)
    # its own knobs only: other layouts come from the advice check's neighbourhood, on any link
    assert x.alternatives == [{"pp.async_depth": 1}]
    # more load is what the pipeline needs, said apart: never the change
    assert x.more_load == 64 and "fill only at 193 or more requests in flight" in x.evidence
    assert "(resolved by the engine)" in x.evidence
    assert found(facts(resolved={"pp_max_micro_batch_size": 64}, interconnect="pcie"))[
        "too_few_microbatches"].alternatives == [{"pp.async_depth": 1}]
    # two DP replicas see 16 requests each: one micro-batch under a cap of 16; ceil(16 / 4) = 4 each
    dp = found(facts(resolved={"pp_max_micro_batch_size": 16}, dp_size=2))["too_few_microbatches"]
    assert dp.change == {"pp.micro_batch_size": 4} and "per DP replica" in dp.evidence


def test_admission_cap() -> None:
    f = found(facts(resolved={"max_running_requests": 16}))
    x = f["admission_cap"]
    assert x.point == "c32" and x.change == {"server.max_running_requests": 32}
    assert "max_running_requests=16" in x.title and "resolved by the engine" in x.evidence
    # spread over two replicas, 16 each fit under the cap
    assert "admission_cap" not in found(facts(resolved={"max_running_requests": 16}, dp_size=2))


def test_pp_bubble_with_enough_micro_batches_raises_async_depth() -> None:
    f = found(facts(c32=stage_activity(0.4, 0.4, 0.4, 0.4)))
    assert set(f) == {"pp_bubble"}
    x = f["pp_bubble"]
    assert x.point == "c32" and x.severity == "warning"
    assert x.change == {"pp.async_depth": 1}
    assert x.alternatives == [{"pp.micro_batch_size": 8}] and x.more_load == 64
    assert "(NVML, measured)" in x.evidence and "0.40" in x.evidence
    critical = found(facts(c32=stage_activity(0.2, 0.2, 0.2, 0.2)))["pp_bubble"]
    assert critical.severity == "critical"


def test_pp_bubble_under_a_cap_that_leaves_stages_empty_raises_the_micro_batch_size() -> None:
    f = found(facts(c32=stage_activity(0.25, 0.25, 0.25, 0.25), resolved={"pp_max_micro_batch_size": 64}))
    assert f["pp_bubble"].change == {"pp.micro_batch_size": 8}
    assert "too_few_microbatches" in f


def test_pp_stage_imbalance_moves_layers_off_the_busy_stage() -> None:
    f = found(facts(c32=stage_activity(0.6, 0.6, 0.6, 0.9)))
    assert set(f) == {"pp_stage_imbalance"}
    x = f["pp_stage_imbalance"]
    # per layer 0.6 / 8 = 0.075; the last stage carries 0.3 beyond its layers: 9,9,9,5 evens them out
    assert x.point == "c32" and x.change == {"env.SGLANG_PP_LAYER_PARTITION": "9,9,9,5"}
    assert "SGLANG_PP_LAYER_PARTITION=9,9,9,5 (engine environment)" in x.suggestion
    assert "(NVML, measured)" in x.evidence and "0.60..0.90" in x.evidence


def test_pp_stage_imbalance_partition_keeps_the_total_and_a_layer_per_stage() -> None:
    x = found(facts(c32=stage_activity(0.2, 0.2, 0.2, 0.95), stage_layers=(2, 2, 2, 2)))["pp_stage_imbalance"]
    split = [int(n) for n in x.change["env.SGLANG_PP_LAYER_PARTITION"].split(",")]
    assert split == [3, 2, 2, 1] and sum(split) == 8 and min(split) >= 1


def test_pp_stage_imbalance_without_the_layer_split_proposes_no_partition() -> None:
    x = found(facts(c32=stage_activity(0.6, 0.6, 0.6, 0.9), stage_layers=()))["pp_stage_imbalance"]
    assert x.change == {} and "no partition is proposed" in x.suggestion


def test_cuda_graph_off() -> None:
    x = found(facts(resolved={"disable_cuda_graph": True}))["cuda_graph_off"]
    assert x.change == {"server.cuda_graph": True} and "server.cuda_graph=true" in x.suggestion
    # SGLang 0.5.9 names it cuda_graph_max_bs; the cost model's micro-batch of 8 exceeds the 4 captured
    resolved = {"cuda_graph_max_bs_decode": None, "cuda_graph_max_bs": 4}
    y = found(facts(resolved=resolved))["cuda_graph_off"]
    assert y.point == "c32" and y.change == {"server.extra_args.cuda-graph-max-bs": 8}
    # an engine flag is an addition to the config: run.py refuses it without the leading +
    assert "Set +server.extra_args.cuda-graph-max-bs=8." in y.suggestion
    assert "cuda_graph_max_bs " in y.evidence and "cost model estimate" in y.evidence
    # without an estimate: concurrency capped by the resolved micro-batch cap
    z = found(facts(resolved=resolved, steps={}))["cuda_graph_off"]
    assert z.change == {"server.extra_args.cuda-graph-max-bs": 8} and "resolved" in z.evidence


def test_cuda_graph_off_reads_the_busiest_valid_point() -> None:
    # c64 is the highest load but the client fell behind there: its batch is not the server's
    points = {"c1": {"valid": 1.0}, "c32": busy_point(), "c64": {"valid": 0.0}}
    concurrency = {"c1": 1, "c32": 32, "c64": 64}
    off = found(facts(points=points, concurrency=concurrency, resolved={"disable_cuda_graph": True}))
    assert off["cuda_graph_off"].point == "c32"
    small = found(facts(points=points, concurrency=concurrency, steps={},
                        resolved={"cuda_graph_max_bs_decode": 4}))
    assert small["cuda_graph_off"].point == "c32" and "at c32" in small["cuda_graph_off"].evidence


def test_overrides_text_writes_what_run_py_takes() -> None:
    change = {"pp.size": 2, "server.extra_args.cuda-graph-max-bs": 16, "workload.concurrency": [8, 16],
              "env.SGLANG_PP_LAYER_PARTITION": "3,2"}
    assert overrides_text(change) == ("pp.size=2 +server.extra_args.cuda-graph-max-bs=16 "
                                      "workload.concurrency=[8,16] SGLANG_PP_LAYER_PARTITION=3,2 "
                                      "(engine environment)")


def test_gpu_underused() -> None:
    f = found(facts(c32={POWER_FRAC_MEAN: 0.3}))
    assert set(f) == {"gpu_underused"}
    x = f["gpu_underused"]
    # idle 100 / 700 = 14 %; threshold 14 % + a quarter of the 86 % above it = 36 %
    assert x.point == "c32" and "36%" in x.evidence and "30%" in x.evidence
    # no knob of its own: the other layouts of the same GPUs are tried, and more load said apart
    assert x.change == {} and x.alternatives == [] and x.more_load == 64
    assert "gpu_underused" not in found(facts(c32={POWER_FRAC_MEAN: 0.4}))


def test_kv_capacity_when_the_pool_runs_full() -> None:
    f = found(facts(c32={KV_USAGE_MAX: 0.97}))
    assert set(f) == {"kv_capacity"}
    x = f["kv_capacity"]
    assert x.point == "c32" and x.severity == "warning" and "(engine log / metrics)" in x.evidence
    assert x.change == {"server.mem_fraction_static": 0.9}
    # 8 per micro-batch x 4 micro-batches = 32 running at 97 %: 32 x 0.9 / 0.97 = 29 keep it at 90 %
    assert x.alternatives == [{"server.max_running_requests": 29}, FP8_KV]


def test_kv_capacity_on_retractions_without_room_to_raise_the_memory_fraction() -> None:
    x = found(facts(c32={RETRACTED: 3.0}, resolved={"mem_fraction_static": 0.92}))["kv_capacity"]
    assert x.severity == "critical" and "3 requests retracted" in x.evidence
    assert x.change == {"server.max_running_requests": 28}  # the pool was full: floor(32 x 0.9)
    assert x.alternatives == [FP8_KV]


def test_vllm_preemptions_in_vllm_s_words_and_its_memory_flag_raised_further() -> None:
    # vLLM at --gpu-memory-utilization 0.9 (its default; SGLang's 0.9 leaves no room to raise)
    x = found(facts(c32={RETRACTED: 3.0}, resolved={"mem_fraction_static": 0.9}, plays="vllm",
                    pp_size=1))["kv_capacity"]
    assert x.severity == "critical" and "3 requests preempted" in x.evidence and "retracted" not in x.evidence
    assert x.change == {"server.mem_fraction_static": 0.95} and "--max-num-seqs" in x.suggestion


def test_vllm_admission_held_by_a_full_kv_cache_is_not_ttft_queueing() -> None:
    # vLLM reserves no decode tokens: SGLang's reservation arithmetic does not apply; a full cache with
    # requests waiting is what holds admission back
    point = {QUEUE_MEAN: 20.0, KV_USAGE_MAX: 0.99, "ttft_p99_ms": 4000.0, "ttft_p99_queue_ms": 3800.0}
    f = found(facts(c32=point, plays="vllm", pp_size=1, input_len=2000, output_len=500))
    assert "ttft_queueing" not in f and "the KV cache ran full: vLLM admits a request only when its prompt " \
        "fits" in f["kv_capacity"].evidence
    # the same numbers on SGLang: its own reading (the pool at the workload's lengths) decides
    assert "vLLM admits" not in " ".join(x.evidence for x in found(facts(c32=point, pp_size=1)).values())


def test_vllm_prompts_starved_of_the_token_budget() -> None:
    # 256 running requests take 256 of a 1,024-token budget: a 2,000-token prompt takes 3 steps of the 768
    # left (2 with the whole budget), and the TTFT is mostly queueing
    point = {RUNNING_MEAN: 256.0, QUEUE_MEAN: 30.0, KV_USAGE_MAX: 0.4, "ttft_p99_ms": 3000.0,
             "ttft_p99_queue_ms": 2500.0}
    kw = dict(plays="vllm", pp_size=1, input_len=2000.0, output_len=300.0)
    f = found(facts(c32=point, resolved={"chunked_prefill_size": 1024}, **kw))
    x = f["prefill_starved"]
    assert "takes 3 steps of the 768 tokens left" in x.evidence and x.goal == "ttft_p99_ms"
    assert x.change == {"server.chunked_prefill_size": 4096}  # 256 + 2,000, to a power of two
    assert x.alternatives == [{"server.chunked_prefill_size": 2048}] and "ttft_queueing" not in f
    # a budget the decodes leave room in: quiet; SGLang (prefill batches apart from decodes): quiet
    assert "prefill_starved" not in found(facts(c32=point, resolved={"chunked_prefill_size": 8192}, **kw))
    assert "prefill_starved" not in found(facts(c32=point, resolved={"chunked_prefill_size": 1024},
                                                pp_size=1, input_len=2000.0, output_len=300.0))


def test_kv_bound_admission_below_the_caps_but_not_at_a_cap() -> None:
    # 2,048 + 256 tokens a request: a 37,000-token pool holds 16 of them; 16 run (4 per micro-batch of
    # a cap of 8, 4 micro-batches) of the 32 offered while 4 wait, below max_running_requests=256
    queue = {per_stage(s, "queue_mean"): 4.0 for s in range(PP)}
    bound = {RUNNING_MEAN: 4.0, **queue}
    kv = {"resolved": {"max_total_num_tokens": 37_000}, "input_len": 2048.0, "output_len": 256.0}
    x = found(facts(c32=bound, gpu_source="simulated", **kv))["kv_capacity"]
    assert ("4.0 requests waited on average while about 16.0 ran, below the concurrency 32 and "
            "max_running_requests=256") in x.evidence
    assert "the 37,000-token KV pool holds 16 requests" in x.evidence
    assert "(simulated engine's log / metrics, not measured)" in x.evidence
    assert x.change == {"server.mem_fraction_static": 0.9}
    assert x.alternatives == [FP8_KV]
    # the same queue with room in the pool for two more requests: not the KV cache
    roomy = {**kv, "resolved": {"max_total_num_tokens": 42_000}}
    assert "kv_capacity" not in found(facts(c32=bound, **roomy))
    at_cap = {**bound, RUNNING_MEAN: 8.0}  # micro-batches full: the per-slot cap holds them back
    assert "kv_capacity" not in found(facts(c32=at_cap, **kv))
    nobody_waits = {**bound, **{per_stage(s, "queue_mean"): 0.5 for s in range(PP)}}
    assert "kv_capacity" not in found(facts(c32=nobody_waits, **kv))
    # a live simulated trial without GPU sampling (telemetry.gpu_hz=0): the engine tag still says so
    for engine in ("sim", "sim-predict"):
        y = found(facts(c32=bound, gpu_source="none", engine=engine, **kv))["kv_capacity"]
        assert "(simulated engine's log / metrics, not measured)" in y.evidence
    z = found(facts(c32=bound, gpu_source="none", engine="sglang", **kv))["kv_capacity"]
    assert "(engine log / metrics)" in z.evidence and "simulated" not in z.evidence


def test_tp_comm_bound_over_pcie() -> None:
    steps = {"c32": StepEstimate(batch=8, step_s=0.02, comm_s=0.007, memory_bound_s=0.009)}
    f = found(facts(steps=steps, interconnect="pcie"))
    assert set(f) == {"tp_comm_bound"}
    x = f["tp_comm_bound"]
    assert x.point == "c32" and x.change == {"tp.size": 1, "pp.size": 8} and x.alternatives == []
    assert "35%" in x.evidence and "(cost model estimate)" in x.evidence
    assert "tp_comm_bound" not in found(facts(steps=steps))  # 35 % over NVLink, ITL near the floor


def test_tp_comm_bound_from_the_measured_itl() -> None:
    steps = {"c32": StepEstimate(batch=32, step_s=0.02, comm_s=0.004, memory_bound_s=0.01)}
    points = {"c1": {"valid": 1.0}, "c32": {"valid": 1.0, "itl_p50_ms": 30.0}}
    x = found(facts(pp_size=1, tp_size=4, steps=steps, points=points, stage_layers=(),
                    resolved={"pp_max_micro_batch_size": 256}))["tp_comm_bound"]
    assert x.change == {"tp.size": 1, "pp.size": 4} and x.alternatives == [{"tp.size": 2, "pp.size": 2}]
    assert "ITL p50 30.00 ms (load generator)" in x.evidence
    fast = {"c1": {"valid": 1.0}, "c32": {"valid": 1.0, "itl_p50_ms": 15.0}}  # 1.5x the floor
    assert "tp_comm_bound" not in found(facts(pp_size=1, tp_size=4, steps=steps, points=fast,
                                              resolved={"pp_max_micro_batch_size": 256}))


def test_most_severe_first_and_the_demo_story() -> None:
    c32 = {**stage_activity(0.12, 0.11, 0.12, 0.13), POWER_FRAC_MEAN: 0.2}
    findings = diagnose(facts(c32=c32, resolved={"pp_max_micro_batch_size": 512}))
    ids = [x.id for x in findings]
    assert {"too_few_microbatches", "pp_bubble", "gpu_underused"} <= set(ids)
    assert [x.severity for x in findings] == sorted((x.severity for x in findings),
                                                    key=("critical", "warning", "info").index)


def test_gpu_rules_stay_quiet_without_gpu_telemetry() -> None:
    sick = {**stage_activity(0.2, 0.2, 0.2, 0.9), POWER_FRAC_MEAN: 0.1}
    assert {"pp_bubble", "pp_stage_imbalance", "gpu_underused"} <= set(found(facts(c32=sick)))
    assert found(facts(c32=sick, gpu_source="none")) == {}


def test_evidence_names_measured_or_simulated_gpu_telemetry() -> None:
    sick = {**stage_activity(0.2, 0.2, 0.2, 0.9), POWER_FRAC_MEAN: 0.1}
    for source, words, other in (("nvml", "(NVML, measured)", "not measured"),
                                 ("simulated", "(simulated GPU telemetry, not measured)", "NVML")):
        f = found(facts(c32=sick, gpu_source=source))
        for rule in ("pp_bubble", "pp_stage_imbalance", "gpu_underused"):
            assert words in f[rule].evidence and other not in f[rule].evidence


def test_invalid_points_are_not_read_as_server_numbers() -> None:
    f = found(facts(c32={POWER_FRAC_MEAN: 0.1, "valid": 0.0}))
    assert set(f) == {"client_bound"}


def test_no_rule_reads_the_simulators_internal_series() -> None:
    modules = [importlib.import_module(f"analysis.diagnose.{m.name}")
               for m in pkgutil.iter_modules(diagnose_module.__path__)]
    assert len(modules) >= 5  # every module of the package, not its front door alone
    for module in (diagnose_module, *modules):
        source = inspect.getsource(module)
        assert "sim_" not in source and "parasweep_sim:" not in source, module.__name__
    # the old simulator-only summaries, at values that would once have fired every GPU rule
    internal = {"sim_stage_busy_mean": 0.05, "sim_stage_busy_min": 0.01, "sim_stage_busy_max": 0.9,
                "sim_gpu_power_w_mean": 36.0, "parasweep_sim:stage_busy_seconds_total": 0.0,
                "parasweep_sim:gpu_power_watts": 36.0}
    only_internal = facts(points={"c1": dict(internal), "c32": dict(internal)}, gpu_source="simulated",
                          steps={})
    assert diagnose(only_internal) == []
    assert all(rule(only_internal) == [] for rule in RULES)


def test_facts_reject_unknown_sources_and_links() -> None:
    with pytest.raises(ValueError, match="gpu_source must be one of nvml, simulated, none, got 'dcgm'"):
        facts(gpu_source="dcgm")
    with pytest.raises(ValueError, match="interconnect must be one of pcie, nvlink, got 'ib'"):
        facts(interconnect="ib")


def test_hand_made_facts_stay_short() -> None:
    f = TrialFacts(pp_size=1, async_depth=0, resolved={}, points={"c1": {"valid": 1.0}},
                   concurrency={"c1": 1})
    assert diagnose(f) == [] and f.gpu_source == "none" and dataclasses.asdict(f)["steps"] == {}


# ---- long prompts: prefills beside decodes, where TTFT goes ---------------------------------------

def stalled(**overrides: float) -> dict[str, float]:
    """c32 where 2,048-token prefills ran beside decoding requests and the ITL tail shows it."""
    return {"itl_p99_ms": 150.0, PREFILL_TOKENS_MAX: 8192.0, PREFILL_TOKENS_MEAN: 2048.0,
            PREFILL_WITH_DECODES: 0.9, **overrides}


def test_prefill_interference() -> None:
    resolved = {"chunked_prefill_size": 8192, "enable_mixed_chunk": False}
    x = found(facts(c32=stalled(), resolved=resolved))["prefill_interference"]
    assert x.point == "c32" and x.goal == "itl_p99_ms"
    assert "ITL p99 150.0 ms is 12.5x ITL p50 12.0 ms" in x.evidence and "(load generator)" in x.evidence
    assert "prefill batches of 2,048 prompt tokens on average (largest 8,192), 90% of them" in x.evidence
    # mixed chunks, in chunks whose prefill stalls a decode about 3 ITL p50: 2048 x 36 / 150 = 491 -> 256
    mixed = {"server.extra_args.enable-mixed-chunk": True}
    assert x.change == {**mixed, "server.chunked_prefill_size": 256}
    assert x.alternatives == [mixed, {"server.chunked_prefill_size": 256}]
    # mixed chunks already on: only the chunk size is left to change
    on = found(facts(c32=stalled(), resolved={**resolved, "enable_mixed_chunk": True}))
    assert on["prefill_interference"].change == {"server.chunked_prefill_size": 256}


@pytest.mark.parametrize("quiet", [
    {"itl_p99_ms": 30.0},                 # the tail is 2.5x the median: no stall worth the name
    {PREFILL_TOKENS_MEAN: 128.0},         # short prompts: their prefill costs a decode step or so
    {PREFILL_WITH_DECODES: 0.1},          # prefills ran while nothing decoded
    {"valid": 0.0, "invalid_reason": "client fell behind"},  # the client's numbers, not the server's
])
def test_prefill_interference_stays_quiet(quiet: dict[str, Any]) -> None:
    resolved = {"chunked_prefill_size": 8192, "enable_mixed_chunk": False}
    assert "prefill_interference" not in found(facts(c32=stalled(**quiet), resolved=resolved))


def queued(**overrides: float) -> dict[str, float]:
    """c32 whose TTFT is mostly the wait in the server's queue (its per-request report)."""
    return {"ttft_p50_ms": 900.0, "ttft_p99_ms": 2000.0, "server_queue_p50_ms": 700.0,
            "ttft_p99_queue_ms": 1800.0, **overrides}


def test_ttft_queueing() -> None:
    x = found(facts(c32=queued()))["ttft_queueing"]
    assert x.goal == "ttft_p99_ms" and x.point == "c32"
    assert ("TTFT p99 2.0 s, of which 1.8 s (90%) queueing (each request's queue time, reported by "
            "the engine)") in x.evidence
    assert x.change == {"dp.size": 2} and x.alternatives == []  # more replicas: more GPUs, for the TTFT
    chunked = found(facts(c32=queued(), resolved={"chunked_prefill_size": 4096}))["ttft_queueing"]
    assert chunked.change == {"server.chunked_prefill_size": 8192}
    assert chunked.alternatives == [{"dp.size": 2}]
    # a burst: only the tail waited (the median request was admitted at once)
    assert "ttft_queueing" not in found(facts(c32=queued(server_queue_p50_ms=20.0)))
    # the median request waited no more than the overlap loop makes it (the rest of a 400 ms step and the
    # step built ahead): not a server taking requests in slower than they come
    assert "ttft_queueing" not in found(facts(c32=queued(itl_p50_ms=400.0)))
    assert "ttft_queueing" in found(facts(c32=queued(itl_p50_ms=300.0)))
    # an admission cap holds them back: admission_cap says so, not this
    capped = found(facts(c32=queued(), resolved={"max_running_requests": 16}))
    assert "admission_cap" in capped and "ttft_queueing" not in capped
    # vLLM: a dense model's DP ranks are offered; a MoE model's tie the experts' spread to them, so its
    # wider splits are left to the layouts the advice check adds
    kw = dict(plays="vllm", pp_size=1, resolved={"chunked_prefill_size": 8192})
    assert found(facts(c32=queued(), **kw))["ttft_queueing"].alternatives == [{"dp.size": 2}]
    assert found(facts(c32=queued(), moe=True, **kw))["ttft_queueing"].alternatives == []


def test_ttft_queueing_by_littles_law_without_per_request_times() -> None:
    # an OpenAI API reports no queue time per request: the engine's mean queue over the completed
    # request rate gives the mean wait (6 waiting / 4 req/s = 1.5 s of a 1.8 s mean TTFT)
    point = {"ttft_mean_ms": 1800.0, "ttft_p99_ms": 2500.0, "request_s": 4.0, QUEUE_MEAN: 6.0}
    x = found(facts(c32=point))["ttft_queueing"]
    assert ("TTFT mean 1.8 s, of which 1.5 s (83%) queueing (Little's law: 6.0 waiting / 4.00 req/s, "
            "engine log / metrics)") in x.evidence
    assert "ttft_queueing" not in found(facts(c32={**point, QUEUE_MEAN: 0.5}))  # 125 ms of 1.8 s


def test_kv_capacity_carries_the_ttft_split_and_silences_ttft_queueing() -> None:
    queue = {per_stage(s, "queue_mean"): 4.0 for s in range(PP)}
    bound = {RUNNING_MEAN: 4.0, **queue, **queued()}
    f = found(facts(c32=bound, resolved={"max_total_num_tokens": 37_000}, input_len=2048.0,
                    output_len=256.0))
    assert "ttft_queueing" not in f
    assert "TTFT p99 2.0 s, of which 1.8 s (90%) queueing" in f["kv_capacity"].evidence


def test_prefill_interference_with_chunked_prefill_off() -> None:
    # -1: every prompt is one batch; mixed chunks need chunked prefill, so they come with a chunk size
    x = found(facts(c32=stalled(), resolved={"chunked_prefill_size": -1}))["prefill_interference"]
    assert x.change == {"server.extra_args.enable-mixed-chunk": True, "server.chunked_prefill_size": 256}
    assert x.alternatives == [{"server.chunked_prefill_size": 256}]


def test_a_pool_capped_by_max_total_tokens_is_named_and_its_cap_raised() -> None:
    # measured on the simulated engine: Llama-3.1-70B TP4 on an H100 node, 2,048-token prompts and 32
    # out, +server.extra_args.max_total_tokens=12000, C=16: about 4 requests decode while 10 wait. The
    # pool holds 5 whole requests of 2,080 tokens (not 5.8): the fifth is the one being prefilled.
    point = {"valid": 1.0, "output_tok_s": 139.0, RUNNING_MEAN: 3.95, QUEUE_MEAN: 9.95, KV_USAGE_MAX: 0.86,
             "ttft_p99_ms": 2893.0, "ttft_p50_ms": 2700.0, "server_queue_p99_ms": 2600.0,
             "server_queue_p50_ms": 2400.0, "ttft_p99_queue_ms": 2600.0, "ttft_queue_share": 0.9}
    capped = {"max_total_num_tokens": 12_000, "max_total_tokens": 12_000, "max_running_requests": 2048}
    f = found(facts(c32=point, resolved=capped, pp_size=1, tp_size=4, gpu_source="simulated",
                    concurrency={"c1": 1, "c32": 16}, input_len=2048.0, output_len=32.0, stage_layers=(80,)))
    assert "ttft_queueing" not in f  # the KV pool holds them back, not the prefill rate
    x = f["kv_capacity"]
    assert ("the 12,000-token KV pool holds 5 requests (the pool is capped by --max-total-tokens=12,000)"
            in x.evidence)
    # more memory would not reach a capped pool: the cap is what to raise
    assert x.change == {"server.extra_args.max_total_tokens": 24_000}
    assert "server.mem_fraction_static" not in str(x.alternatives)


def test_prompts_found_in_the_prefix_cache_take_no_pool_of_their_own() -> None:
    # the same queue and pool, but 90 % of every prompt is a shared prefix held once in the cache:
    # each request takes 205 + 256 tokens, the 37,000-token pool holds 80 and 16 running are far from it
    queue = {per_stage(s, "queue_mean"): 4.0 for s in range(PP)}
    bound = {RUNNING_MEAN: 4.0, **queue}
    kv = {"resolved": {"max_total_num_tokens": 37_000}, "input_len": 2048.0, "output_len": 256.0}
    assert "kv_capacity" in found(facts(c32=bound, **kv))
    assert "kv_capacity" not in found(facts(c32={**bound, "cache_hit_rate": 0.9}, **kv))


def test_a_cache_that_loses_what_the_prompts_offer_is_named_with_its_pool() -> None:
    thrash = {"cache_hit_rate": 0.45, "offered_hit_rate": 0.85, "prefill_computed_tokens": 70_000.0,
              KV_USAGE_MAX: 0.97}
    x = found(facts(c32=thrash, resolved={"max_total_num_tokens": 12_000}))["prefix_cache_thrash"]
    assert ("the engine found 45% of the prompt tokens in its prefix cache at c32, where the prompts offered "
            "85%") in x.evidence and "the KV pool holds 12,000 tokens, used up to 97%" in x.evidence
    assert x.change == {"server.mem_fraction_static": 0.9}
    assert x.alternatives == [{"server.schedule_policy": "lpm"}, {"server.max_running_requests": 24}]
    # a capped pool: raise the cap; already lpm: not suggested again
    capped = {"max_total_num_tokens": 12_000, "max_total_tokens": 12_000, "schedule_policy": "lpm"}
    y = found(facts(c32=thrash, resolved=capped))["prefix_cache_thrash"]
    assert y.change == {"server.extra_args.max_total_tokens": 24_000}
    assert {"server.schedule_policy": "lpm"} not in y.alternatives
    # what the cache keeps is close to what is offered, or nothing much is offered: quiet
    assert "prefix_cache_thrash" not in found(facts(c32={**thrash, "cache_hit_rate": 0.8}))
    assert "prefix_cache_thrash" not in found(facts(c32={**thrash, "offered_hit_rate": 0.15,
                                                         "cache_hit_rate": 0.0}))
    # the engine log's hit rate where responses carried none (OpenAI APIs without a cache report)
    from_log = {"log_cache_hit_rate": 0.45, "offered_hit_rate": 0.85}
    assert "prefix_cache_thrash" in found(facts(c32=from_log))


def test_replicas_behind_round_robin_split_the_cache_and_the_cache_aware_router_is_suggested() -> None:
    split = {"cache_hit_rate": 0.62, "offered_hit_rate": 0.9}
    f = found(facts(c32=split, dp_size=2))
    x = f["prefix_cache_split"]
    assert x.change == {"dp.router": "cache_aware"} and "prefix_cache_thrash" not in f
    assert "2 DP replicas take requests in turn (round-robin)" in x.evidence
    assert "prefix_cache_split" not in found(facts(c32=split, dp_size=2, dp_router="cache_aware"))
    assert "prefix_cache_split" not in found(facts(c32=split))  # one replica: nothing to split


# ---- several schedulers in one engine: attention-DP ranks ----------------------------------------------

def ranks_point(running: list[float], queues: list[float]) -> dict[str, float]:
    """c32 of an engine with one scheduler per entry: each one's mean running and waiting requests."""
    m = busy_point(**{QUEUE_MEAN: sum(queues)})
    for r, (run, wait) in enumerate(zip(running, queues, strict=True)):
        m[per_replica(r, RANK_RUNNING)], m[per_replica(r, RANK_QUEUE)] = run, wait
    m[RANK_QUEUE_SPREAD] = max(queues) - min(queues)
    return m


def test_dp_dispatch_imbalance() -> None:
    # four ranks of 8 requests each, 32 streams dealt in turn: rank 2 queues while rank 0 runs 5 of 8
    ranks = {"attn_dp": 4, "pp_size": 1, "tp_size": 4, "resolved": {"max_running_requests": 8}}
    uneven = ranks_point([5.0, 8.0, 8.0, 7.0], [0.0, 0.5, 2.5, 0.0])
    f = found(facts(c32=uneven, **ranks))
    x = f["dp_dispatch_imbalance"]
    assert x.point == "c32" and x.change == {"dp.router": "total_requests"} and x.goal == "ttft_p99_ms"
    assert ("rank 2 kept 2.5 requests waiting on average while rank 0 ran 5.0 of its 8 request slots"
            in x.evidence)
    assert "(engine log / metrics)" in x.evidence
    # the signal, not the layout: queues within a request of each other, every rank near its cap, the
    # controller already sending each to the fewest, or one scheduler
    for quiet in (facts(c32=ranks_point([5.0, 8.0, 8.0, 7.0], [0.0, 0.5, 0.9, 0.0]), **ranks),
                  facts(c32=ranks_point([7.5, 8.0, 8.0, 7.8], [0.0, 0.5, 2.5, 0.0]), **ranks),
                  facts(c32=uneven, dp_router="total_requests", **ranks),
                  facts(c32=uneven)):
        assert "dp_dispatch_imbalance" not in found(quiet)


def test_attention_dp_gathers_are_told_to_use_an_all_to_all() -> None:
    steps = {"c32": StepEstimate(batch=8, step_s=0.02, comm_s=0.007, memory_bound_s=0.009)}
    ranks = {"attn_dp": 8, "tp_size": 8, "pp_size": 1, "moe": True, "interconnect": "pcie", "steps": steps,
             "stage_layers": ()}
    x = found(facts(**ranks))["tp_comm_bound"]
    assert x.change == {"ep.a2a_backend": "deepep"}
    assert x.alternatives[0] == {"tp.size": 1, "pp.size": 8}
    assert x.evidence.startswith("The collectives of 8 attention-DP ranks")
    assert "(cost model estimate)" in x.evidence
    already = found(facts(resolved={"moe_a2a_backend": "deepep"}, **ranks))["tp_comm_bound"]
    assert already.change == {"tp.size": 1, "pp.size": 8}


def test_a_kv_bound_mla_tp_group_tries_attention_dp_first() -> None:
    full = {KV_USAGE_MAX: 0.97}
    mla = found(facts(c32=full, latent_kv=True, moe=True, pp_size=1, tp_size=8))["kv_capacity"]
    assert mla.change == {"dp.attention": 8}
    assert "holds every request's latent KV cache (MLA), where 8 attention-DP ranks" in mla.evidence
    for other in (facts(c32=full, pp_size=1, tp_size=8),  # GQA: each GPU holds its heads' share already
                  facts(c32=full, latent_kv=True, pp_size=1, tp_size=8, attn_dp=8)):  # ranks already
        assert "dp.attention" not in found(other)["kv_capacity"].change


def test_expert_imbalance() -> None:
    skewed = {"c32": StepEstimate(batch=8, step_s=0.020, comm_s=0.002, memory_bound_s=0.009,
                                  balanced_step_s=0.016)}
    ep8 = {"tp_size": 8, "pp_size": 1, "moe": True, "stage_layers": ()}
    x = found(facts(steps=skewed, resolved={"ep_size": 8}, **ep8))["expert_imbalance"]
    assert x.change == {"ep.eplb": True} and x.point == "c32" and x.severity == "info"
    assert "20.00 ms where an even share" in x.evidence and "16.00 ms (cost model estimate)" in x.evidence
    near = {"c32": dataclasses.replace(skewed["c32"], balanced_step_s=0.0185)}  # 7.5 %: within the model
    for quiet in (facts(steps=near, resolved={"ep_size": 8}, **ep8),
                  facts(steps=skewed, resolved={"ep_size": 8, "enable_eplb": True}, **ep8),
                  facts(steps=skewed, resolved={"ep_size": 1}, **ep8)):
        assert "expert_imbalance" not in found(quiet)
