"""The grammar of every MLflow metric key parasweep writes, in one place: code that writes a key and
code that reads it back both go through :class:`MetricKey`, so the two cannot drift apart.

Families (``<point>`` is ``c<C>`` for closed-loop concurrency C, ``r<R>`` for open-loop rate R req/s):

==========================  ============================================================  ========
key                         meaning                                                       step
==========================  ============================================================  ========
``c8/output_tok_s``         a trial's metric at one load point                            0
``output_tok_s``            the same metric as a series over closed-loop points           C
``open/output_tok_s``       the same metric as a series over open-loop points             R x 1000
``pred/c8/output_tok_s``    the simulator's prediction for that point (beside measured)    0
``best/c8/output_tok_s``    a sweep's best value over its trials                          0
``trial/total_s``           a trial's own timings (``total_s``, ``engine_start_s``, ...)   0
``trials_ok``               a sweep's count of trials per status                          0
==========================  ============================================================  ========

MLflow steps are integers, so the open-loop series use the rate in milli-requests per second as the
step (0.4 and 0.5 req/s stay apart).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# The per-point metrics every load point reports (the load generator's ``--json`` keys, and the
# ``<point>/<metric>`` names of every trial run): users and checks rely on these names.
CONTRACT_METRICS: tuple[str, ...] = (
    "output_tok_s", "request_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms",
    "e2e_p50_ms", "achieved_concurrency", "errors", "valid")

Prefix = Literal["", "pred", "best", "trial", "open"]
PREFIXES: tuple[str, ...] = ("pred", "best", "trial", "open")

_POINT_RE = re.compile(r"^(?:c([1-9][0-9]*)|r([0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?))$")


@dataclass(frozen=True, order=True)
class PointLabel:
    """A load point's name: ``c8`` (closed loop, concurrency 8) or ``r2.5`` (open loop, 2.5 req/s).

    Orders closed-loop points before open-loop ones, each by its load."""

    open_loop: bool
    load: float  # the concurrency or the rate

    @classmethod
    def closed(cls, concurrency: int) -> PointLabel:
        return cls(False, float(concurrency))

    @classmethod
    def open(cls, rate: float) -> PointLabel:
        return cls(True, float(rate))

    @classmethod
    def parse(cls, text: str) -> PointLabel | None:
        m = _POINT_RE.match(text)
        if m is None:
            return None
        return cls.closed(int(m.group(1))) if m.group(1) else cls.open(float(m.group(2)))

    @property
    def concurrency(self) -> int | None:
        return None if self.open_loop else int(self.load)

    @property
    def rate(self) -> float | None:
        return self.load if self.open_loop else None

    @property
    def step(self) -> int:
        """The MLflow step of this point in its series: the concurrency, or the rate in milli-req/s."""
        return round(self.load * 1000) if self.open_loop else int(self.load)

    def __str__(self) -> str:
        return f"r{self.load:g}" if self.open_loop else f"c{int(self.load)}"


@dataclass(frozen=True)
class MetricKey:
    """One metric key: a metric name, optionally at a load point, optionally under a prefix."""

    metric: str
    point: PointLabel | None = None
    prefix: Prefix = ""

    def __post_init__(self) -> None:
        if not self.metric or "/" in self.metric:
            raise ValueError(f"metric name must be non-empty and without '/': {self.metric!r}")
        if self.prefix == "open" and self.point is not None:
            raise ValueError("open-loop series keys carry no point (the step is the rate)")

    @classmethod
    def at(cls, point: PointLabel | str, metric: str, prefix: Prefix = "") -> MetricKey:
        label = point if isinstance(point, PointLabel) else PointLabel.parse(point)
        if label is None:
            raise ValueError(f"not a load-point label: {point!r} (expected c<C> or r<R>)")
        return cls(metric, label, prefix)

    @classmethod
    def series(cls, point: PointLabel, metric: str) -> tuple[MetricKey, int]:
        """The step-series key for ``metric`` at ``point`` and the step to log it at."""
        return cls(metric, None, "open" if point.open_loop else ""), point.step

    @classmethod
    def parse(cls, key: str) -> MetricKey | None:
        """The key's parts, or None for a key outside this grammar."""
        parts = key.split("/")
        prefix = ""
        if len(parts) > 1 and parts[0] in PREFIXES:
            prefix = parts.pop(0)
        point = None
        if len(parts) == 2:
            point = PointLabel.parse(parts[0])
            if point is None:
                return None
            parts.pop(0)
        if len(parts) != 1 or not parts[0] or (prefix in ("open", "trial") and point is not None):
            return None
        try:
            return cls(parts[0], point, prefix)  # type: ignore[arg-type]
        except ValueError:
            return None

    def __str__(self) -> str:
        parts = [p for p in (self.prefix, str(self.point) if self.point else "", self.metric) if p]
        return "/".join(parts)


def point_metrics(metrics: dict[str, float], prefix: Prefix = "") -> dict[PointLabel, dict[str, float]]:
    """``{"c8/output_tok_s": x, ...}`` -> ``{c8: {"output_tok_s": x}}`` for keys under ``prefix``."""
    out: dict[PointLabel, dict[str, float]] = {}
    for key, value in metrics.items():
        parsed = MetricKey.parse(key)
        if parsed is not None and parsed.point is not None and parsed.prefix == prefix:
            out.setdefault(parsed.point, {})[parsed.metric] = value
    return out
