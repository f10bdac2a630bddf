"""vLLM's server log, parsed for the releases parasweep records (formats: docs/vllm-adapter.md).

Every line is ``[(<process> pid=N) ]LEVEL MM-DD HH:MM:SS [file.py:line] message``: the level and the
stamp from vLLM's logger format, the process prefix from the wrapper vLLM puts around each process's
output (0.34 has it in the format itself). The stamp has no year and whole seconds; the year is taken
as the one that puts the line closest to when the log was read.

- The stats line (``Engine 000: Avg prompt throughput: ... tokens/s, Avg generation throughput: ...,
  Running: N reqs, Waiting: N reqs[, Preemptions: N], GPU KV cache usage: X%[, Prefix cache hit rate:
  Y%]``; ``%s KV cache usage`` with the device's name in 0.34), every ``VLLM_LOG_STATS_INTERVAL``
  seconds (10): one row each, with the same column names as SGLang's batch lines where they mean the
  same (``running_req``, ``queue_req``, ``token_usage`` as a fraction, ``gen_throughput``).
- The speculative-decoding line that follows a stats line where anything was drafted (``SpecDecoding
  metrics: Mean acceptance length: 2.51, ..., Avg Draft acceptance rate: 50.3%``): a row of kind ``spec``
  for the same engine, with ``accept_len`` (SGLang's name: tokens per request per verify, the target's
  own included) and ``spec_accept_rate`` (accepted drafts over drafted ones, a fraction).
- Start-up lines: the KV cache's size in tokens, the concurrency it allows at the longest request,
  whether async scheduling is on, the step's token budget, the release, the speculative method and its
  draft depth: the ``resolved.*`` values.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.telemetry.server_log import BASE_COLUMNS

_LINE = re.compile(
    r"^(?:\((?P<proc>[^)]*?) pid=\d+\)\s+)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?P<stamp>\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.\d+)?\s+\[(?P<where>[^\]]*)\]\s?(?P<msg>.*)$"
)
_STATS = re.compile(r"Engine (?P<engine>\d+): (?P<body>Avg prompt throughput: .*)$")
_FIELD = re.compile(r"^(?P<key>[A-Za-z][A-Za-z ]*?): (?P<value>-?[\d.]+)\s*(?P<unit>%|tokens/s|reqs)?$")
# stats field -> column (SGLang's batch lines' names where the meaning is the same)
_COLUMNS = {
    "avg prompt throughput": "prompt_throughput",
    "avg generation throughput": "gen_throughput",
    "running": "running_req",
    "waiting": "queue_req",
    "preemptions": "preemptions",
    "kv cache usage": "token_usage",
    "prefix cache hit rate": "prefix_cache_hit_rate",
    "external prefix cache hit rate": "external_prefix_cache_hit_rate",
    "mm cache hit rate": "mm_cache_hit_rate",
    "corrupted": "corrupted_req",
}
_SPEC = re.compile(r"SpecDecoding metrics: Mean acceptance length: (?P<len>[\d.]+),.*"
                   r"Avg Draft acceptance rate: (?P<rate>[\d.]+|nan)%")
_FRACTIONS = ("token_usage", "prefix_cache_hit_rate", "external_prefix_cache_hit_rate", "mm_cache_hit_rate")


def _epoch(stamp: str, now: float) -> float:
    """``MM-DD HH:MM:SS`` (local time) as epoch seconds, in the year nearest ``now``."""
    year = time.localtime(now).tm_year
    candidates = []
    for y in (year - 1, year, year + 1):
        try:
            candidates.append(time.mktime(time.strptime(f"{y}-{stamp}", "%Y-%m-%d %H:%M:%S")))
        except ValueError:  # 02-29 in a year without it
            continue
    return min(candidates, key=lambda t: abs(t - now))


def parse_line(line: str) -> tuple[str, str, str] | None:
    """(stamp, level, message) of one vLLM log line; None for anything else (a traceback's lines)."""
    m = _LINE.match(line.rstrip("\n"))
    return (m.group("stamp"), m.group("level"), m.group("msg")) if m else None


def _matching(line: str, pattern: re.Pattern[str]) -> tuple[str, re.Match[str]] | None:
    """(stamp, match) where ``line`` is a vLLM log line whose message ``pattern`` finds; else None."""
    parsed = parse_line(line)
    if parsed is None:
        return None
    m = pattern.search(parsed[2])
    return (parsed[0], m) if m else None


def _row(stamp: str, now: float, kind: str, engine: int) -> dict[str, Any]:
    """A row's first columns: the line's time, its kind and the engine core's index (the DP rank)."""
    return {"ts": _epoch(stamp, now), "kind": kind, "iter": None, "dp": engine, "pp": 0, "tp": 0, "ep": 0}


def stats_row(line: str, now: float) -> dict[str, Any] | None:
    """One stats line as ``{ts, kind: stats, iter: None, dp (the engine's index), pp, tp, ep, <fields>}``;
    None for any other line."""
    found = _matching(line, _STATS)
    if found is None:
        return None
    stamp, m = found
    row = _row(stamp, now, "stats", int(m.group("engine")))
    for part in m.group("body").split(", "):
        f = _FIELD.match(part.strip())
        if not f:
            continue
        key = f.group("key").lower()
        key = "kv cache usage" if key.endswith("kv cache usage") else key  # "GPU KV ..." / "%s KV ..."
        column = _COLUMNS.get(key)
        if column is None:
            continue
        value = float(f.group("value"))
        row[column] = value / 100 if column in _FRACTIONS else value
    for column in ("running_req", "queue_req", "preemptions"):
        if column in row:
            row[column] = int(row[column])
    row.setdefault("preemptions", 0)  # the field is printed only where there were any
    return row


def spec_row(line: str, now: float, engine: int) -> dict[str, Any] | None:
    """One speculative-decoding line as ``{ts, kind: spec, dp: engine, ..., accept_len,
    spec_accept_rate}`` (``engine``: that of the stats line before it); None for any other line."""
    found = _matching(line, _SPEC)
    if found is None:
        return None
    stamp, m = found
    rate = float(m.group("rate")) / 100 if m.group("rate") != "nan" else float("nan")
    return {**_row(stamp, now, "spec", engine), "accept_len": float(m.group("len")), "spec_accept_rate": rate}


def vllm_log_frame(path: Path | str) -> pd.DataFrame:
    """A whole vLLM server log as one row per stats line and per speculative-decoding line (columns
    BASE_COLUMNS, then the fields)."""
    path = Path(path)
    now = path.stat().st_mtime
    rows: list[dict[str, Any]] = []
    engine = 0
    with path.open(errors="replace") as f:
        for line in f:
            row = stats_row(line, now) or spec_row(line, now, engine)
            if row is not None:
                engine = row["dp"]
                rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=BASE_COLUMNS)
    rest = [c for c in frame.columns if c not in BASE_COLUMNS]
    return frame[BASE_COLUMNS + rest]


_STARTUP = (
    (re.compile(r"KV cache size: (?P<v>[\d,]+) tokens"), "max_total_num_tokens", int),
    (
        re.compile(r"Maximum concurrency for [\d,]+ tokens per request: (?P<v>[\d.]+)x"),
        "kv_cache_max_concurrency",
        float,
    ),
    (
        re.compile(r"Asynchronous scheduling is (?P<v>enabled|disabled)"),
        "async_scheduling",
        lambda v: v == "enabled",
    ),
    (
        re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(?P<v>\d+)"),
        "chunked_prefill_size",
        int,
    ),
    (re.compile(r"vLLM API server version (?P<v>\S+)"), "vllm_version", str),
)
# the engine's configuration line: speculative_config=SpeculativeConfig(method='eagle3', model='...',
# num_spec_tokens=3) (its __repr__, every recorded release)
_SPEC_CONFIG = re.compile(r"speculative_config=SpeculativeConfig\(method='(?P<method>[^']+)', .*?"
                          r"num_spec_tokens=(?P<k>\d+)\)")


def resolved_from_vllm_log(lines: Iterable[str]) -> dict[str, Any]:
    """What vLLM resolved at start-up, as parasweep's ``resolved.*`` keys (the KV cache's tokens as
    ``max_total_num_tokens``, the step's token budget as ``chunked_prefill_size``, as for SGLang)."""
    out: dict[str, Any] = {}
    for line in lines:
        parsed = parse_line(line)
        if parsed is None:
            continue
        for pattern, key, convert in _STARTUP:
            m = pattern.search(parsed[2])
            if m and key not in out:
                out[key] = convert(m.group("v").replace(",", ""))
        m = _SPEC_CONFIG.search(parsed[2])
        if m and "speculative_num_steps" not in out:  # a chain: k drafts verified with the own token
            k = int(m.group("k"))
            out.update(speculative_algorithm=m.group("method"), speculative_num_steps=k,
                       speculative_eagle_topk=1, speculative_num_draft_tokens=k + 1)
    return out
