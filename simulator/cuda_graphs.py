"""SGLang's decode CUDA graphs: the batch sizes it captures, and the size a batch is replayed at.

A decode batch of n requests replays the smallest captured graph of at least n requests; the n' - n
padded slots run through every kernel (SGLang fills them with a sequence length of one), so the GPU does
the work of n' tokens: more rows in each GEMM and all-reduce and, in a MoE layer, the experts the padded
tokens are routed to (their attention, over a context of one, is nothing beside the real requests').
The list is SGLang 0.5's default capture list, clipped to the largest captured size, which is always
captured itself.
"""

from __future__ import annotations

import bisect
import functools


@functools.cache
def capture_sizes(max_bs: int) -> tuple[int, ...]:
    """The decode batch sizes SGLang captures a graph for, up to ``max_bs`` (``max_bs`` included)."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    kept = [s for s in sizes if s <= max_bs]
    if not kept or kept[-1] != max_bs:
        kept.append(max_bs)
    return tuple(kept)


@functools.cache
def replayed_batch(n: int, max_bs: int) -> int:
    """The graph size a decode batch of ``n`` requests replays (``n`` itself beyond the largest: eager)."""
    sizes = capture_sizes(max_bs)
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else n
