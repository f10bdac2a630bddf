"""Timed traces: when each request arrived, how long it was, and (Mooncake) which prefix blocks it shared.

Two formats, each read into one :class:`Trace`:

* Mooncake (FAST'25 release): JSON lines ``{"timestamp": ms, "input_length", "output_length",
  "hash_ids": [...]}``. Each hash id names one block of ``block_size`` prompt tokens (512 by the peers'
  convention; the last block holds the remainder): two requests listing the same id share that block.
* Azure LLM inference trace (2023): CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps as
  date-times. No prefix information.

Timestamps become seconds from the trace's first request. parasweep ships a slice of each (``data/traces/``,
with source, commit and licence); a user's own file of either format is read the same way.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import orjson

from vocab.assets import traces_dir

FORMATS = ("mooncake", "azure")
SHIPPED = {
    "mooncake": "mooncake/conversation_trace_head.jsonl",
    "azure": "azure/AzureLLMInferenceTrace_conv_head.csv",
}
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class Trace:
    """A trace's requests in arrival order: seconds from its first arrival, lengths, prefix blocks."""

    path: str
    times_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    hash_ids: tuple[tuple[int, ...], ...] | None  # per request (Mooncake), None (Azure)

    def __len__(self) -> int:
        return len(self.times_s)


def shipped_path(kind: str) -> Path:
    return traces_dir() / SHIPPED[kind]


@functools.lru_cache(maxsize=8)
def read_trace(kind: str, path: str | None) -> Trace:
    """The trace at ``path`` (None: the slice parasweep ships) in format ``kind``. A bad file is one
    ValueError naming the file and, for a malformed line, its number."""
    if kind not in FORMATS:
        raise ValueError(f"unknown trace format {kind!r} (one of {', '.join(FORMATS)})")
    file = Path(path) if path else shipped_path(kind)
    try:
        raw = file.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read the {kind} trace {file}: {e.strerror or e}") from None
    rows = _mooncake(file, raw) if kind == "mooncake" else _azure(file, raw)
    if not rows[0]:
        raise ValueError(f"{file}: no requests in this {kind} trace")
    times, ins, outs, hashes = rows
    t = np.asarray(times, dtype=float)
    order = np.argsort(t, kind="stable")  # a trace is replayed in time order whatever its row order
    t = t[order] - t[order[0]]
    return Trace(path=str(file), times_s=t, input_len=np.asarray(ins, dtype=np.int64)[order],
                 output_len=np.asarray(outs, dtype=np.int64)[order],
                 hash_ids=None if hashes is None else tuple(hashes[i] for i in order))


Rows = tuple[list[float], list[int], list[int], list[tuple[int, ...]] | None]


def _mooncake(file: Path, raw: bytes) -> Rows:
    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    hashes: list[tuple[int, ...]] = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ValueError(f"{file}:{lineno}: not JSON (a Mooncake trace has one JSON object per "
                             "line)") from None
        try:
            ts, n_in, n_out = obj["timestamp"], obj["input_length"], obj["output_length"]
            ids = obj.get("hash_ids", [])
        except (KeyError, TypeError):
            raise ValueError(f"{file}:{lineno}: a Mooncake line needs timestamp, input_length and "
                             "output_length") from None
        if not (_number(ts) and _count(n_in) and _count(n_out)
                and isinstance(ids, list) and all(isinstance(h, int) for h in ids)):
            raise ValueError(f"{file}:{lineno}: timestamp must be a number of ms, input_length and "
                             "output_length integers >= 0, hash_ids a list of integers")
        times.append(float(ts) / 1000.0)
        ins.append(int(n_in))
        outs.append(int(n_out))
        hashes.append(tuple(ids))
    return times, ins, outs, hashes


def _azure(file: Path, raw: bytes) -> Rows:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{file}: not a CSV text file") from None
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != AZURE_COLUMNS:
        raise ValueError(f"{file}:1: an Azure trace starts with the header {','.join(AZURE_COLUMNS)}")
    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    for lineno, row in enumerate(reader, 2):
        if not row:
            continue
        try:
            when = datetime.fromisoformat(row[0].strip())
            n_in, n_out = int(row[1]), int(row[2])
        except (ValueError, IndexError):
            raise ValueError(f"{file}:{lineno}: expected TIMESTAMP (a date-time), ContextTokens and "
                             "GeneratedTokens (integers)") from None
        if n_in < 0 or n_out < 0 or len(row) != 3:
            raise ValueError(f"{file}:{lineno}: expected three columns, token counts >= 0")
        times.append(when.timestamp())
        ins.append(n_in)
        outs.append(n_out)
    return times, ins, outs, None


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and np.isfinite(x)


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
