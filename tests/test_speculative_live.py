"""A speculative trial on the live simulated engine: measured within 5 % of its prediction (the median of
three points), and its logs, metrics and per-request reports in SGLang 0.5.23's own formats, read back
by parasweep's parsers.

Concurrency 1, so each request decodes alone: how requests group into batches cannot depend on the
machine's load. The engine plays in real time and the client measures it on the engine's own clock.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from orchestrator.telemetry.server_log import parse_log_line
from simulator.predict import predict_point
from tests.test_simulator_server import Server
from workloads import LoadPoint, RequestSpec, clock, run_point

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
RELEASES = REPO / "orchestrator" / "engines" / "sglang_compat" / "releases"
ARGV = ["--model-path", str(REPO / "models" / "llama-3.1-8b"), "--sim-hardware", "h100-sxm-x8",
        "--random-seed", "1", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
        str(REPO / "models" / "eagle3-llama-3.1-8b"), "--decode-log-interval", "10"]
POINT = LoadPoint(num_requests=8, concurrency=1)
SPEC = RequestSpec(api="generate", input_len=128, output_len=96)


def _release_accept_text(length: float, rate: float) -> str:
    """The decode line's acceptance part rendered from 0.5.23's own format string, as recorded."""
    formats = json.loads((RELEASES / "sglang-0.5.23.json").read_text())["log_formats"]
    source = next(f["source"] for f in formats if f["source"].startswith('f"accept len: {spec_accept_length'))
    return eval(source, {}, {"spec_accept_length": length, "spec_accept_rate": rate})  # an f-string literal


def test_a_speculative_trial_is_measured_within_5_percent_of_its_prediction(tmp_path: Path) -> None:
    pred = predict_point(ARGV, POINT, SPEC).metrics
    server = Server([*ARGV, "--enable-metrics"], tmp_path)
    try:
        info = json.loads(server.get("/server_info")[1])
        runs = []
        for _ in range(3):
            with clock.engine_clock(1.0, info["sim_wall_origin"]):
                runs.append(run_point(server.url, POINT, SPEC, lag_threshold_ms=250.0))
        metrics = server.get("/metrics")[1].decode()
        status, body = server.post("/generate", {"input_ids": list(range(1, 65)),
                                                 "sampling_params": {"max_new_tokens": 40}})
        info = json.loads(server.get("/server_info")[1])
        log = server.log()
    finally:
        server.stop()
    assert all(r.metrics["completed"] == 8 for r in runs)
    for metric in ("output_tok_s", "e2e_mean_ms"):
        live = statistics.median(r.metrics[metric] for r in runs)
        assert live == pytest.approx(pred[metric], rel=0.05), (metric, live, pred[metric])
    # multi-token chunks: per token and per chunk inter-token latency differ by the accept length
    assert pred["itl_chunk_mean_ms"] > 2 * pred["itl_mean_ms"]
    assert pred["tpot_chunk_mean_ms"] > 2 * pred["tpot_mean_ms"]

    # the decode log line as 0.5.23 writes it, read by the parser parasweep reads any release's log with
    lines = [parse_log_line(x) for x in log.splitlines() if "accept len:" in x]
    rows = [r for r in lines if r is not None and r["kind"] == "decode"]
    assert rows and all(1.0 <= r["accept_len"] <= 6.0 for r in rows)
    row = rows[-1]
    assert _release_accept_text(row["accept_len"], row["accept_rate"]) in log
    assert row["accept_rate"] == pytest.approx((row["accept_len"] - 1) / 7, abs=0.006)  # (len - 1) / (N - 1)
    # /metrics, /server_info and the request's meta_info
    gauges = dict(re.findall(r"^(sglang:spec_\w+)\{[^}]*\} (\S+)$", metrics, re.MULTILINE))
    assert float(gauges["sglang:spec_num_steps"]) == 5 and float(gauges["sglang:spec_num_draft_tokens"]) == 8
    assert float(gauges["sglang:spec_verify_calls_total"]) > 0
    # the simulated breakdown of the iterations' GPU time: the verify dominates at one request
    pattern = r'^parasweep_sim:spec_busy_seconds_total\{part="(\w+)"\} (\S+)$'
    busy = {m.group(1): float(m.group(2)) for m in re.finditer(pattern, metrics, re.MULTILINE)}
    assert set(busy) == {"draft", "verify", "extend", "kernels"}
    assert busy["verify"] > busy["draft"] > busy["extend"] > busy["kernels"] > 0
    expected = info["sim_spec_expected_accept_length"]
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(expected, rel=0.1)
    assert "published eagle3 accept lengths" in info["sim_spec_acceptance"]
    meta = json.loads(body)["meta_info"]
    assert status == 200 and meta["completion_tokens"] == 40
    assert meta["spec_accept_length"] == pytest.approx(40 / meta["spec_verify_ct"])
    assert meta["spec_num_proposed_drafts"] == 7 * meta["spec_verify_ct"]
