"""End to end against the simulated engine, which speaks SGLang 0.5.23's flags, HTTP API and log format:
the argv builder, readiness, /server_info + startup log -> resolved values, and the batch-log parser's
per-stage series all run on a live server process."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.base import HOST
from orchestrator.engines.registry import get_engine
from orchestrator.process.server import ServerProcess, free_port, http_get_json
from orchestrator.telemetry.server_log import resolved_config, resolved_params, server_log_frame, stage_series
from vocab.hardware import load_hardware

pytestmark = pytest.mark.slow  # a real simulated engine process


def _cfg() -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    cfg.tp.size, cfg.pp.size, cfg.pp.async_depth = 2, 2, 1
    cfg.server.max_running_requests = 16
    cfg.server.decode_log_interval = 3  # coprime with the 3 PP slots, and often enough for a short run
    cfg.engine.time_scale = 20.0
    return cfg


def test_sim_engine_readiness_resolved_config_and_log_series(tmp_path: Path) -> None:
    from workloads import LoadPoint, RequestSpec, run_point

    cfg = _cfg()
    engine = get_engine("sim")
    port = free_port()
    argv = engine.argv(cfg, port, tmp_path)
    engine.prepare(cfg, tmp_path)
    log_path = tmp_path / "server" / "server.log"
    with ServerProcess(argv, log_path, HOST, port) as server:
        server.wait_ready(60)
        info = http_get_json(server.url + "/server_info")
        spec = RequestSpec(api="generate", input_len=32, output_len=48, seed=0, vocab_size=1024,
                           model=cfg.model.name)
        result = run_point(server.url, LoadPoint(concurrency=8, num_requests=16, warmup_requests=0), spec)
        assert result.metrics["errors"] == 0
    log_text = log_path.read_text()

    resolved = resolved_config(info, log_text)
    assert resolved["max_running_requests"] == info["internal_states"][0][
        "effective_max_running_requests_per_dp"] == 16
    assert resolved["pp_size"] == 2 and resolved["tp_size"] == 2 and resolved["pp_async_batch_depth"] == 1
    assert resolved["max_total_num_tokens"] == info["max_total_num_tokens"]
    # as 0.5.23 reports it: the raw input (unset) at the top level, the resolved size nested
    assert info["cuda_graph_max_bs_decode"] is None
    assert resolved["cuda_graph_bs_decode"][-1] == info["cuda_graph_config"]["decode"]["max_bs"]
    assert resolved["cuda_graph_max_bs_decode"] == info["cuda_graph_config"]["decode"]["max_bs"]
    assert resolved["attention_backend"] == info["attention_backend"]
    assert resolved["decode_log_interval"] == 3
    assert info["pp_max_micro_batch_size"] is None  # unset input; the scheduler's copy has the value
    assert resolved["pp_max_micro_batch_size"] == info["internal_states"][0]["pp_max_micro_batch_size"] == 8
    assert resolved["version"] == "0.5.23"
    assert all(k.startswith("resolved.") and isinstance(v, str) for k, v in resolved_params(resolved).items())

    frame = server_log_frame(log_path)
    decode = frame[frame["kind"] == "decode"]
    assert set(decode["pp"]) == {0, 1} and set(decode["tp"]) == {0}  # one line per stage, TP0 only
    assert (frame["kind"] == "prefill").any()
    running = stage_series(frame, "running_req")
    assert sorted(running) == ["PP0", "PP1"]
    for series in running.values():
        # one micro-batch per line: never more than the per-slot cap
        assert 0 < series.max() <= resolved["pp_max_micro_batch_size"]
    assert set(stage_series(frame, "cuda_graph")["PP0"]) <= {True, False}
    assert (decode["gen_throughput"] > 0).any()
    assert decode["token_usage"].between(0, 1).all()
    assert decode["ts"].is_monotonic_increasing
