"""Comparing token-id sequences: shared by the simulated engine's prefix cache and the load generator's
count of the reuse a point's prompts offered, which must agree on what "shared" means."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def shared_prefix_len(a: np.ndarray, b: np.ndarray | Sequence[int]) -> int:
    """How many leading token ids ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = a[:n] != np.asarray(b[:n])
    first = int(differ.argmax())
    return first if differ[first] else n
