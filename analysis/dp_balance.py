"""How evenly the attention-DP ranks of an engine shared its lockstep forwards over a point's window, from
SGLang's own balance series (0.5.23; the simulated engine exports the same), counters and histograms
read at the window's two ends:

* ``dp_attention_imbalance_frac``: of the token slots the ranks' forwards ran, the share lost to
  imbalance: the busiest rank's tokens beyond each rank's own (``sglang:dp_attention_tokens_total``,
  ``kind=imbalance`` over ``scheduled`` + ``imbalance``, every rank summed). 0: every rank ran as many
  tokens as the busiest in every forward.
* ``dp_attention_idle_steps_frac``: the share of the ranks' forwards in which a rank had no tokens of its
  own and ran only to keep the collectives in lockstep (``sglang:dp_attention_steps_total``).
* ``dp_attention_imbalance_ratio_mean``: the busiest rank's tokens over the mean, per forward, averaged
  (``sglang:dp_attention_token_imbalance_ratio``; 1: balanced, the rank count: one busy rank).
* ``dp_attention_sync_wait_ms_mean``: a rank's wait at the exchange of batch sizes, for the slowest
  rank's scheduler (``sglang:dp_attention_sync_wait_seconds``).
"""

from __future__ import annotations

import pandas as pd

from analysis.dp_routing import histogram_mean, increase_of, series_of
from vocab.telemetry import DP_IDLE_STEPS_FRAC, DP_IMBALANCE_FRAC, DP_IMBALANCE_RATIO_MEAN, DP_SYNC_WAIT_MS


def balance_summary(metrics: pd.DataFrame | None, start: float, end: float) -> dict[str, float]:
    """The point's summaries (module docstring); empty for an engine without attention-DP ranks."""
    out: dict[str, float] = {}
    if metrics is None or metrics.empty or not (metrics["name"] == "sglang:dp_attention_steps_total").any():
        return out
    tokens = {kind: increase_of(series_of(metrics, "sglang:dp_attention_tokens_total", kind=kind), start, end)
              for kind in ("scheduled", "imbalance")}
    if tokens["scheduled"] is not None and tokens["imbalance"] is not None:
        total = tokens["scheduled"] + tokens["imbalance"]
        if total > 0:
            out[DP_IMBALANCE_FRAC] = tokens["imbalance"] / total
    steps = {state: increase_of(series_of(metrics, "sglang:dp_attention_steps_total", rank_state=state),
                                start, end) for state in ("active", "idle")}
    if steps["active"] is not None and steps["idle"] is not None and steps["active"] + steps["idle"] > 0:
        out[DP_IDLE_STEPS_FRAC] = steps["idle"] / (steps["active"] + steps["idle"])
    ratio = histogram_mean([metrics], "sglang:dp_attention_token_imbalance_ratio", start, end)
    if ratio is not None:
        out[DP_IMBALANCE_RATIO_MEAN] = ratio
    wait = histogram_mean([metrics], "sglang:dp_attention_sync_wait_seconds", start, end)
    if wait is not None:
        out[DP_SYNC_WAIT_MS] = 1e3 * wait
    return out
