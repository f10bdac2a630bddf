"""The rules on a disaggregated deployment, end to end on scenarios whose bottleneck is known by
construction: each trial predicted in virtual time, diagnosed, and the deployment's own change predicted
before it is suggested (one more server of the starved role, for one of the other on the same GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from tests.test_diagnosis_scenarios import predicted_findings
from vocab.findings import Finding
from vocab.hardware import load_hardware

pytestmark = pytest.mark.slow


def deployment(prefill: int, decode: int, concurrency: int, input_len: int, output_len: int) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    cfg.hardware = load_hardware("h100-sxm-x8")
    cfg.pd.enabled = True
    cfg.pd.prefill.workers, cfg.pd.decode.workers = prefill, decode
    cfg.workload.concurrency = [concurrency]
    cfg.workload.input_len, cfg.workload.output_len = input_len, output_len
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 3, 1
    return cfg


def finding(findings: list[Finding], rule: str) -> Finding:
    found = {f.id: f for f in findings}
    assert rule in found, sorted(found)
    f = found[rule]
    assert f.predicted_effect and f.predicted_effect["verdict"] == "helps", f.predicted_effect
    assert "prediction, not a measurement" in f.predicted_effect["source"]
    return f


def own_change(f: Finding, change: dict[str, object]) -> dict[str, object]:
    """The rule's own change among those tried for ``f``: predicted to help (the change suggested is the
    best of all tried, which may be another layout of the same GPUs)."""
    tried = next(t for t in f.predicted_effect["tried"] if t["change"] == change)
    assert tried["verdict"] == "helps", tried
    return tried


def test_long_prompts_on_one_prefill_server_ask_for_another(tmp_path: Path) -> None:
    # 4,000-token prompts, 16 tokens out, 32 streams: three decode servers wait on one prefill server
    findings = predicted_findings(deployment(1, 3, 32, 4000, 16), tmp_path)
    f = finding(findings, "pd_prefill_bound")
    own_change(f, {"pd.prefill.workers": 2, "pd.decode.workers": 2})  # the same four GPUs
    # what is suggested moves GPUs to prefill too: more prefill servers than the one it had
    assert f.change and f.change.get("pd.enabled", True) and f.change.get("pd.prefill.workers", 1) > 1
    assert "queueing for a prefill server" in f.evidence and f.goal == "ttft_p99_ms"
    assert "pd_decode_bound" not in {x.id for x in findings}


def test_long_outputs_on_one_decode_server_ask_for_another(tmp_path: Path) -> None:
    # 128-token prompts, 512 tokens out, 96 streams: one decode server, two prefill servers mostly idle
    findings = predicted_findings(deployment(2, 1, 96, 128, 512), tmp_path)
    f = finding(findings, "pd_decode_bound")
    assert f.change == {"pd.decode.workers": 2, "pd.prefill.workers": 1}
    assert "pd_prefill_bound" not in {x.id for x in findings}


def test_a_small_decode_pool_holds_prefills_back(tmp_path: Path) -> None:
    cfg = deployment(1, 1, 8, 3000, 256)
    cfg.pd.decode.extra_args = {"max-total-tokens": 12000}  # three prompts with their reserves
    f = finding(predicted_findings(cfg, tmp_path), "pd_decode_kv_pressure")
    own_change(f, {"pd.decode.workers": 2})
    assert "waiting for the decode server's pre-allocation" in f.evidence


def test_a_ratio_change_that_needs_more_gpus_is_said_to_be_impossible(tmp_path: Path) -> None:
    # 1P1D of TP4 on the 8-GPU PCIe node, short load of long outputs: the decode server is the
    # bottleneck, and one more decode server would need 12 GPUs. The advice says so (not "would not
    # help") and suggests the best layout of the same 8 GPUs instead.
    from analysis.report import advice_text

    cfg = deployment(1, 1, 8, 1000, 400)
    cfg.model.name, cfg.model.path = "qwen3-30b-a3b", "models/qwen3-30b-a3b"
    cfg.hardware = load_hardware("rtx-pro-6000-pcie-x8")
    cfg.tp.size = 4
    f = finding(predicted_findings(cfg, tmp_path), "pd_decode_bound")
    own = next(t for t in f.predicted_effect["tried"] if t["change"] == {"pd.decode.workers": 2})
    assert own["verdict"].startswith("not possible: pd.prefill.workers+pd.decode.workers=1+2: invalid")
    assert advice_text(f.to_dict()).startswith("pd.decode.workers=2 is not possible; instead set ")
