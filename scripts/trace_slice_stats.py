#!/usr/bin/env python3
"""Summary statistics of the trace slices in this folder (stdlib only).

Run from anywhere:  python3 scripts/trace_slice_stats.py
Percentiles use linear interpolation between order statistics (numpy's default).
"""
import csv
import json
import statistics
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "data" / "traces"
BLOCK_TOKENS = 512  # Mooncake convention: one hash id per 512-token prefix block


def pct(values, q):
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def describe(name, values):
    print(f"  {name}: median={statistics.median(values):g} p90={pct(values, 90):g} "
          f"mean={statistics.fmean(values):.1f} min={min(values)} max={max(values)}")


def mooncake(path):
    rows = [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    ts = [r["timestamp"] for r in rows]
    span_s = (max(ts) - min(ts)) / 1000.0
    print(f"{path.relative_to(HERE)}")
    print(f"  rows={len(rows)}")
    print(f"  timestamps: first={ts[0]} ms last={ts[-1]} ms monotone={ts == sorted(ts)} "
          f"span={span_s:.3f} s")
    print(f"  mean arrival rate={len(rows) / span_s:.3f} req/s (rows/span)")
    describe("input_length", [r["input_length"] for r in rows])
    describe("output_length", [r["output_length"] for r in rows])
    seen, total, reused = set(), 0, 0
    for r in rows:
        ids = r["hash_ids"]
        total += len(ids)
        reused += sum(1 for h in ids if h in seen)
        seen.update(ids)
    print(f"  block size={BLOCK_TOKENS} tokens per hash id; hash-id blocks={total}, "
          f"distinct={len(seen)}, seen in an earlier row={reused} "
          f"-> reuse fraction={reused / total:.4f}")
    mismatch = sum(1 for r in rows
                   if len(r["hash_ids"]) != -(-r["input_length"] // BLOCK_TOKENS))
    print(f"  rows where len(hash_ids) != ceil(input_length/{BLOCK_TOKENS}): {mismatch}")


def parse_azure_ts(s):
    # e.g. "2023-11-16 18:15:46.6805900" (7 fractional digits; datetime takes 6)
    base, _, frac = s.partition(".")
    dt = datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
    return dt, float("0." + frac) if frac else 0.0


def azure(path):
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    parsed = [parse_azure_ts(r["TIMESTAMP"]) for r in rows]
    d0, f0 = parsed[0]
    t = [(d - d0).total_seconds() + (f - f0) for d, f in parsed]
    span_s = max(t) - min(t)
    print(f"{path.relative_to(HERE)}")
    print(f"  rows={len(rows)} (data rows, header excluded)")
    print(f"  timestamps: first={rows[0]['TIMESTAMP']} last={rows[-1]['TIMESTAMP']} "
          f"monotone={t == sorted(t)} span={span_s:.3f} s")
    print(f"  mean arrival rate={len(rows) / span_s:.3f} req/s (rows/span)")
    describe("ContextTokens", [int(r["ContextTokens"]) for r in rows])
    describe("GeneratedTokens", [int(r["GeneratedTokens"]) for r in rows])


if __name__ == "__main__":
    mooncake(HERE / "mooncake" / "conversation_trace_head.jsonl")
    azure(HERE / "azure" / "AzureLLMInferenceTrace_conv_head.csv")
