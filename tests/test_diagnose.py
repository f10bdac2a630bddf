"""Diagnosis rules on hand-made facts: each finding fires where it should and stays quiet otherwise."""

from __future__ import annotations

from analysis.diagnose import TrialFacts, diagnose


def _facts(**kw) -> TrialFacts:
    base = dict(pp_size=8, async_depth=0, resolved={"max_running_requests": 4096,
                                                    "pp_max_micro_batch_size": 512,
                                                    "cuda_graph_max_bs_decode": 256,
                                                    "disable_cuda_graph": False},
                points={"c1": {"valid": 1}, "c32": {"valid": 1}}, concurrency={"c1": 1, "c32": 32},
                idle_power_w=35.0, power_limit_w=600.0)
    base.update(kw)
    return TrialFacts(**base)


def _ids(facts: TrialFacts) -> set[str]:
    return {f.id for f in diagnose(facts)}


def test_the_demo_story() -> None:
    points = {"c1": {"valid": 1}, "c32": {"valid": 1, "sim_stage_busy_mean": 0.12, "sim_stage_busy_min": 0.10,
                                          "sim_stage_busy_max": 0.14, "sim_gpu_power_w_mean": 95.0}}
    findings = diagnose(_facts(points=points))
    ids = [f.id for f in findings]
    assert {"too_few_microbatches", "pp_bubble", "gpu_underused"} <= set(ids)
    assert findings[0].severity == "critical"  # most severe first
    micro = next(f for f in findings if f.id == "too_few_microbatches")
    assert "pp.micro_batch_size=4" in micro.suggestion


def test_healthy_pipeline_is_quiet() -> None:
    points = {"c1": {"valid": 1}, "c32": {"valid": 1, "sim_stage_busy_mean": 0.85, "sim_stage_busy_min": 0.8,
                                          "sim_stage_busy_max": 0.9, "sim_gpu_power_w_mean": 520.0}}
    resolved = {"max_running_requests": 4096, "pp_max_micro_batch_size": 4, "cuda_graph_max_bs_decode": 256}
    assert _ids(_facts(points=points, resolved=resolved)) == set()


def test_stage_imbalance_and_cuda_graph_limits() -> None:
    points = {"c1": {"valid": 1}, "c512": {"valid": 1, "sim_stage_busy_mean": 0.7, "sim_stage_busy_min": 0.55,
                                           "sim_stage_busy_max": 0.95}}
    facts = _facts(points=points, concurrency={"c1": 1, "c512": 512})
    ids = _ids(facts)
    assert "pp_stage_imbalance" in ids and "cuda_graph_off" in ids  # 512 per batch > captured 256
    off = _facts(resolved={"disable_cuda_graph": True})
    assert "cuda_graph_off" in _ids(off)


def test_client_bound_and_admission_cap() -> None:
    points = {"c1": {"valid": 1}, "c32": {"valid": 0, "invalid_reason": "achieved concurrency 20 < 30.4"}}
    facts = _facts(points=points, resolved={"max_running_requests": 16, "pp_max_micro_batch_size": 2})
    found = {f.id: f for f in diagnose(facts)}
    assert "achieved concurrency 20" in found["client_bound"].evidence
    assert "max_running_requests=16" in found["admission_cap"].title
