"""A disaggregated point's TTFT in parts and each role's GPU busy share, from what every server and GPU
reported over the point's window: what a live deployment gives whatever its engine (SGLang sends no
parts per request; the simulated engine sends them too, so the two can be held against each other).

* ``pd_stage_<part>_ms``: the mean of each part over the requests the servers' histograms counted in the
  window (``sglang:per_stage_req_latency_seconds{stage}`` and ``sglang:queue_time_seconds``: their
  ``_sum`` and ``_count`` read at the window's two ends, summed over the role's servers). Each part is
  the stage of SGLang's own request timeline that spans it (names and meaning from the releases'
  ``req_time_stats.py``, the same from 0.5.9 to 0.5.23):

  ====================  =====================================================  ==========
  part                  SGLang stage                                           server
  ====================  =====================================================  ==========
  bootstrap             ``prefill_bootstrap``: bootstrap queue to waiting queue  prefill
  prefill_queue         ``queue_time``: waiting queue to the first forward      prefill
  prefill               ``prefill_forward``: the first forward to the last      prefill
                        chunk's end
  transfer              ``prefill_transfer_kv_cache``: the last chunk's end to  prefill
                        the whole KV at the decode server
  decode_first          ``decode_waiting``: the KV arrived to the first token    decode
                        streamed
  ====================  =====================================================  ==========

  A request is counted in each histogram when its stage ends, so a window's parts come from slightly
  different requests near its edges.

  On vLLM (vllm-router sends a request to its prefill server, then to its decode server, which reads the
  KV over NIXL) there is no bootstrap, and the parts come from each role's own request timings:
  ``prefill_queue`` and ``prefill`` from the prefill servers' ``vllm:request_queue_time_seconds`` and
  ``vllm:request_prefill_time_seconds`` (first scheduled to first token), ``transfer`` from the decode
  servers' queue time (its arrival to its first step: the wait for KV room and the read; the router's hop
  between the two is in no histogram) and ``decode_first`` from their prefill time (the step that
  computes the last prompt token).
* ``pd_transfer_mb_per_gpu``: the KV a request moved per GPU (MB), the mean of the prefill servers'
  ``sglang:kv_transfer_total_mb`` over the window (a histogram from SGLang 0.5.10 on, in MiB despite its
  name; the requests of SGLang's warm-up and health probes are not in it), as predictions give it; on
  vLLM the decode servers' ``vllm:nixl_bytes_transferred`` (bytes per GPU, each read).
* ``pd_prefill_util_pct`` / ``pd_decode_util_pct``: the mean GPU utilisation of each role's GPUs (the
  trial's GPUs in placement order, prefill servers' first), as predictions give them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from analysis.dp_routing import histogram_mean
from vocab.records import PD_TTFT_PARTS
from vocab.telemetry import PD_DECODE_UTIL, PD_PREFILL_UTIL, PD_TRANSFER_MB, pd_stage_part, per_gpu

PER_STAGE = "sglang:per_stage_req_latency_seconds"
QUEUE_TIME = "sglang:queue_time_seconds"
KV_TRANSFER_MB = "sglang:kv_transfer_total_mb"
MIB = 2**20  # SGLang's "mb" of KV transfer: bytes / (1024 x 1024)
# each part of the TTFT: the role whose servers observe it, the histogram, the stage label (None: none)
STAGES = {"bootstrap": ("prefill", PER_STAGE, "prefill_bootstrap"),
          "prefill_queue": ("prefill", QUEUE_TIME, None),
          "prefill": ("prefill", PER_STAGE, "prefill_forward"),
          "transfer": ("prefill", PER_STAGE, "prefill_transfer_kv_cache"),
          "decode_first": ("decode", PER_STAGE, "decode_waiting")}


# vLLM's servers (vllm-router sends each request to the prefill server, then to the decode server, which
# reads the KV over NIXL): no bootstrap; each server's own queue and first-scheduled-to-first-token times
VLLM_QUEUE = "vllm:request_queue_time_seconds"
VLLM_PREFILL = "vllm:request_prefill_time_seconds"
VLLM_STAGES = {"prefill_queue": ("prefill", VLLM_QUEUE, None),
               "prefill": ("prefill", VLLM_PREFILL, None),
               "transfer": ("decode", VLLM_QUEUE, None),
               "decode_first": ("decode", VLLM_PREFILL, None)}
NIXL_BYTES = "vllm:nixl_bytes_transferred"


def stage_parts(scrapes: Mapping[str, Sequence[pd.DataFrame | None]], start: float, end: float,
                vllm: bool = False) -> dict[str, float]:
    """Each part's mean over [start, end] (module docstring), from every server's scrapes by role
    (``{"prefill": [...], "decode": [...]}``); a part no server counted is left out."""
    out: dict[str, float] = {}
    stages = VLLM_STAGES if vllm else STAGES
    for part in PD_TTFT_PARTS:
        if part not in stages:
            continue
        role, name, stage = stages[part]
        mean = histogram_mean(scrapes.get(role, []), name, start, end, **({"stage": stage} if stage else {}))
        if mean is not None:
            out[pd_stage_part(part)] = 1000.0 * mean
    return out


def transfer_size(scrapes: Mapping[str, Sequence[pd.DataFrame | None]], start: float, end: float,
                  vllm: bool = False) -> dict[str, float]:
    """The mean KV a request moved per GPU over [start, end] (MB), from the prefill servers' scrapes (the
    decode servers' on vLLM, whose reads count the bytes); {} where none counted a transfer."""
    if vllm:
        mean = histogram_mean(scrapes.get("decode", []), NIXL_BYTES, start, end)
        return {PD_TRANSFER_MB: mean / 1e6} if mean is not None else {}
    mean = histogram_mean(scrapes.get("prefill", []), KV_TRANSFER_MB, start, end)
    return {PD_TRANSFER_MB: mean * MIB / 1e6} if mean is not None else {}


def role_busy(extra: Mapping[str, float], prefill_gpus: int, gpus: int) -> dict[str, float]:
    """Each role's mean GPU utilisation over the window, from the per-GPU summaries of the trial's
    ``gpus`` GPUs, the first ``prefill_gpus`` the prefill servers'."""
    def mean(indices: range) -> float | None:
        values = [v for g in indices if (v := extra.get(per_gpu(g, "util_mean_pct"))) is not None
                  and math.isfinite(v)]
        return sum(values) / len(values) if values and len(values) == len(indices) else None

    out = {}
    for key, indices in ((PD_PREFILL_UTIL, range(prefill_gpus)), (PD_DECODE_UTIL, range(prefill_gpus, gpus))):
        value = mean(indices)
        if value is not None:
            out[key] = value
    return out
