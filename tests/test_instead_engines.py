""""Run this instead" across engines: a sweep that ran SGLang and vLLM (both played by the simulated
engine, in virtual time) gets its candidates from each engine's best trial, and an answer on vLLM comes
with the ``vllm serve`` command it stands for (checked against the release), not SGLang's."""

from __future__ import annotations

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.search.instead import SweepTrial, run_instead
from vocab.hardware import load_hardware

pytestmark = pytest.mark.slow  # each candidate is a prediction


def trial(engine: str, **server: object) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = engine
    cfg.model.name, cfg.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    cfg.hardware = load_hardware("h100-sxm-x8")
    cfg.pp.size = 2
    cfg.workload.concurrency = [64]
    cfg.workload.input_len, cfg.workload.output_len = 1000, 300
    for key, value in server.items():
        setattr(cfg.server, key, value)
    return cfg


def test_the_answer_may_be_the_other_engine_s_with_its_own_command() -> None:
    # Llama-3.1-8B on 2 H100s in two pipeline stages at c64, on SGLang admitting 16 requests and on vLLM.
    # Every layout of SGLang's trial keeps its cap; vLLM's trial has neighbours too, and vLLM at TP2
    # (predicted about 5,800 tok/s against 3,700 for its trial) is better than both trials
    sglang = SweepTrial("#0 engine=sglang", trial("sim", max_running_requests=16),
                        ("engine=sglang", "pp.size=2", "server.max_running_requests=16"))
    vllm = SweepTrial("#1 engine=vllm", trial("sim-vllm"), ("engine=vllm", "pp.size=2"))
    answer = run_instead([sglang, vllm])
    assert "recommend" in answer, answer
    r = answer["recommend"]
    assert r["base"] == "#1 engine=vllm" and r["change"] == {"tp.size": 2, "pp.size": 1}
    assert r["vllm"].startswith("vllm serve ") and "--tensor-parallel-size 2" in r["vllm"]
    assert r["vllm_release"] == "0.34.0" and "sglang" not in r
    assert "engine=vllm" in r["run_py"] and "tp.size=2 pp.size=1" in r["run_py"]
    assert "vLLM 0.24.0" in r["source"]  # priced with vLLM's kernels
    assert r["per_load"]["c64"]["change_pct"]["output_tok_s"] > 30
