"""The diagnosis on speculative decoding, end to end in virtual time: Llama-3.1-8B on one H100 at
concurrency 1 without speculation is told it would pay (with the gain predicted and the acceptance it
assumed), and at concurrency 128 with EAGLE-3's tree it is told the verify costs more than it saves,
with fewer draft steps predicted to help."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.prediction.verdict import gain
from tests.test_diagnosis_scenarios import predicted_findings
from vocab.findings import Finding
from vocab.hardware import load_hardware

pytestmark = pytest.mark.slow


def llama(concurrency: int, algorithm: str = "none", **server: object) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    cfg.model.drafts = {"eagle3": "models/eagle3-llama-3.1-8b"}
    cfg.hardware = load_hardware("h100-sxm-x8")
    cfg.spec.algorithm = algorithm
    cfg.workload.concurrency = [concurrency]
    cfg.workload.input_len, cfg.workload.output_len = 256, 128
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 2, 1
    for key, value in server.items():
        setattr(cfg.server, key, value)
    return cfg


def diagnosed(cfg: ParasweepConf, tmp_path: Path) -> dict[str, Finding]:
    return {f.id: f for f in predicted_findings(cfg, tmp_path)}


def test_speculation_is_suggested_at_concurrency_one_with_its_predicted_gain(tmp_path: Path) -> None:
    found = diagnosed(llama(1), tmp_path)
    f = found["speculation_would_pay"]
    assert f.change == {"spec.algorithm": "eagle3"} and f.point == "c1"
    assert "published eagle3 accept lengths" in f.evidence  # the acceptance the prediction assumed
    effect = f.predicted_effect
    assert effect["verdict"] == "helps", effect
    assert gain(effect, "throughput") > 0.5  # more than 1.5x the tokens per second of one request
    assert "prediction, not a measurement" in effect["source"]


def test_a_compute_bound_verify_at_concurrency_128_is_told_to_draft_less(tmp_path: Path) -> None:
    found = diagnosed(llama(128, "eagle3", max_running_requests=128), tmp_path)
    f = found["speculation_costs"]
    assert "the verify takes" in f.evidence and "cost model estimate" in f.evidence
    effect = f.predicted_effect
    assert "prediction, not a measurement" in effect["source"]
    tried = {tuple(sorted(t["change"].items())): t for t in effect["tried"]}
    fewer = tried[tuple(sorted({"spec.num_steps": 1, "spec.topk": 1, "spec.num_draft_tokens": 2}.items()))]
    off = tried[(("spec.algorithm", "none"),)]
    # one draft step instead of EAGLE-3's tree: more tokens a second; none at all: shorter gaps
    assert fewer["change_pct"]["output_tok_s"] > 10
    assert off["change_pct"]["itl_p99_ms"] < 0
    assert "speculation_would_pay" not in found


def test_a_pipelined_trial_is_not_told_to_speculate(tmp_path: Path) -> None:
    # SGLang runs speculation with a pipeline only behind a switch parasweep does not set
    cfg = llama(1)
    cfg.pp.size = 2
    assert "speculation_would_pay" not in diagnosed(cfg, tmp_path)


def test_on_vllm_the_suggestion_names_a_draft_depth_and_is_predicted_on_vllm(tmp_path: Path) -> None:
    # vLLM has no depth of its own to choose: the change carries one, and the prediction plays vLLM
    cfg = llama(1)
    cfg.engine.name = "sim-vllm"
    f = diagnosed(cfg, tmp_path)["speculation_would_pay"]
    assert f.change == {"spec.algorithm": "eagle3", "spec.num_steps": 3}
    effect = f.predicted_effect
    assert effect["verdict"] == "helps", effect
    assert gain(effect, "throughput") > 0.5
