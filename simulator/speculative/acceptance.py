"""How many drafted tokens the target accepts per verify: the acceptance model.

A real SGLang server learns its accept length from the traffic and the draft; the simulated engine has
neither, so it is told (``--sim-spec-acceptance``), in one of three forms:

- ``auto:<class>``: the published accept lengths of the draft kind on that class of traffic (chat, code,
  math), from the table below, each row with its source;
- a number: the mean accept length (tokens per request per verify, the target's own token included), as
  SGLang's ``accept len`` reports it, at the server's draft depth;
- ``rates:p1,p2,...``: the conditional acceptance of each draft position (p2: the second drafted token is
  accepted, given the first was); positions beyond the list repeat its last rate.

A single number becomes one rate ``a`` for every position (the chain formula of Leviathan et al.,
arXiv 2211.17192: E[accept length] = (1 - a^(k+1)) / (1 - a) for k drafted tokens), solved so the
expectation at the row's own depth matches; so a row measured at 3 steps says what 5 steps would accept.
Trees (topk > 1) are treated as chains of their depth: a published row already holds its tree's gain, and
no closed form relates a tree's acceptance to a chain's.

``SGLANG_SIMULATE_ACC_LEN`` (SGLang's own override, for measuring at a chosen accept length with dummy
weights) wins over all of these, sampled as SGLang's default ``match-expected`` method samples it: the
floor or the ceiling of the mean, in proportion, so the mean is exact.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass

CLASSES = ("chat", "code", "math")


class AcceptanceError(ValueError):
    """An acceptance the model cannot use; the message is one line."""


@dataclass(frozen=True)
class Published:
    """One published accept length: a draft kind on a class of traffic, at a chain depth."""

    kind: str  # eagle3 | mtp
    traffic: str  # chat | code | math
    steps: int  # the draft depth it was measured at
    accept_length: float  # tokens per request per verify, the target's token included
    what: str  # model, benchmark, configuration
    source: str  # where it is published


# Accept lengths published with their configuration (steps, topk, draft tokens). EAGLE (EAGLE-2), n-gram
# and standalone drafts have none here that name their configuration: their acceptance must be given.
PUBLISHED = (
    Published("eagle3", "chat", 3, 2.69, "Kimi-K2.5 + EAGLE-3 head, MT-Bench, (3,1,4)",
              "https://huggingface.co/lightseekorg/kimi-k2.5-eagle3"),
    Published("eagle3", "code", 3, 3.37, "Kimi-K2-Instruct + EAGLE-3 head, HumanEval, bs 8, (3,1,4)",
              "https://huggingface.co/AQ-MedAI/Kimi-K2-Instruct-eagle3"),
    Published("eagle3", "code", 3, 3.29, "Kimi-K2.5 + EAGLE-3 head, HumanEval, (3,1,4)",
              "https://huggingface.co/lightseekorg/kimi-k2.5-eagle3"),
    Published("eagle3", "math", 3, 3.17, "Kimi-K2-Instruct + EAGLE-3 head, GSM8K, bs 8, (3,1,4)",
              "https://huggingface.co/AQ-MedAI/Kimi-K2-Instruct-eagle3"),
    Published("eagle3", "math", 3, 3.49, "Kimi-K2-Instruct + EAGLE-3 head, Math500, bs 8, (3,1,4)",
              "https://huggingface.co/AQ-MedAI/Kimi-K2-Instruct-eagle3"),
    Published("eagle3", "math", 3, 3.20, "Kimi-K2.5 + EAGLE-3 head, GSM8K, (3,1,4)",
              "https://huggingface.co/lightseekorg/kimi-k2.5-eagle3"),
    Published("eagle3", "math", 3, 3.34, "Kimi-K2.5 + EAGLE-3 head, MATH500, (3,1,4)",
              "https://huggingface.co/lightseekorg/kimi-k2.5-eagle3"),
    # DeepSeek-V3's report gives the second token's acceptance as 85-90 % across generation topics
    Published("mtp", "chat", 1, 1.875, "DeepSeek-V3 MTP: second token accepted 85-90 % (report 5.4.3)",
              "arXiv 2412.19437"),
    Published("mtp", "chat", 1, 1.7, "DeepSeek-R1 MTP (1,1,2), SGLang, TP16, 1 request: accept len 1.6-1.8",
              "https://github.com/sgl-project/sglang/issues/4417"),
    Published("mtp", "code", 1, 1.875, "DeepSeek-V3 MTP: second token accepted 85-90 % (report 5.4.3)",
              "arXiv 2412.19437"),
    Published("mtp", "math", 1, 1.875, "DeepSeek-V3 MTP: second token accepted 85-90 % (report 5.4.3)",
              "arXiv 2412.19437"),
)


def chain_length(rate: float, steps: int) -> float:
    """E[accept length] of a chain of ``steps`` drafts each accepted with ``rate`` given the one before."""
    return sum(rate ** j for j in range(steps + 1))


def rate_for_length(length: float, steps: int) -> float:
    """The per-position rate whose chain of ``steps`` drafts accepts ``length`` tokens on average."""
    if not 1.0 <= length <= steps + 1:
        raise AcceptanceError(f"accept length {length:g} is outside [1, {steps + 1}] for {steps} draft steps")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: chain_length grows with the rate
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chain_length(mid, steps) < length else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Acceptance:
    """Conditional acceptance per draft position, or a forced mean; and where it came from."""

    rates: tuple[float, ...]
    source: str
    forced_mean: float | None = None  # SGLANG_SIMULATE_ACC_LEN

    def rate(self, position: int) -> float:
        """The acceptance of draft position ``position`` (1-based) given the ones before it."""
        return self.rates[min(position, len(self.rates)) - 1]

    def survival(self, depth: int) -> list[float]:
        """P(accept length > j) for j = 1..depth: the chance the first j drafts are all accepted."""
        out, p = [], 1.0
        for j in range(1, depth + 1):
            p *= self.rate(j)
            out.append(p)
        return out

    def expected_length(self, depth: int) -> float:
        """Mean tokens one verify emits per request with ``depth`` drafted tokens on its deepest path."""
        if self.forced_mean is not None:
            return min(max(self.forced_mean, 1.0), depth + 1.0)
        return 1.0 + sum(self.survival(depth))

    def sampler(self, depth: int):  # type: ignore[no-untyped-def]
        """A function of one uniform draw in [0, 1) giving one request's accept length."""
        if self.forced_mean is not None:
            mean = self.expected_length(depth)
            low = math.floor(mean)
            frac = mean - low
            return lambda u: low + (1 if u < frac else 0)
        thresholds = self.survival(depth)
        return lambda u: 1 + sum(1 for t in thresholds if u < t)


def published_rows(kind: str, traffic: str) -> list[Published]:
    return [p for p in PUBLISHED if p.kind == kind and p.traffic == traffic]


def from_table(kind: str, traffic: str) -> Acceptance:
    """``auto``: the median per-position rate of the published rows of ``kind`` on ``traffic``."""
    if traffic not in CLASSES:
        raise AcceptanceError(f"traffic class {traffic!r}: valid: {', '.join(CLASSES)}")
    rows = published_rows(kind, traffic)
    if not rows:
        kinds = sorted({p.kind for p in PUBLISHED})
        raise AcceptanceError(f"no published accept length for {kind} drafts (the table has "
                              f"{', '.join(kinds)}): give the acceptance as a number or per-position rates")
    rate = statistics.median(rate_for_length(p.accept_length, p.steps) for p in rows)
    cited = "; ".join(f"{p.what}: {p.accept_length:g} at {p.steps} steps ({p.source})" for p in rows)
    return Acceptance((rate,), f"published {kind} accept lengths on {traffic} traffic, per-position rate "
                               f"{rate:.3f}: {cited}")


def parse_acceptance(text: str, kind: str, steps: int) -> Acceptance:
    """``--sim-spec-acceptance`` as given (``auto:<class>``, a mean accept length, ``rates:...``), with
    ``SGLANG_SIMULATE_ACC_LEN`` winning where set (SGLang: -1 or unset is off)."""
    base = _parse(text, kind, steps)
    forced = os.environ.get("SGLANG_SIMULATE_ACC_LEN", "").strip()
    if forced:
        try:
            mean = float(forced)
        except ValueError:
            raise AcceptanceError(f"SGLANG_SIMULATE_ACC_LEN={forced!r} is not a number") from None
        if mean > 0:
            return Acceptance(base.rates, f"SGLANG_SIMULATE_ACC_LEN={mean:g} (match-expected)", mean)
    return base


def _parse(text: str, kind: str, steps: int) -> Acceptance:
    text = text.strip()
    if text.startswith("auto"):
        _, _, traffic = text.partition(":")
        return from_table(kind, traffic or "chat")
    if text.startswith("rates:"):
        try:
            rates = tuple(float(x) for x in text[len("rates:"):].split(",") if x.strip())
        except ValueError:
            raise AcceptanceError(f"acceptance {text!r}: rates must be numbers, e.g. rates:0.8,0.6") from None
        if not rates or any(not 0.0 <= r <= 1.0 for r in rates):
            raise AcceptanceError(f"acceptance {text!r}: each rate must be in [0, 1]")
        return Acceptance(rates, f"per-position rates {', '.join(f'{r:g}' for r in rates)} (given)")
    try:
        length = float(text)
    except ValueError:
        raise AcceptanceError(f"acceptance {text!r}: valid: auto[:chat|code|math], a mean accept length, "
                              "or rates:p1,p2,...") from None
    rate = rate_for_length(length, steps)
    return Acceptance((rate,), f"mean accept length {length:g} at {steps} steps (given), per-position rate "
                               f"{rate:.3f}")
