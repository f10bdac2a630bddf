"""Per-stage scheduler series: what each pipeline stage reported, from two sources on one clock.

- the engine's batch log lines (``Prefill batch`` / ``Decode batch``, one per PP stage and TP rank
  that logs: running requests, queue, KV token usage, generation throughput), parsed by
  :mod:`orchestrator.telemetry.server_log`;
- its ``/metrics`` gauges (``sglang:num_running_reqs``, ``num_queue_reqs``, ``token_usage``,
  ``gen_throughput`` per ``pp_rank``/``tp_rank``, and the retraction counter), scraped by
  :mod:`orchestrator.telemetry.server_metrics`.

Both stamp epoch seconds on this host: the log with the engine's wall clock (to the millisecond: the
engine is started with ``SGLANG_LOG_MS=1``), the scrape with the scraper's. The rows go into one frame
with the columns of ``vocab.telemetry.STAGE_COLUMNS``, sorted by time, so a stage's queue can be read
beside the GPU samples and the request records. The same code serves SGLang and the simulated engine,
which writes the same lines and gauges.
"""

from __future__ import annotations

import json

import pandas as pd

from vocab.telemetry import STAGE_COLUMNS

# log field (server_log's names) -> stage column
_LOG_FIELDS = {"running_req": "running", "queue_req": "queue", "token_usage": "token_usage",
               "gen_throughput": "gen_throughput", "new_token": "new_tokens", "cached_token": "cached_tokens",
               "accept_len": "accept_len"}
# /metrics gauge -> stage column
GAUGES = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "queue",
           "sglang:token_usage": "token_usage", "sglang:gen_throughput": "gen_throughput",
           "sglang:num_retracted_requests_total": "retracted_total",
           "sglang:spec_accept_length": "accept_len"}
# vLLM's: requests in the step's batch and waiting, the KV cache's use (a fraction), and its preemptions
# (by recompute: what SGLang calls a retraction), per engine core
VLLM_GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "queue",
               "vllm:kv_cache_usage_perc": "token_usage", "vllm:num_preemptions_total": "retracted_total"}
# vLLM's speculative-decoding counters: drafts (request-verifies) and accepted drafts since start; between
# two scrapes they give the interval's accept length, 1 + accepted / drafts (vLLM's "Mean acceptance length")
VLLM_SPEC_COUNTERS = {"vllm:spec_decode_num_drafts_total": "spec_drafts_total",
                      "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_total"}
_COLUMNS = {**GAUGES, **VLLM_GAUGES, **VLLM_SPEC_COUNTERS}
# the rank labels: SGLang's dp_rank/pp_rank/tp_rank; vLLM's engine core index stands for the DP rank
_RANK_LABELS = {"dp": ("dp_rank", "engine"), "pp": ("pp_rank",), "tp": ("tp_rank",)}


def _from_log(log: pd.DataFrame | None) -> pd.DataFrame:
    if log is None or log.empty:
        return pd.DataFrame(columns=list(STAGE_COLUMNS))
    out = pd.DataFrame({"ts": log["ts"], "source": "log", "kind": log["kind"],
                        "dp": log["dp"], "pp": log["pp"], "tp": log["tp"]})
    for field, column in _LOG_FIELDS.items():
        out[column] = pd.to_numeric(log[field], errors="coerce") if field in log.columns else float("nan")
    out["retracted_total"] = float("nan")  # the log reports retractions per event, not as a total
    return out


def _from_metrics(metrics: pd.DataFrame | None) -> pd.DataFrame:
    if metrics is None or metrics.empty:
        return pd.DataFrame(columns=list(STAGE_COLUMNS))
    rows = metrics[metrics["name"].isin(list(_COLUMNS))]
    if rows.empty:
        return pd.DataFrame(columns=list(STAGE_COLUMNS))
    labels = rows["labels"].map(json.loads)
    frame = pd.DataFrame({"ts": rows["ts"].to_numpy(), "column": rows["name"].map(_COLUMNS).to_numpy(),
                          "value": rows["value"].to_numpy()})
    for rank, names in _RANK_LABELS.items():
        frame[rank] = [int(next((x[n] for n in names if x.get(n)), 0) or 0) for x in labels]
    # one row per scrape and stage
    wide = frame.pivot_table(index=["ts", "dp", "pp", "tp"], columns="column", values="value",
                             aggfunc="max").reset_index()
    # prometheus_client exports a labelled counter only from its first increment, so SGLang's
    # retraction counter is absent (not 0) in every scrape before the first retraction; every
    # supported release has it, so absent means none yet
    wide["retracted_total"] = wide["retracted_total"].fillna(0.0) if "retracted_total" in wide else 0.0
    if "spec_drafts_total" in wide and "spec_accepted_total" in wide:
        wide = wide.sort_values("ts", kind="stable")
        per_stage = wide.groupby(["dp", "pp", "tp"])
        drafts = per_stage["spec_drafts_total"].diff()
        wide["accept_len"] = (1 + per_stage["spec_accepted_total"].diff() / drafts).where(drafts > 0)
    wide["source"], wide["kind"] = "metrics", "gauge"
    for column in STAGE_COLUMNS:
        if column not in wide.columns:
            wide[column] = float("nan")
    return wide[list(STAGE_COLUMNS)]


def stage_frame(log: pd.DataFrame | None, metrics: pd.DataFrame | None) -> pd.DataFrame | None:
    """Log rows and scraped gauges as one frame of ``STAGE_COLUMNS`` (None when neither has any)."""
    parts = [p for p in (_from_log(log), _from_metrics(metrics)) if not p.empty]
    if not parts:
        return None
    frame = pd.concat(parts, ignore_index=True)[list(STAGE_COLUMNS)]
    for column in ("dp", "pp", "tp"):
        frame[column] = frame[column].astype(int)
    return frame.sort_values("ts", kind="stable").reset_index(drop=True)
