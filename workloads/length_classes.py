"""Results per prompt-length class: where lengths vary (real traffic), one number per point hides that a
long prompt waits for its prefill and a short one does not.

Requests are put in classes by their prompt tokens, with edges at powers of four from 256 on (``0-256``,
``256-1k``, ``1k-4k``, ``4k-16k``, ``16k-64k``, ``64k-up``). For each class that holds a request sent in the
point's window, the point gets ``requests_in_<class>``, ``ttft_p50_ms_in_<class>`` and
``ttft_p99_ms_in_<class>`` (MLflow: ``c8/ttft_p99_ms_in_1k-4k``). Only where the window's prompts fall in two
classes or more: fixed-length points get nothing new.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

from vocab.records import RequestRecord

EDGES: tuple[int, ...] = (256, 1024, 4096, 16384, 65536)
PREFIX = "_in_"


def _short(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 else str(n)


CLASSES: tuple[str, ...] = tuple(
    [f"0-{_short(EDGES[0])}"] + [f"{_short(a)}-{_short(b)}" for a, b in itertools.pairwise(EDGES)]
    + [f"{_short(EDGES[-1])}-up"])


def length_class(prompt_tokens: int) -> str:
    """The class of a prompt of this many tokens (an edge belongs to the class above it)."""
    return CLASSES[int(np.searchsorted(EDGES, prompt_tokens, side="right"))]


def class_metrics(records: Iterable[RequestRecord]) -> dict[str, float]:
    """Per-class TTFT of successful records that produced a token (see the module doc); {} when they
    fall in one class."""
    ttfts: dict[str, list[float]] = {}
    for r in records:
        if r.error is None and r.first_token_time is not None and r.send_time is not None:
            ttfts.setdefault(length_class(r.input_tokens), []).append(
                (r.first_token_time - r.send_time) * 1000.0)
    if len(ttfts) < 2:
        return {}
    out: dict[str, float] = {}
    for cls, values in ttfts.items():
        p50, p99 = np.percentile(values, [50, 99])
        out |= {f"requests{PREFIX}{cls}": float(len(values)), f"ttft_p50_ms{PREFIX}{cls}": float(p50),
                f"ttft_p99_ms{PREFIX}{cls}": float(p99)}
    return out
