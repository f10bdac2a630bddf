"""The long-prompt findings on the simulated engine over real HTTP: each rule fires on the trial built
for it, from the signals SGLang reports (batch log, /metrics, each request's queue time in /generate's
meta_info, the client's latencies), and stays quiet on the others; every suggestion carries its
predicted effect.

=================== ========================================================================
scenario            built so that
=================== ========================================================================
kv-bound admission  the KV pool holds 3 of the 16 requests kept in flight (Llama-3.1-70B TP4,
                    2,048-token prompts, a small static memory share): the rest wait
prefill stalls      8 requests decode while prompts of ~4,096 tokens (lognormal) are prefilled
                    beside them (Llama-3.1-8B): the decodes wait out each prefill
queueing            32 prompts of 4,096 tokens kept in flight, one output token each (scoring long
                    documents): one GPU prefills two at a time, and TTFT is the wait
=================== ========================================================================
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan
from orchestrator.trial.run import TrialRunSettings, execute_trial
from tests.conftest import sqlite_store
from vocab.hardware import load_hardware
from vocab.status import TrialStatus

pytestmark = pytest.mark.slow

NEW_RULES = {"kv_capacity", "prefill_interference", "ttft_queueing"}
SIMULATED = "simulated engine in virtual time (a prediction, not a measurement)"


def trial(tmp_path: Path, model: str, **workload: object) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = model, f"models/{model}"
    cfg.hardware = load_hardware("h100-sxm-x8")
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 2, 1
    for key, value in workload.items():
        setattr(cfg.workload, key, value)
    cfg.telemetry.gpu_hz = 2.0
    cfg.tracking.uri = sqlite_store(tmp_path / "mlflow.db")
    return cfg


def findings(cfg: ParasweepConf, tmp_path: Path) -> dict[str, dict]:
    plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(0, "long", tmp_path / "trial", ()))
    outcome = execute_trial(plan, TrialRunSettings(cfg.tracking.uri, "long", own_progress_view=False))
    assert outcome.status is TrialStatus.OK, outcome.error
    found = {f["id"]: f for f in json.loads((tmp_path / "trial" / "diagnosis.json").read_text())}
    for f in found.values():
        if f["change"]:
            assert f["predicted_effect"]["verdict"] == "helps", f
            assert SIMULATED in f["predicted_effect"]["source"] and SIMULATED in f["suggestion"]
    return found


def test_kv_bound_admission(tmp_path: Path) -> None:
    cfg = trial(tmp_path, "llama-3.1-70b", concurrency=[16], input_len=2048, output_len=512)
    cfg.tp.size, cfg.server.mem_fraction_static = 4, 0.42
    cfg.engine.time_scale = 4.0  # closed loop: the same load whatever the pace of the playback
    found = findings(cfg, tmp_path)
    assert NEW_RULES & set(found) == {"kv_capacity"}
    kv = found["kv_capacity"]
    evidence = kv["evidence"]
    # the reason in the scheduler's terms: few run, many wait, below both the concurrency and the cap
    assert "requests waited on average while about" in evidence
    assert "below the concurrency 16 and max_running_requests=" in evidence
    # how many requests the pool holds at these lengths, and where the TTFT went
    assert ("at 2,048 + 512 tokens a request (prompt and every decode token, reserved at admission)"
            in evidence)
    assert "KV pool holds 3 requests" in evidence
    assert "queueing (each request's queue time, simulated engine's report, not measured)" in evidence
    assert "holds 3 requests at c16 (simulated engine's log / metrics, not measured)" in evidence
    # more static memory admits the waiting requests: far more throughput and far less TTFT, predicted
    # on the point's steady window (where the prefills of the many more running requests reach the ITL
    # tail: it may come back as a trade-off, which the finding then names with its cost)
    tried = kv["predicted_effect"]["tried"]
    more = next(t for t in tried if t["change"] == {"server.mem_fraction_static": 0.47})
    assert more["change_pct"]["output_tok_s"] > 50 and more["change_pct"]["ttft_p99_ms"] < -50
    if more["verdict"] == "trade-off" and "change_pct" not in kv["predicted_effect"]:
        assert "server.mem_fraction_static=0.47" in kv["suggestion"] and "trade-off" in kv["suggestion"]


def test_prefill_interference(tmp_path: Path) -> None:
    # eight streams at a quarter of real time: light work for the client, whose latencies the rule
    # reads (a client that falls behind makes the point invalid, and the rule rightly ignores it; on
    # the engine's clock a stall of the client's weighs a quarter as much, so a busy machine does not)
    cfg = trial(tmp_path, "llama-3.1-8b", concurrency=[8], input_len=4096, output_len=128,
                input_dist="lognormal:0.5", output_dist="lognormal:0.5")
    cfg.engine.time_scale = 0.25
    found = findings(cfg, tmp_path)
    assert NEW_RULES & set(found) == {"prefill_interference"}
    stall = found["prefill_interference"]
    assert "(load generator)" in stall["evidence"] and "mixed chunk off" in stall["evidence"]
    assert stall["goal"] == "itl_p99_ms"
    # the remedy: smaller chunks mixed into the running decodes, the suggestion where it helps, else the
    # best trade-off (its prefills' dispatch, chunk by chunk, can cost more TTFT than the ITL it buys)
    effect = stall["predicted_effect"]
    best = stall["change"] or effect["best_trade_off"]["change"]
    assert best["server.extra_args.enable-mixed-chunk"] is True
    assert best["server.chunked_prefill_size"] < 8192
    # predicted for what it buys (the ITL tail) and what it costs (TTFT), on the same point
    mixed = next(t for t in effect["tried"] if t["change"] == best)
    assert mixed["change_pct"]["itl_p99_ms"] <= -30 and "ttft_p99_ms" in mixed["change_pct"]


@pytest.mark.parametrize("api", ["generate", "completions"])
def test_ttft_queueing(tmp_path: Path, api: str) -> None:
    # 32 prompts of 4,096 tokens kept in flight, one output token each: the GPU prefills two at a time
    cfg = trial(tmp_path, "llama-3.1-8b", concurrency=[32], input_len=4096, output_len=1, api=api)
    cfg.engine.time_scale = 0.25  # the client's stalls weigh a quarter as much (as above)
    found = findings(cfg, tmp_path)
    assert NEW_RULES & set(found) == {"ttft_queueing"}
    queueing = found["ttft_queueing"]
    assert queueing["goal"] == "ttft_p99_ms" and queueing["change"] == {"dp.size": 2}
    assert queueing["predicted_effect"]["change_pct"]["ttft_p99_ms"] < -30  # two replicas: half the wait
    assert queueing["predicted_effect"]["gpus"] == 2 and "on 2 GPUs" in queueing["suggestion"]
    if api == "generate":  # the server's own queue time per request
        assert "TTFT p99" in queueing["evidence"] and "each request's queue time" in queueing["evidence"]
    else:  # no per-request timing in the OpenAI API: the mean, from the engine's queue reports
        assert "TTFT mean" in queueing["evidence"] and "Little's law" in queueing["evidence"]
        assert "(simulated engine's log / metrics, not measured)" not in queueing["evidence"]
        assert "simulated engine's log / metrics, not measured" in queueing["evidence"]
