"""SGLang's server log, parsed in a way that survives its versions (formats: docs/sglang-adapter.md).

- Batch lines: the header was ``Decode batch.`` (<=0.5.3, 0.4.x), ``Decode batch [N],`` (0.5.4, and
  0.5.7+ with SGLANG_LOG_FORWARD_ITERS=1) and ``Decode batch,`` (0.5.7+); rank tags came in the order
  ``DP TP EP PP`` up to 0.5.4 and ``DP PP ATTN_CP MOE_DP TP EP`` after; fields moved and were added in
  most releases. So: the header by regex, rank tags order-free, every ``key: value`` field by name.
- Startup lines: the effective limits (once per PP stage), the CUDA-graph capture list, the chosen
  attention backend, forced settings; merged with ``/server_info`` into the ``resolved.*`` values.

Under PP every stage logs its own line: ``#running-req`` is one micro-batch, not the server, so the
rows keep their ``pp`` rank and are never summed across stages here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

_PREFIX = re.compile(r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?P<ms>\.\d{1,6})?(?P<tags>[^\]]*)\]\s?")
_TAG = re.compile(r"\b(DP|PP|ATTN_CP|MOE_DP|TP|EP)(\d+)\b")
_HEADER = re.compile(r"\b(?P<kind>Prefill|Decode) batch(?: \[(?P<iter>\d+)\])?[.,]\s*(?P<body>.*)$")
_FIELD_SPLIT = re.compile(r",\s+")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?$")
_RANKS = ("dp", "pp", "tp", "ep")  # always present (0 when the tag is absent: that size is 1)
BASE_COLUMNS = ["ts", "kind", "iter", *_RANKS]


def _field_name(key: str) -> str:
    """``#running-req`` -> running_req, ``gen throughput (token/s)`` -> gen_throughput,
    ``cpu graph``/``npu graph``/``musa graph`` -> cuda_graph (the label names the device, the meaning
    is the same)."""
    name = re.sub(r"\([^)]*\)", "", key).strip().lower().lstrip("#")
    name = re.sub(r"[^a-z0-9]+", "_", name).strip("_")
    return "cuda_graph" if name in ("cpu_graph", "npu_graph", "musa_graph") else name


def _value(text: str) -> Any:
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    if text.endswith("%"):
        text = text[:-1]
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def _prefix(line: str) -> tuple[float | None, dict[str, int], str]:
    """(epoch seconds or None, rank tags, message) of one log line."""
    m = _PREFIX.match(line)
    if not m:
        return None, {}, line
    # SGLang logs local time, one-second resolution unless SGLANG_LOG_MS=1 adds milliseconds
    ts = time.mktime(time.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S")) + float(m.group("ms") or 0)
    ranks = {k.lower(): int(v) for k, v in _TAG.findall(m.group("tags"))}
    return ts, ranks, line[m.end():]


def parse_log_line(line: str) -> dict[str, Any] | None:
    """One batch line as ``{ts, kind (decode|prefill), iter, dp, pp, tp, ep, <fields by name>}``;
    None for any other line."""
    ts, ranks, message = _prefix(line.rstrip("\n"))
    m = _HEADER.search(message)
    if not m:
        return None
    row: dict[str, Any] = {"ts": ts, "kind": m.group("kind").lower(),
                           "iter": int(m.group("iter")) if m.group("iter") else None}
    row.update({k: 0 for k in _RANKS})
    row.update(ranks)
    fields = 0
    for part in _FIELD_SPLIT.split(m.group("body").strip().rstrip(",")):
        key, sep, value = part.partition(": ")
        if sep and key.strip():
            row[_field_name(key)] = _value(value)
            fields += 1
    # hybrid models report each pool apart (0.5.9 and 0.5.23: "#full token"/"full token usage" with
    # "#swa token"/"swa token usage" for sliding-window layers, or "mamba num"/"mamba usage" for state
    # space ones); the KV pool's fill is the fuller of the token pools, as SGLang's own gauge takes it
    if "token_usage" not in row and "full_token_usage" in row:
        row["token_usage"] = max(row["full_token_usage"], row.get("swa_token_usage", 0.0))
    if "token" not in row and "full_token" in row:
        row["token"] = max(row["full_token"], row.get("swa_token", 0))
    return row if fields else None  # "Decode batch, " alone is not a stats line


def parse_log_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Every batch line, in log order; unrelated lines are skipped."""
    return [row for row in map(parse_log_line, lines) if row is not None]


def server_log_frame(path: Path | str) -> pd.DataFrame:
    """A whole server.log as one row per batch line (columns BASE_COLUMNS, then fields by name)."""
    with Path(path).open(errors="replace") as f:
        rows = parse_log_lines(f)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=BASE_COLUMNS)
    rest = [c for c in frame.columns if c not in BASE_COLUMNS]
    return frame[[c for c in BASE_COLUMNS if c in frame.columns] + rest]


def stage_label(row: Mapping[str, Any]) -> str:
    label = f"PP{int(row.get('pp', 0))}"
    return f"DP{int(row['dp'])} {label}" if row.get("dp") else label


def stage_series(frame: pd.DataFrame, field: str, kind: str = "decode") -> dict[str, pd.Series]:
    """``field`` over time for each (DP replica, PP stage) that logged it, keyed ``PP1``/``DP1 PP0``.

    Per stage, never summed: under PP, #running-req is one micro-batch and gen throughput is the same
    server-wide number on every stage (docs/sglang-adapter.md)."""
    if frame.empty or field not in frame.columns:
        return {}
    rows = frame[(frame["kind"] == kind) & frame[field].notna()]
    out: dict[str, pd.Series] = {}
    for (dp, pp), group in rows.groupby(["dp", "pp"], sort=True):
        label = stage_label({"dp": dp, "pp": pp})
        out[label] = pd.Series(group[field].to_numpy(), index=group["ts"].to_numpy(), name=field)
    return out


# ---------------------------------------------------------------------------------------------------
# Startup log -> resolved configuration

_LIMITS = re.compile(r"^max_total_num_tokens=")
_PAIR = re.compile(r"(\w+)=([^,]+)")
_GRAPH_BS = (
    # the target model's sizes per phase (a draft model's line says "draft"): 0.5.22 and later list them
    # on the "end" line ("Capture target decode CUDA graph end. bs=[...], elapsed=..."), 0.5.14 to 0.5.21
    # on the "begin" line ("... begin. backend=full, num_tokens_per_req=1, bs=[...], avail mem=...";
    # num_tokens_per_bs in 0.5.14 and 0.5.15), whose "end" line has none
    re.compile(r"Capture target (?P<phase>\w+) \S+ graph "
               r"(?:end\. |begin\. backend=[^,]*, num_tokens_per_\w+=\d+, )bs=\[(?P<bs>[\d,\s]*)\]"),
    re.compile(r"Capture cuda graph bs \[(?P<bs>[\d,\s]*)\]"),  # 0.5.13 and earlier: decode only
)
_FACTS: list[tuple[re.Pattern[str], Any]] = [
    (re.compile(r"Attention backend not specified\. Use (\S+) backend by default"),
     lambda m: {"attention_backend": m.group(1)}),
    (re.compile(r"Pipeline parallelism is incompatible with overlap schedule"),
     lambda m: {"disable_overlap_schedule": True}),
    # the pool: "KV Cache is allocated." (0.5.9: no dtype), or, where 0.5.23 sizes it after CUDA-graph
    # capture, "Post-capture KV sizing: KV cache allocated." (its earlier "KV Cache VA upper bound." line
    # is only reserved address space)
    (re.compile(r"(?:KV Cache is allocated|Post-capture KV sizing: KV cache allocated)\.(?: dtype: ([^,]+),)?"
                r" #tokens: (\d+)"),
     lambda m: {"kv_cache_tokens": int(m.group(2)),
                **({"kv_cache_dtype": m.group(1).strip()} if m.group(1) else {})}),
    (re.compile(r"max_running_requests was reduced from the requested (\d+) to (\d+)"),
     lambda m: {"max_running_requests_requested": int(m.group(1))}),
    # 0.5.23: "... adjusted from 1 to the tensor parallel size [8]"; 0.5.9 (and some 0.5.23 backends):
    # "... adjusted to be the same as the tensor parallel size[8]" (the size asked for is not said)
    (re.compile(r"expert parallel size is adjusted (?:from (\d+) )?to (?:be the same as )?"
                r"the tensor parallel size ?\[?(\d+)"),
     lambda m: {**({"ep_size_requested": int(m.group(1))} if m.group(1) else {}),
                "ep_size": int(m.group(2))}),
    (re.compile(r"Disabling breakable prefill CUDA graph by default for pipeline parallelism"),
     lambda m: {"cuda_graph_backend_prefill": "disabled"}),
    (re.compile(r"The server is fired up and ready to roll"), lambda m: {"ready_logged": True}),
]


def _number(text: str) -> Any:
    text = text.strip()
    if text == "None":
        return None
    if text.endswith(" GB"):
        return float(text[:-3])
    return _value(text)


def resolved_from_startup_log(text: str) -> dict[str, Any]:
    """What the engine decided at start-up, from its log: effective limits (min over PP stages, with
    ``<key>_by_stage`` where stages differ), CUDA-graph capture sizes, attention backend, forced
    settings. Keys are SGLang's own names where it has one."""
    limits: dict[str, dict[str, Any]] = {}  # key -> stage label -> value
    out: dict[str, Any] = {}
    weight_gb: list[float] = []
    for line in text.splitlines():
        _, ranks, message = _prefix(line)
        message = message.strip()
        if _LIMITS.match(message):
            stage = stage_label(ranks)
            for key, value in _PAIR.findall(message):
                if key.startswith("available_") and key.endswith("_mem"):
                    key = key + "_gb"
                limits.setdefault(key, {})[stage] = _number(value)
            continue
        for pattern in _GRAPH_BS:
            m = pattern.search(message)
            if m:
                phase = m.groupdict().get("phase") or "decode"
                sizes = [int(x) for x in m.group("bs").replace(" ", "").split(",") if x]
                out[f"cuda_graph_bs_{phase}"] = sizes
                if sizes:
                    out[f"cuda_graph_max_bs_{phase}_captured"] = max(sizes)
        m = re.search(r"Load weight end\..*?mem usage=([\d.]+) GB", message)
        if m:
            weight_gb.append(float(m.group(1)))
        for pattern, facts in _FACTS:
            m = pattern.search(message)
            if m:
                out.update(facts(m))
    for key, by_stage in limits.items():
        values = list(by_stage.values())
        numeric = all(isinstance(v, int | float) for v in values)
        out[key] = min(values) if numeric else values[0]
        if len(set(values)) > 1:  # e.g. a stage with less free memory after the LM head
            out[f"{key}_by_stage"] = dict(by_stage)
    if weight_gb:
        out["weight_mem_gb_max"] = max(weight_gb)
    return out


# /server_info keys worth a resolved.* param of their own (trial.py's list, plus a few)
RESOLVED_KEYS = ("max_running_requests", "pp_max_micro_batch_size", "chunked_prefill_size",
                 "max_prefill_tokens", "max_total_num_tokens", "context_length", "cuda_graph_max_bs_decode",
                 "disable_cuda_graph", "mem_fraction_static", "attention_backend", "pp_async_batch_depth",
                 "decode_log_interval", "disable_overlap_schedule", "random_seed", "tp_size", "pp_size",
                 "ep_size", "dp_size", "attn_dp_size", "moe_a2a_backend", "enable_eplb",
                 "load_balance_method", "load_format", "version", "enable_mixed_chunk",
                 "kv_cache_dtype", "max_total_tokens", "disable_radix_cache", "schedule_policy", "page_size",
                 # speculative decoding as resolved (SGLang's automatic steps included), and where the
                 # simulated engine's acceptance came from
                 "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                 "speculative_num_draft_tokens", "sim_spec_acceptance", "sim_spec_expected_accept_length")


def merge_resolved(server_info: Mapping[str, Any], startup: Mapping[str, Any],
                   keys: Iterable[str] = RESOLVED_KEYS) -> dict[str, Any]:
    """One ``resolved`` dict: the startup log's values, overridden by ``/server_info`` where it has a
    non-null value, then the values the engine resolved after its arguments were published, which
    ``/server_info`` reports elsewhere than at the top level (docs/sglang-adapter.md, "/server_info"):

    - ``internal_states[0]``: the PP-rank-0 scheduler's own copy of the arguments, with what it set at
      start-up (``pp_max_micro_batch_size``; the top-level copy stays null unless the user set it) and
      the request cap it enforces per DP worker (``effective_max_running_requests_per_dp``);
    - the decode CUDA-graph batch size: ``cuda_graph_config.decode.max_bs`` in 0.5.23 (the top-level
      ``cuda_graph_max_bs_decode`` is the raw input, null unless set), ``cuda_graph_max_bs`` in 0.5.9.
    """
    resolved: dict[str, Any] = dict(startup)
    for key in keys:
        if server_info.get(key) is not None:
            resolved[key] = server_info[key]
    states = server_info.get("internal_states") or [{}]
    state = states[0] if states and isinstance(states[0], Mapping) else {}
    if state.get("pp_max_micro_batch_size") is not None:
        resolved["pp_max_micro_batch_size"] = state["pp_max_micro_batch_size"]
    effective = state.get("effective_max_running_requests_per_dp")
    if effective is not None:  # the value the scheduler actually enforces (per DP worker)
        resolved["max_running_requests"] = effective
    if server_info.get("cuda_graph_max_bs_decode") is None:  # the input: null unless the user set it
        graph = server_info.get("cuda_graph_config")
        nested = graph.get("decode", {}).get("max_bs") if isinstance(graph, Mapping) else None
        size = nested if nested is not None else server_info.get("cuda_graph_max_bs")
        if size is not None:
            resolved["cuda_graph_max_bs_decode"] = size
    return resolved


def resolved_config(server_info: Mapping[str, Any], log_text: str) -> dict[str, Any]:
    """``merge_resolved(server_info, resolved_from_startup_log(log_text))``."""
    return merge_resolved(server_info, resolved_from_startup_log(log_text))


def resolved_params(resolved: Mapping[str, Any]) -> dict[str, str]:
    """``resolved.<key>`` MLflow params: lists as ``1,2,4``, per-stage dicts as ``PP0=..;PP1=..``."""
    out: dict[str, str] = {}
    for key, value in resolved.items():
        if isinstance(value, list):
            text = ",".join(map(str, value))
        elif isinstance(value, Mapping):
            text = ";".join(f"{k}={v}" for k, v in value.items())
        else:
            text = str(value)
        out[f"resolved.{key}"] = text[:6000]  # MLflow's param value limit
    return out
