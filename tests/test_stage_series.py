"""Per-stage series for SGLang: its batch log lines (per PP stage and TP rank, millisecond stamps) and
its /metrics gauges, joined into one frame on the same clock; then summarised per load point."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis.telemetry import point_telemetry
from orchestrator.telemetry.server_log import server_log_frame
from orchestrator.telemetry.server_metrics import parse_samples
from orchestrator.telemetry.stage_series import stage_frame
from vocab.telemetry import STAGE_COLUMNS, engine_layout, per_stage

# SGLang 0.5.x lines with SGLANG_LOG_MS=1: DP/PP/TP tags, one line per stage's TP rank 0
DECODE = ("Decode batch, #running-req: {r}, #token: {t}, token usage: {u:.2f}, cuda graph: {g}, "
          "gen throughput (token/s): {tput:.2f}, #queue-req: {q}")
PREFILL = ("Prefill batch, #new-seq: 2, #new-token: 64, #cached-token: 0, token usage: 0.45, "
           "#running-req: 4, #queue-req: 2, #pending-token: 0, cuda graph: False, "
           "input throughput (token/s): 900.00")
LOG = "\n".join([
    "[2026-05-02 09:00:00.100] The server is fired up and ready to roll!",
    "[2026-05-02 09:00:01.250 PP0 TP0] " + DECODE.format(r=4, t=900, u=0.40, g=True, tput=100, q=0),
    "[2026-05-02 09:00:01.260 PP1 TP0] " + DECODE.format(r=3, t=900, u=0.40, g=True, tput=100, q=0),
    "[2026-05-02 09:00:02.500 PP0 TP0] " + PREFILL,
    "[2026-05-02 09:00:03.750 PP1 TP0] " + DECODE.format(r=5, t=990, u=0.97, g=False, tput=120, q=4),
]) + "\n"

LABELS = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="{pp}",moe_ep_rank="0"'


def metrics_text(r0: int, r1: int, q: int, retracted: int) -> str:
    """One /metrics scrape of a 2-stage server, as SGLang exports it."""
    lines = ["# TYPE sglang:num_running_reqs gauge"]
    lines += [f"sglang:num_running_reqs{{{LABELS.format(pp=pp)}}} {r}" for pp, r in ((0, r0), (1, r1))]
    lines += ["# TYPE sglang:num_queue_reqs gauge"]
    lines += [f"sglang:num_queue_reqs{{{LABELS.format(pp=pp)}}} {q}" for pp in (0, 1)]
    lines += ["# TYPE sglang:num_retracted_requests counter",
              f"sglang:num_retracted_requests_total{{{LABELS.format(pp=0)}}} {retracted}"]
    return "\n".join(lines) + "\n"


def epoch(stamp: str) -> float:
    base, ms = stamp.split(".")
    return time.mktime(time.strptime(base, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


@pytest.fixture
def frame(tmp_path: Path) -> pd.DataFrame:
    log = tmp_path / "server.log"
    log.write_text(LOG)
    t0 = epoch("2026-05-02 09:00:01.000")
    rows = []
    for i, (r0, r1, q, retracted) in enumerate([(4, 3, 0, 0), (4, 3, 2, 1), (5, 5, 4, 3)]):
        rows += parse_samples(metrics_text(r0, r1, q, retracted), t0 + i)
    metrics = pd.DataFrame(rows, columns=["ts", "name", "labels", "value"])
    out = stage_frame(server_log_frame(log), metrics)
    assert out is not None
    return out


def test_log_lines_and_gauges_share_one_frame_on_one_clock(frame: pd.DataFrame) -> None:
    assert list(frame.columns) == list(STAGE_COLUMNS)
    assert frame["ts"].is_monotonic_increasing
    log = frame[frame["source"] == "log"]
    assert len(log) == 4 and set(log["pp"]) == {0, 1}
    # millisecond stamps survive: the PP0 and PP1 reports 10 ms apart stay apart
    first = log.iloc[:2]
    assert first["ts"].diff().iloc[1] == pytest.approx(0.010, abs=1e-6)
    assert first["ts"].iloc[0] == pytest.approx(epoch("2026-05-02 09:00:01.250"))
    prefill = log[log["kind"] == "prefill"].iloc[0]
    assert (prefill["running"], prefill["queue"], prefill["token_usage"]) == (4, 2, 0.45)
    assert prefill["new_tokens"] == 64  # the prompt tokens the batch prefilled (#new-token)
    assert log[log["kind"] == "decode"]["new_tokens"].isna().all()
    gauges = frame[frame["source"] == "metrics"]
    assert len(gauges) == 6  # 3 scrapes x 2 stages
    assert gauges[gauges["pp"] == 0]["retracted_total"].tolist() == [0, 1, 3]
    assert gauges[gauges["pp"] == 1]["running"].tolist() == [3, 3, 5]


def test_no_series_gives_none() -> None:
    assert stage_frame(None, None) is None
    assert stage_frame(pd.DataFrame(columns=["ts", "kind", "dp", "pp", "tp"]), None) is None


def test_point_summaries_of_the_joined_frame(frame: pd.DataFrame) -> None:
    start, end = epoch("2026-05-02 09:00:00.900"), epoch("2026-05-02 09:00:04.000")
    out = point_telemetry(None, frame, start, end, 0, 0.0, engine_layout(1, 2))
    # the log is preferred where it reports a column: stage 1's running requests are its two lines
    assert out[per_stage(1, "running_mean")] == pytest.approx((3 + 5) / 2)
    assert out["kv_token_usage_max"] == pytest.approx(0.97)
    # the log does not report retractions: the gauges' counter does (0 -> 3 over the window)
    assert out["retracted_reqs"] == pytest.approx(3)
    # the waiting queue of the replica, read once (stage 0's log lines: 0 then 2); the one prefill
    # batch (stage 0's line) carried 64 prompt tokens beside 4 running requests
    assert out["queue_reqs_mean"] == pytest.approx(1.0)
    assert (out["prefill_batch_tokens_max"], out["prefill_batch_tokens_mean"]) == (64, 64)
    assert out["prefill_batches_with_decodes_frac"] == 1.0
    assert (out["log_cached_tokens"], out["log_computed_tokens"], out["log_cache_hit_rate"]) == (0, 64, 0.0)
    assert json.dumps(out)  # plain floats, loggable as MLflow metrics


def test_the_retraction_counter_reads_zero_until_its_first_retraction() -> None:
    # prometheus_client exports a labelled counter only once it has a child: SGLang's
    # sglang:num_retracted_requests_total (labels incl. pp_rank) appears at the first retraction
    t0 = 1_000.0
    rows = []
    for i, retracted in enumerate([None, None, 4, 6]):
        text = metrics_text(2, 2, 1, retracted or 0)
        if retracted is None:  # not exported yet
            text = "\n".join(ln for ln in text.splitlines() if "retracted" not in ln) + "\n"
        rows += parse_samples(text, t0 + i)
    frame = stage_frame(None, pd.DataFrame(rows, columns=["ts", "name", "labels", "value"]))
    assert frame is not None
    stage0 = frame[frame["pp"] == 0]
    assert stage0["retracted_total"].tolist() == [0, 0, 4, 6]
    # a point from before the first retraction to after it counts every retraction, not 6 - 4
    summary = point_telemetry(None, frame, t0 + 0.5, t0 + 3.5, 100, 0.0, [])
    assert summary["retracted_reqs"] == 6


REAL_LOGS = Path(__file__).parent / "data" / "sglang" / "real-logs"


def test_the_cache_hit_rate_of_a_real_sglang_log() -> None:
    # a conversation sent turn by turn to SGLang (tests/data/sglang/real-logs/README.md): each turn
    # computes a few tokens and finds the conversation so far in the radix cache
    log = server_log_frame(REAL_LOGS / "cache-hits-issue-10053.log")
    frame = stage_frame(log, None)
    assert frame is not None
    prefill = frame[frame["kind"] == "prefill"]
    assert prefill["cached_tokens"].tolist() == [1, 184, 275]
    assert prefill["new_tokens"].tolist() == [103, 18, 15]
    start, end = float(frame["ts"].min()), float(frame["ts"].max())
    out = point_telemetry(None, frame, start, end, 0, 0.0, [])
    assert out["log_cached_tokens"] == 460 and out["log_computed_tokens"] == 136
    assert out["log_cache_hit_rate"] == pytest.approx(460 / 596)
    # the window counts only its own batches: from the second turn on
    later = point_telemetry(None, frame, float(prefill["ts"].iloc[1]), end, 0, 0.0, [])
    assert later["log_cache_hit_rate"] == pytest.approx((184 + 275) / (184 + 275 + 18 + 15))
