"""Rules on an engine with several schedulers: attention-DP ranks inside its TP group, or DP replicas
behind its own controller. Each scheduler reports its own running and waiting requests (its log lines'
``DP<r>`` and its gauges' ``dp_rank``); the summaries per rank are ``vocab.telemetry``'s RANK_*."""

from __future__ import annotations

from analysis.diagnose.evidence import by_load, per_replica, scheduler_evidence, suggest
from analysis.diagnose.facts import TrialFacts
from vocab.findings import Finding
from vocab.telemetry import RANK_QUEUE, RANK_QUEUE_SPREAD, RANK_RUNNING
from vocab.telemetry import per_replica as rank_metric
from vocab.values import float_or_none, int_or_none

# a rank is left with room when it ran this much below what it could: its request cap, or its share of
# the streams, whichever is lower
ROOM = 0.9
MIN_QUEUE_SPREAD = 1.0  # requests: one rank's mean queue at least this much longer than another's


def dealt_unevenly(f: TrialFacts, label: str) -> str:
    """Why requests waited on some ranks while others had room at ``label`` under round-robin dispatch
    ("" where they did not): the ranks' mean queues differ by ``MIN_QUEUE_SPREAD`` or more while the rank
    that ran fewest ran below ``ROOM`` of its cap (or of its share of the streams)."""
    ranks = f.dp_size * f.attn_dp
    if ranks < 2 or f.dp_router != "round_robin" or f.pd is not None:
        return ""
    m = f.points[label]
    spread = float_or_none(m.get(RANK_QUEUE_SPREAD))
    running = [float_or_none(m.get(rank_metric(r, RANK_RUNNING))) for r in range(ranks)]
    queues = [float_or_none(m.get(rank_metric(r, RANK_QUEUE))) for r in range(ranks)]
    if spread is None or spread < MIN_QUEUE_SPREAD:
        return ""
    ran = [x for x in running if x is not None]
    waited = [x for x in queues if x is not None]
    if len(ran) < ranks or len(waited) < ranks:
        return ""
    cap = int_or_none(f.resolved.get("max_running_requests"))  # each rank's own
    c = f.concurrency.get(label)
    limits = [x for x in (cap, per_replica(f, c) if c else None) if x]
    if not limits:
        return ""
    room = min(limits)
    idle, long = ran.index(min(ran)), waited.index(max(waited))
    if ran[idle] >= ROOM * room:
        return ""
    return (f"rank {long} kept {waited[long]:.1f} requests waiting on average while rank {idle} "
            f"ran {ran[idle]:.1f} of its {room} " + ("request slots" if room == cap else "streams' share")
            + f" ({ranks} ranks dealt requests in turn)")


def dp_dispatch_imbalance(f: TrialFacts) -> list[Finding]:
    """The controller deals requests in turn, whatever each rank already holds: with requests of
    unequal lengths some ranks collect more than they can run while others have room. Fires at the
    busiest point where :func:`dealt_unevenly` says so. The change: ``dp.router=total_requests``
    (SGLang's controller sends each request to the rank holding the fewest). Goal: the TTFT p99 (the
    requests that waited behind a full rank)."""
    fired = {label: why for label in f.points if (why := dealt_unevenly(f, label))}
    if not fired:
        return []
    label = by_load(f, list(fired))[0]
    change = {"dp.router": "total_requests"}
    return [Finding(
        "dp_dispatch_imbalance", "warning", f"Requests wait on some ranks while others have room at {label}",
        f"{fired[label]} at {label} {scheduler_evidence(f)}",
        suggest("Send each request to the rank holding the fewest.", change),
        point=label, change=change, goal="ttft_p99_ms")]
