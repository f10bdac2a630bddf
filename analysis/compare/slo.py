"""Pareto fronts and service-level objectives: the front of two metrics, an SLO read from the command line,
and the best configuration under them (never crowned where noise could explain it)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.compare.columns import DESCRIPTIVE, CompareError, lower_is_better
from analysis.noise import Estimate, Verdict, judge


def pareto_front(df: pd.DataFrame, x: str, y: str, *, x_higher_better: bool | None = None,
                 y_higher_better: bool | None = None) -> pd.Series:
    """A boolean mask over ``df``: the rows no other row dominates on (x, y). A row dominates another
    when it is at least as good on both and better on one. The direction of each axis defaults to
    :func:`lower_is_better` of its name (``*_ms`` lower, throughputs higher). Rows with a missing x or
    y are never on the front and dominate nothing; equal rows are all on it."""
    xh = not lower_is_better(x) if x_higher_better is None else x_higher_better
    yh = not lower_is_better(y) if y_higher_better is None else y_higher_better
    # turn both axes into "higher is better"
    xs = pd.to_numeric(df[x], errors="coerce").to_numpy(dtype=float) * (1 if xh else -1)
    ys = pd.to_numeric(df[y], errors="coerce").to_numpy(dtype=float) * (1 if yh else -1)
    ok = np.isfinite(xs) & np.isfinite(ys)
    xs_ok, ys_ok = xs[ok], ys[ok]
    # O(n²) by broadcasting: clear, and a comparison holds hundreds of rows, not millions
    ge = (xs_ok[None, :] >= xs_ok[:, None]) & (ys_ok[None, :] >= ys_ok[:, None])
    gt = (xs_ok[None, :] > xs_ok[:, None]) | (ys_ok[None, :] > ys_ok[:, None])
    dominated = (ge & gt).any(axis=1)
    mask = np.zeros(len(df), dtype=bool)
    mask[np.flatnonzero(ok)[~dominated]] = True
    return pd.Series(mask, index=df.index)


_SLO_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|=)\s*([-+0-9.eE]+|inf)\s*$")


@dataclass(frozen=True)
class Slo:
    """One objective: ``metric <= bound`` (``upper``) or ``metric >= bound``."""

    metric: str
    bound: float
    upper: bool

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft_p99_ms=2000`` (``=`` bounds in the metric's good direction: an upper bound on a
        latency, a lower bound on a throughput), ``itl_p99_ms<=100``, ``output_tok_s>=100``."""
        m = _SLO_RE.match(text)
        value = None
        if m is not None:
            try:
                value = float(m.group(3))
            except ValueError:
                value = None
        if m is None or value is None or math.isnan(value):
            raise CompareError(f"--slo {text!r}: expected METRIC=VALUE, METRIC<=VALUE or METRIC>=VALUE "
                               "with a number, e.g. --slo ttft_p99_ms=2000 or --slo 'output_tok_s>=100'")
        op = m.group(2)
        upper = lower_is_better(m.group(1)) if op == "=" else op == "<="
        return cls(m.group(1), value, upper)

    def met(self, df: pd.DataFrame) -> pd.Series:
        """Which rows meet it; a missing value meets nothing."""
        values = pd.to_numeric(df[self.metric], errors="coerce")
        return (values <= self.bound) if self.upper else (values >= self.bound)

    def shortfall(self, df: pd.DataFrame) -> pd.Series:
        """How far each row misses it, relative to the bound (0 when met, inf when missing)."""
        values = pd.to_numeric(df[self.metric], errors="coerce").astype(float)
        excess = (values - self.bound) if self.upper else (self.bound - values)
        scale = abs(self.bound) or 1.0
        return (excess.clip(lower=0) / scale).fillna(math.inf)

    def __str__(self) -> str:
        return f"{self.metric}{'<=' if self.upper else '>='}{self.bound:g}"


def slo_metrics(df: pd.DataFrame) -> list[str]:
    """The names an SLO may use on this frame: its numeric measurement columns."""
    return sorted(c for c in df.columns if c not in DESCRIPTIVE and pd.api.types.is_numeric_dtype(df[c]))


def check_slos(df: pd.DataFrame, slos: Iterable[Slo]) -> None:
    valid = slo_metrics(df)
    for slo in slos:
        if slo.metric not in valid:
            raise CompareError(f"--slo {slo}: unknown metric {slo.metric!r}; valid metrics here: "
                               f"{', '.join(valid)}")


@dataclass(frozen=True)
class SloChoice:
    """The answer to "what is best under these SLOs": ``best`` (a row of the frame) when some valid
    candidate meets every SLO; otherwise ``closest``, the valid candidate missing them by the least (the
    largest relative shortfall over the SLOs, smallest first; ties to the higher tok/s per GPU), with
    ``misses`` saying by how much, per SLO. Both None when no candidate is valid. ``among`` says which
    rows were candidates: ``measured``, or ``predicted`` when the frame has no measured row."""

    best: pd.Series | None
    closest: pd.Series | None
    misses: dict[str, float]
    among: str
    runner_up: pd.Series | None = None  # the next best that meets every SLO
    verdict: Verdict | None = None  # whether ``best`` beats it beyond the noise of both


def _estimate(row: pd.Series) -> Estimate:
    """A row's tok/s per GPU with its interval (the window's relative interval of its throughput)."""
    rel = row.get("output_tok_s_ci95_rel")
    return Estimate.scaled(float(row["tok_s_per_gpu"]), None if pd.isna(rel) else float(rel))


def best_under(df: pd.DataFrame, slos: Sequence[Slo]) -> SloChoice:
    """The highest output tok/s per GPU among the valid rows that meet every SLO (see :class:`SloChoice`).
    Measured rows are the candidates whenever there are any: a prediction is not evidence, and a
    trial's ``pred/`` row must not win over the measurement of the same configuration. Raises
    :class:`CompareError` for an SLO on a metric the frame does not have."""
    check_slos(df, slos)
    among = "measured" if (df["kind"] == "measured").any() else "predicted"
    candidates = df[df["kind"] == among]
    valid = candidates[candidates["valid"].astype(bool)]
    meets = pd.Series(True, index=valid.index)
    for slo in slos:
        meets &= slo.met(valid)
    ok = valid[meets & valid["tok_s_per_gpu"].notna()]
    if not ok.empty:
        ranked = ok.sort_values("tok_s_per_gpu", ascending=False, kind="stable")
        if len(ranked) < 2:
            return SloChoice(ranked.iloc[0], None, {}, among)
        best, second = ranked.iloc[0], ranked.iloc[1]
        return SloChoice(best, None, {}, among, second, judge([_estimate(best), _estimate(second)]))
    if valid.empty:
        return SloChoice(None, None, {}, among)
    gaps = pd.DataFrame({str(slo): slo.shortfall(valid) for slo in slos}, index=valid.index)
    ranked = valid.assign(_gap=gaps.max(axis=1), _neg=-valid["tok_s_per_gpu"].fillna(-math.inf))
    idx = ranked.sort_values(["_gap", "_neg"], kind="stable").index[0]
    return SloChoice(None, valid.loc[idx], {k: float(v) for k, v in gaps.loc[idx].items() if v > 0}, among)
