"""Rules on a disaggregated deployment: which side of it holds the requests back. All read the five parts
of the TTFT that each decode server reports per request (``pd_ttft_<part>_ms``, averaged over the
point's window) and, where the point has them, each role's GPU busy share; the changes they suggest are
the deployment's own ratio and layout, each predicted before it is offered (the advice check).

* ``pd_prefill_bound``: requests queue on the prefill servers for most of their TTFT: more prefill;
* ``pd_decode_bound``: the decode servers are busy while the prefill servers wait: more decode;
* ``pd_transfer_bound``: moving the KV takes a large share of the TTFT: the path between the servers;
* ``pd_decode_kv_pressure``: requests wait for the decode servers' pre-allocation before any prefill
  (SGLang computes nothing before it): the decode servers' KV is the bottleneck.
"""

from __future__ import annotations

from typing import Any

from analysis.diagnose.evidence import by_load, scheduler_evidence, suggest
from analysis.diagnose.facts import TrialFacts
from vocab.findings import Finding
from vocab.model import DEFAULT_RESERVED_DECODE_TOKENS
from vocab.records import PD_TTFT_PARTS
from vocab.telemetry import PD_DECODE_UTIL, PD_PREFILL_UTIL, PD_TRANSFER_MB, pd_stage_part, pd_ttft_part
from vocab.values import float_or_none

# a part of the TTFT this large (share, and at least this many ms) is what holds the request back
DOMINANT_SHARE = 0.5
MIN_MS = 50.0
TRANSFER_SHARE = 0.25  # a transfer this large a share of the TTFT is worth a look at the path
BOOTSTRAP_SHARE = 0.25
BUSY_PCT = 90.0  # a role whose GPUs are this busy has no room left
IDLE_PCT = 50.0  # ... and one below this has room to give


def _parts(f: TrialFacts, label: str) -> dict[str, float] | None:
    """The point's TTFT in parts: the requests' own accounts where they give them (the simulated
    engine, predictions), else the servers' stage histograms (SGLang)."""
    m = f.points[label]
    for name in (pd_ttft_part, pd_stage_part):
        parts = {p: float_or_none(m.get(name(p))) for p in PD_TTFT_PARTS}
        if all(v is not None for v in parts.values()):
            return {p: float(v) for p, v in parts.items()}  # type: ignore[arg-type]
    return None


def _points(f: TrialFacts) -> list[tuple[str, dict[str, float]]]:
    """Valid points with the parts, busiest first."""
    labels = [x for x in f.points if f.points[x].get("valid", 1) != 0]
    out = []
    for label in by_load(f, labels):
        parts = _parts(f, label)
        if parts is not None and sum(parts.values()) > 0:
            out.append((label, parts))
    return out


def _dominant(parts: dict[str, float], part: str, share: float) -> bool:
    """Whether ``part`` is at least ``share`` of the TTFT, and at least MIN_MS."""
    return parts[part] >= max(MIN_MS, share * sum(parts.values()))


def _split(parts: dict[str, float]) -> str:
    total = sum(parts.values())
    names = {"bootstrap": "waiting for the decode server's pre-allocation", "prefill_queue": "queueing for a "
             "prefill server", "prefill": "prefill", "transfer": "KV transfer", "decode_first":
             "the decode server's first step"}
    return f"TTFT {total:.0f} ms: " + ", ".join(f"{names[p]} {v:.0f} ms" for p, v in parts.items())


def _role_busy(f: TrialFacts, label: str) -> tuple[float | None, float | None]:
    m = f.points[label]
    return float_or_none(m.get(PD_PREFILL_UTIL)), float_or_none(m.get(PD_DECODE_UTIL))


def _trade(f: TrialFacts, more: str) -> list[dict[str, Any]]:
    """One more server of role ``more``: taken from the other role where both take the same GPUs and
    the other keeps one (the same GPUs, a new ratio), then added outright (more GPUs)."""
    pd = f.pd
    assert pd is not None
    less = "decode" if more == "prefill" else "prefill"
    n_more, n_less = pd[f"{more}_workers"], pd[f"{less}_workers"]
    options = []
    if pd["prefill_gpus"] == pd["decode_gpus"] and n_less > 1:
        options.append({f"pd.{more}.workers": n_more + 1, f"pd.{less}.workers": n_less - 1})
    options.append({f"pd.{more}.workers": n_more + 1})
    return options


def pd_prefill_bound(f: TrialFacts) -> list[Finding]:
    """At the busiest point where queueing for a prefill server is at least half of the TTFT (and 50 ms):
    the prefill servers take prompts in slower than they come. Suggests one more prefill server for one
    decode server on the same GPUs, else one more prefill server. Judged on TTFT p99."""
    if f.pd is None:
        return []
    for label, parts in _points(f):
        if not _dominant(parts, "prefill_queue", DOMINANT_SHARE):
            continue
        busy_p, _ = _role_busy(f, label)
        busy = f"; the prefill servers' GPUs {busy_p:.0f} % busy" if busy_p is not None else ""
        change, *alternatives = _trade(f, "prefill")
        return [Finding(
            "pd_prefill_bound", "warning", f"The prefill servers hold the requests back at {label}",
            f"{_split(parts)} at {label} {scheduler_evidence(f)}{busy}",
            suggest("Give the deployment more prefill: another prefill server, for a decode server where "
                    "the decode side can spare one.", change),
            point=label, change=change, alternatives=alternatives, goal="ttft_p99_ms")]
    return []


def pd_decode_bound(f: TrialFacts) -> list[Finding]:
    """At the busiest point where the decode servers' GPUs are at least 90 % busy and the prefill
    servers' below half, and prompts do not queue on the prefill side: tokens come out as fast as the
    decode servers can make them, while prefill capacity waits. Suggests a prefill server traded for a
    decode server on the same GPUs, else one more decode server. Judged on throughput."""
    if f.pd is None:
        return []
    for label, parts in _points(f):
        busy_p, busy_d = _role_busy(f, label)
        if busy_p is None or busy_d is None or busy_d < BUSY_PCT or busy_p >= IDLE_PCT:
            continue
        if parts["prefill_queue"] >= DOMINANT_SHARE * sum(parts.values()):
            continue
        change, *alternatives = _trade(f, "decode")
        return [Finding(
            "pd_decode_bound", "warning", f"The decode servers are the bottleneck at {label}",
            f"the decode servers' GPUs {busy_d:.0f} % busy, the prefill servers' {busy_p:.0f} % at {label} "
            f"{scheduler_evidence(f)}; {_split(parts)}",
            suggest("Give the deployment more decode: another decode server, for a prefill server where "
                    "the prefill side can spare one.", change),
            point=label, change=change, alternatives=alternatives)]
    return []


def pd_transfer_bound(f: TrialFacts) -> list[Finding]:
    """At the busiest point where the KV transfer is at least a quarter of the TTFT (and 50 ms): the path
    between prefill and decode servers (its bandwidth per GPU, or the bytes each GPU moves) is a large part
    of every first token. No change is predicted for it here: the path is the hardware's; what moves less
    is an FP8 KV cache (half the bytes) or servers that share a node."""
    if f.pd is None:
        return []
    for label, parts in _points(f):
        if not _dominant(parts, "transfer", TRANSFER_SHARE):
            continue
        total = sum(parts.values())
        moved = float_or_none(f.points[label].get(PD_TRANSFER_MB))
        size = f"; {moved:.0f} MB per GPU per request" if moved is not None else ""
        share = parts["transfer"] / total
        return [Finding(
            "pd_transfer_bound", "warning", f"Moving the KV takes {share:.0%} of the TTFT at {label}",
            f"{_split(parts)} at {label} {scheduler_evidence(f)}{size}",
            suggest("Move fewer bytes or move them faster: an FP8 KV cache halves them; prefill and decode "
                    "servers on one node send over the GPUs' link instead of the network.", {}),
            point=label, goal="ttft_p99_ms")]
    return []


def pd_decode_kv_pressure(f: TrialFacts) -> list[Finding]:
    """At the busiest point where waiting for the decode servers' pre-allocation is at least a quarter
    of the TTFT (and 50 ms): a prefill server computes nothing for a request before its decode server
    has reserved the prompt's KV (SGLang's early policy), so a full decode pool delays every prefill.
    Suggests one more decode server (more KV), else fewer tokens reserved per running request. Judged
    on TTFT p99."""
    if f.pd is None:
        return []
    for label, parts in _points(f):
        if not _dominant(parts, "bootstrap", BOOTSTRAP_SHARE):
            continue
        reserved = f.pd.get("reserved_decode_tokens") or DEFAULT_RESERVED_DECODE_TOKENS
        fewer = {"pd.reserved_decode_tokens": max(64, reserved // 2)}
        change, *alternatives = [*_trade(f, "decode"), fewer]
        return [Finding(
            "pd_decode_kv_pressure", "warning",
            f"Requests wait for the decode servers' KV before any prefill at {label}",
            f"{_split(parts)} at {label} {scheduler_evidence(f)}: the decode servers pre-allocate a "
            f"request's whole prompt, plus {reserved} tokens per request they hold, before its prefill "
            "may start",
            suggest("Give the decode side more KV (another decode server), or reserve fewer tokens per "
                    "running request.", change),
            point=label, change=change, alternatives=alternatives, goal="ttft_p99_ms")]
    return []
