"""What every rule shares: picking the points to judge (the busiest, by load), naming where a number comes
from (GPU telemetry, the scheduler series), and writing a suggestion with its change as the overrides a
user types (``overrides_text``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.diagnose.facts import TrialFacts
from vocab.status import simulated as is_simulated
from vocab.telemetry import (
    GpuSource,
)
from vocab.values import float_or_none

# ---- helpers -------------------------------------------------------------------------------------

def busiest(f: TrialFacts, key: str | None = None) -> str | None:
    """The highest valid closed-loop load point (that has ``key`` in its metrics, when given)."""
    labels = [label for label in f.concurrency if label in f.points
              and (key is None or float_or_none(f.points[label].get(key)) is not None)
              and f.points[label].get("valid", 1) != 0]
    return max(labels, key=lambda k: f.concurrency[k]) if labels else None


def by_load(f: TrialFacts, labels: Sequence[str]) -> list[str]:
    """``labels`` busiest first: closed-loop points by concurrency, then the others in their order."""
    closed = sorted((x for x in labels if x in f.concurrency), key=lambda k: -f.concurrency[k])
    return closed + [x for x in labels if x not in f.concurrency]


def per_replica(f: TrialFacts, c: int) -> int:
    """Concurrency one DP replica sees (the router spreads requests over the replicas; in a disaggregated
    deployment, over the decode servers' replicas)."""
    servers = f.pd["decode_workers"] if f.pd else 1
    return math.ceil(c / max(1, f.dp_size * f.attn_dp * servers))


def gpu_evidence(f: TrialFacts) -> str | None:
    """"(NVML, measured)" or "(simulated GPU telemetry, not measured)"; None without GPU telemetry."""
    source = GpuSource(f.gpu_source)
    return None if source is GpuSource.NONE else f"({source.describe()})"




def scheduler_evidence(f: TrialFacts) -> str:
    # the engine tag decides, whatever GPU sampling did (a sim trial with gpu_hz=0 has source "none");
    # simulated GPU telemetry only comes with the simulated engine, whose log and metrics it also wrote
    simulated = is_simulated(f.engine) or f.gpu_source == GpuSource.SIMULATED
    return "(simulated engine's log / metrics, not measured)" if simulated else "(engine log / metrics)"


def _value(v: Any) -> str:
    """A value as a Hydra override writes it."""
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, list | tuple):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, str) and "," in v:
        return f"'{v}'"  # quoted: a bare comma would start a sweep
    return str(v)


ENV_PREFIX = "env."  # a change key naming an environment variable of the engine, not a config key
# engine flags are not in the config schema: run.py takes them only as additions, with a leading +
EXTRA_ARGS_PREFIX = "server.extra_args."


def _override(key: str, value: Any) -> str:
    if key.startswith(ENV_PREFIX):
        return f"{key.removeprefix(ENV_PREFIX)}={value} (engine environment)"
    plus = "+" if key.startswith(EXTRA_ARGS_PREFIX) else ""
    return f"{plus}{key}={_value(value)}"


def overrides_text(change: Mapping[str, Any]) -> str:
    """``pp.micro_batch_size=4 pp.async_depth=1``: a change as the overrides a user types (an engine
    flag as ``+server.extra_args.<flag>=value``, as run.py wants it; an engine environment variable as
    ``NAME=value (engine environment)``: it is exported, not overridden)."""
    return " ".join(_override(k, v) for k, v in change.items())


def suggest(why: str, change: Mapping[str, Any]) -> str:
    """The suggestion text: it states exactly the change the finding carries (the alternatives are
    named only if the change is predicted not to help)."""
    return why + (f" Set {overrides_text(change)}." if change else "")


def more_load(f: TrialFacts, label: str) -> int | None:
    """Twice the point's concurrency: where the configuration is predicted for what it needs to fill
    (said apart from the fix: a user seldom chooses the traffic)."""
    c = f.concurrency.get(label)
    return 2 * c if c else None


def some(*changes: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [c for c in changes if c]


def micro_batches(f: TrialFacts, c: int, cap: int) -> int:
    """Micro-batches one replica fills at concurrency c under a per-slot cap."""
    return min(f.pp_size + f.async_depth, math.ceil(per_replica(f, c) / cap))
