"""argparse ``type=`` helpers shared by ``python -m workloads`` and ``python -m workloads calibrate``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
N = TypeVar("N", int, float)


def checked(
    convert: Callable[[str], T], ok: Callable[[T], bool], expected: str, *, malformed: str | None = None
) -> Callable[[str], T]:
    """An argparse type: ``convert(text)``, rejected with "expected EXPECTED, got TEXT" unless ``ok``.

    ``malformed`` replaces ``expected`` in the message when ``convert`` itself fails.
    """

    def parse(text: str) -> T:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {malformed or expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def _comma_list(convert: Callable[[str], N]) -> Callable[[str], list[N]]:
    return lambda text: [convert(x) for x in text.split(",") if x.strip()]


def _positive(v: float) -> bool:
    return v > 0 and math.isfinite(v)


positive_int = checked(int, lambda v: v >= 1, "a positive integer")
non_negative_int = checked(int, lambda v: v >= 0, "an integer >= 0")
positive_float = checked(float, _positive, "a positive number")
non_negative_float = checked(float, lambda v: v >= 0 and math.isfinite(v), "a number >= 0")
# A list of integers must not be empty; an empty list of numbers is allowed (calibrate: skip the rates).
positive_int_list = checked(
    _comma_list(int),
    lambda vs: bool(vs) and all(v >= 1 for v in vs),
    "positive integers",
    malformed="comma-separated integers",
)
positive_float_list = checked(
    _comma_list(float),
    lambda vs: all(_positive(v) for v in vs),
    "positive numbers",
    malformed="comma-separated numbers",
)


def arrival_type(text: str) -> str:
    """``--arrival``: poisson, gamma:CV, constant or trace (checked by ``vocab.load.parse_arrival``)."""
    from vocab.load import parse_arrival

    try:
        parse_arrival(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
