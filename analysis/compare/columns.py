"""What a row of the comparison is: its core columns, which of them describe rather than measure, which
metrics are better lower, and the one error the command reports."""

from __future__ import annotations

TABLE_WIDTH = 100  # the terminal table never gets wider than this
PREDICTED_ENGINE = "sim-predict"  # the engine tag of prediction runs; also given to a trial's pred/ rows

# The columns every row has, in this order; the remaining per-point metrics follow alphabetically.
CORE_COLUMNS = (
    "label", "kind", "engine", "simulated", "gpus", "concurrency", "output_tok_s", "tok_s_per_gpu",
    "tok_s_per_user", "tok_s_per_user_from", "ttft_p99_ms", "itl_p99_ms", "j_per_output_token", "valid",
    "run_id", "run_name", "sweep_id", "sweep", "trial_num", "overrides")
# Columns that describe the row rather than measure it: no SLO can name them.
DESCRIPTIVE = frozenset(CORE_COLUMNS) - {
    "output_tok_s", "tok_s_per_gpu", "tok_s_per_user", "ttft_p99_ms", "itl_p99_ms", "j_per_output_token",
    "gpus", "concurrency"}


class CompareError(Exception):
    """Bad input or an unusable store: the message is the one line the user sees (exit 2)."""


def lower_is_better(metric: str) -> bool:
    """Latencies (``*_ms``), energy per token and error counts: smaller is better. Everything else
    (throughputs, rates, concurrency) is taken as larger is better."""
    return metric.endswith("_ms") or metric.startswith("errors") or metric == "j_per_output_token"
