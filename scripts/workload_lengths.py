"""The length distributions parasweep's real-traffic workloads produce, as sent (docs/workloads.md).

For each source: requests kept, and the median and p90 of prompt and output tokens, read through the
same code a sweep uses (``workloads/sources/``) for a model with a 131,072-token context. ShareGPT is
also counted by every bundled vocabulary, which is what a stand-in tokenizer does to its lengths.

    .venv/bin/python scripts/workload_lengths.py
"""

from __future__ import annotations

import numpy as np

from vocab.load import RequestSpec, Source
from workloads.sources import source_requests

CONTEXT = 131_072
VOCAB = 200_000  # wide enough for every bundled vocabulary's ids (lengths do not depend on it)


def lengths(source: Source, limit: int | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    reqs = source_requests(RequestSpec(source=source, vocab_size=VOCAB))
    n = reqs.count if not source.multi_turn else sum(reqs.session_turns)
    n = min(n, limit) if limit else n
    ins = np.fromiter((len(reqs.request(i).ids) for i in range(n)), dtype=np.int64, count=n)
    outs = np.fromiter((reqs.request(i).output_len for i in range(n)), dtype=np.int64, count=n)
    return ins, outs, reqs.summary()


def row(name: str, ins: np.ndarray, outs: np.ndarray) -> str:
    p = np.percentile
    return (f"| {name} | {len(ins):,} | {p(ins, 50):,.0f} | {p(ins, 90):,.0f} | {ins.mean():,.0f} | "
            f"{p(outs, 50):,.0f} | {p(outs, 90):,.0f} | {outs.mean():,.0f} |")


def main() -> None:
    print("| workload | requests | prompt p50 | prompt p90 | prompt mean | output p50 | output p90 "
          "| output mean |")
    print("|---|---|---|---|---|---|---|---|")
    notes = []
    for name, source in (
        ("sharegpt (first turns, llama3)", Source("sharegpt", context=CONTEXT)),
        ("sharegpt-sessions (every turn, llama3)", Source("sharegpt", multi_turn=True, context=CONTEXT)),
        ("mooncake (shipped slice)", Source("mooncake", context=CONTEXT)),
        ("azure (shipped slice)", Source("azure", context=CONTEXT)),
    ):
        ins, outs, note = lengths(source)
        print(row(name, ins, outs))
        notes.append(note)
    print()
    print("ShareGPT first turns by tokenizer (a stand-in's effect on lengths):")
    base = None
    for enc in ("llama3", "qwen3", "cl100k_base", "o200k_base"):
        ins, outs, _ = lengths(Source("sharegpt", tokenizer=f"quicktok:{enc}", context=CONTEXT))
        total = int(ins.sum() + outs.sum())
        base = base or total
        print(f"  {enc:12s} prompt p50 {np.median(ins):5.0f}  output p50 {np.median(outs):5.0f}  "
              f"all tokens {total:,} ({total / base - 1:+.1%} against llama3)")
    print()
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
