"""Predicted against measured, per metric: which numbers of an entry are compared, which one is its
headline, and the errors per family.

Compared are the benchmark's own numbers as published: one throughput (``output_throughput``, else
``request_throughput``, ``input_throughput``, ``total_token_throughput`` or ``duration_s``; the others
are the same duration over other totals), the mean / median / p99 of TTFT, TPOT, ITL and E2E, and the
single-request numbers (``ttft_s``, ``speed_tok_s``). The published token totals are no prediction:
they check that the replay sent what the tool sent (``checks``).

The headline is the number the entry's load decides. Where the server was saturated (every request at
once, a concurrency cap, or an offered rate the server did not keep up with: fewer than 90 % of the
offered requests per second served) it is the throughput; below saturation the throughput only repeats
the offered rate, and the headline is the median E2E latency (else median ITL, TPOT, TTFT). A single
request's headline is its TTFT or its speed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.fidelity.corpus import Entry

THROUGHPUTS = ("output_throughput", "request_throughput", "input_throughput", "total_token_throughput",
               "duration_s")
LATENCIES = tuple(f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2e")
                  for stat in ("mean", "median", "p99"))
SINGLE = ("ttft_s", "speed_tok_s")
# a rate published only as a ratio to another run's (Entry.relative_to): this run's over that one's
RELATIVE = tuple(f"{k}_relative" for k in (*THROUGHPUTS[:-1], "speed_tok_s"))
LATENCY_HEADLINES = ("median_e2e_ms", "mean_e2e_ms", "median_itl_ms", "median_tpot_ms", "median_ttft_ms")
CHECKS = ("total_input_tokens", "total_output_tokens")
KEEPS_UP = 0.9  # served / offered requests per second at or above which a rate is below saturation


@dataclass(frozen=True)
class Row:
    id: str
    metric: str
    measured: float
    predicted: float
    headline: bool
    family: str
    layout: str
    hardware: str

    @property
    def error(self) -> float:
        """Relative error of the prediction, signed: +0.1 = predicted 10 % above measured."""
        return self.predicted / self.measured - 1.0

    def as_json(self) -> dict[str, object]:
        return {"id": self.id, "metric": self.metric, "measured": self.measured, "predicted": self.predicted,
                "headline": self.headline, "error": round(self.error, 4), "family": self.family,
                "layout": self.layout, "hardware": self.hardware}


def saturated(entry: Entry) -> bool:
    """Whether the entry's server was saturated (module doc)."""
    w = entry.workload
    rate = w.request_rate
    if rate is None or math.isinf(rate) or w.max_concurrency is not None:
        return True
    m = entry.numbers()
    served = m.get("request_throughput")
    if served is None and m.get("duration_s") and m.get("completed"):
        served = m["completed"] / m["duration_s"]
    return served is not None and served < KEEPS_UP * rate


def compared_metrics(entry: Entry) -> tuple[list[str], str | None]:
    """The measured metrics compared for ``entry`` and which one is its headline."""
    m = entry.numbers()
    relative = [k for k in RELATIVE if k in m]
    if relative:
        return relative, relative[0]
    names = [k for k in SINGLE if k in m]
    throughput = next((k for k in THROUGHPUTS if k in m), None)
    if throughput is not None and not names:
        names.append(throughput)
    names += [k for k in LATENCIES if k in m]
    if not names:
        return [], None
    if "ttft_s" in m:
        headline = "ttft_s"
    elif "speed_tok_s" in m:
        headline = "speed_tok_s"
    elif saturated(entry) and throughput is not None:
        headline = throughput
    else:
        headline = next((k for k in LATENCY_HEADLINES if k in m), throughput)
    return names, headline


def rows_for(entry: Entry, predicted: dict[str, float], family: str, layout: str, hardware: str) -> list[Row]:
    names, headline = compared_metrics(entry)
    measured = entry.numbers()
    return [Row(entry.id, k, measured[k], predicted[k], k == headline, family, layout, hardware)
            for k in names if k in predicted and measured[k] > 0 and math.isfinite(predicted[k])]


@dataclass(frozen=True)
class Summary:
    label: str
    entries: int
    metrics: int
    median_abs_error: float
    headline_median_abs_error: float
    headline_max_abs_error: float


def summarize(label: str, rows: Sequence[Row]) -> Summary:
    heads = [abs(r.error) for r in rows if r.headline]
    return Summary(label=label, entries=len({r.id for r in rows}), metrics=len(rows),
                   median_abs_error=statistics.median(abs(r.error) for r in rows) if rows else math.nan,
                   headline_median_abs_error=statistics.median(heads) if heads else math.nan,
                   headline_max_abs_error=max(heads) if heads else math.nan)


def family_label(row: Row) -> str:
    return f"{row.family} {row.layout} on {row.hardware}"


def by_family(rows: Sequence[Row]) -> list[Summary]:
    """One summary per family (dense / moe / pp / router), per family + layout + GPU, and one for all."""
    out: list[Summary] = []
    for key in (lambda r: r.family, family_label):
        groups: dict[str, list[Row]] = {}
        for r in rows:
            groups.setdefault(key(r), []).append(r)
        out += [summarize(k, v) for k, v in sorted(groups.items())]
    out.append(summarize("all", rows))
    return out
