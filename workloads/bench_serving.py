"""SGLang's ``bench_serving`` accounting, written once: which requests it sends, when, and what it prints.

Published SGLang measurements are ``python -m sglang.bench_serving`` runs. Replaying one faithfully means
following that tool's own definitions, not parasweep's steady window:

* **Random lengths** (``--dataset-name random`` / ``random-ids``): the tool seeds NumPy's global generator
  with ``--seed`` (default 1) and draws every input length from ``randint(max(int(L * r), 1), L + 1)``
  and then every output length from ``randint(int(O * r), O + 1)``, ``r`` being
  ``--random-range-ratio``. With the old default ``r = 0.0`` lengths are uniform in [1, L] and [0, O]:
  the mean is about half the nominal length. The draws reproduce the token totals the tool prints
  exactly (tests/test_bench_serving.py holds every published random run that printed them).
* **ShareGPT** (``--dataset-name sharegpt``): conversations with at least two turns, shuffled by
  Python's ``random`` seeded with ``--seed``; each gives its first message as the prompt and the reply's
  token count as the output length; pairs whose prompt or reply is shorter than 4 tokens, whose prompt
  is longer than 1,024 or whose prompt and reply exceed 2,048 tokens together are skipped, until
  ``--num-prompts`` are taken.
* **Arrivals**: request 0 at t = 0, then gaps drawn from an exponential of mean 1 / rate from the same
  NumPy generator, after the lengths (``--request-rate inf``: every request at t = 0).
  ``--max-concurrency`` holds a request back, in arrival order, until one in flight ends; its latencies
  are counted from when it is actually sent.
* **What it prints**: duration = from the first send to the last response; throughputs = totals over the
  duration; TTFT, ITL (per token: a chunk of k tokens after a gap g counts k gaps of g / k), TPOT
  (per request with more than one output token: (E2E - TTFT) / (output - 1)) and E2E as mean, median and
  p99 (NumPy's linear percentile); concurrency = the sum of E2E over the duration.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vocab.records import RequestRecord

from .metrics import latency_samples

DEFAULT_SEED = 1  # bench_serving's --seed default
# ShareGPT pairs bench_serving keeps: both sides at least this long, the prompt at most, the pair at most
SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_PROMPT = 1024
SHAREGPT_MAX_TOTAL = 2048


@dataclass(frozen=True)
class BenchRequest:
    """One request as bench_serving sends it: prompt and output lengths in tokens, send offset in s."""

    input_len: int
    output_len: int
    offset_s: float


def random_lengths(num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                   rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    """Input and output lengths of ``--dataset-name random`` (see module doc), drawn from ``rng``."""
    ins = rng.randint(max(int(input_len * range_ratio), 1), input_len + 1, size=num_prompts)
    outs = rng.randint(int(output_len * range_ratio), output_len + 1, size=num_prompts)
    return ins, outs


def sharegpt_lengths(num_prompts: int, pairs: Sequence[tuple[int, int]], seed: int,
                     fixed_output_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Input and output lengths of ``--dataset-name sharegpt`` from ``pairs`` of (prompt, reply) token
    counts in the file's order: shuffled with Python's ``random`` seeded as the tool seeds it, then
    filtered as it filters (module doc). Raises ``ValueError`` when the pairs cannot fill the count."""
    order = list(pairs)
    random.Random(seed).shuffle(order)
    ins: list[int] = []
    outs: list[int] = []
    for prompt, reply in order:
        out = fixed_output_len if fixed_output_len is not None else reply
        if prompt < SHAREGPT_MIN_LEN or out < SHAREGPT_MIN_LEN:
            continue
        if prompt > SHAREGPT_MAX_PROMPT or (fixed_output_len is None and prompt + out > SHAREGPT_MAX_TOTAL):
            continue
        ins.append(prompt)
        outs.append(out)
        if len(ins) == num_prompts:
            return np.asarray(ins), np.asarray(outs)
    raise ValueError(f"the ShareGPT conversations give only {len(ins)} of the {num_prompts} prompts "
                     "asked for")


def arrival_offsets(num_prompts: int, rate: float, rng: np.random.RandomState) -> np.ndarray:
    """Send offsets in seconds: all 0 at an infinite rate, else exponential gaps of mean 1 / rate."""
    if math.isinf(rate):
        return np.zeros(num_prompts)
    gaps = rng.exponential(1.0 / rate, size=num_prompts)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def bench_metrics(records: Sequence[RequestRecord]) -> dict[str, float]:
    """What bench_serving prints for a run whose requests are ``records`` (times from the run's
    start), under the names its ``--output-file`` uses (``output_throughput``, ``median_ttft_ms``, ...)."""
    done = [r for r in records if r.ok and r.end_time is not None and r.send_time is not None]
    out: dict[str, float] = {"completed": float(len(done))}
    if not done:
        return out
    start = min(r.send_time for r in records if r.send_time is not None)  # type: ignore[type-var]
    duration = max(r.end_time for r in done) - start  # type: ignore[operator]
    total_in = float(sum(r.input_tokens for r in done))
    total_out = float(sum(r.output_tokens for r in done))
    samples = latency_samples(done)
    out |= {
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration,
        "input_throughput": total_in / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "concurrency": sum(samples["e2e"]) / 1000.0 / duration,
    }
    for name in ("ttft", "tpot", "itl", "e2e"):
        values = np.asarray(samples[name], dtype=float)
        if values.size == 0:
            continue
        out[f"mean_{name}_ms"] = float(values.mean())
        out[f"median_{name}_ms"] = float(np.median(values))
        out[f"p99_{name}_ms"] = float(np.percentile(values, 99))
    return out
