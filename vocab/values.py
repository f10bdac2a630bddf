"""Numbers out of loosely typed values: what a server reports in ``/server_info`` or a startup log line,
and MLflow params, arrive as strings, numbers, ``None`` or ``"null"``. One reading for every layer."""

from __future__ import annotations

import math
from typing import Any


def int_or_none(value: Any) -> int | None:
    """``value`` as an int, or None when it is not one (missing, null, text)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def float_or_none(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, null, text, NaN, infinite)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None
