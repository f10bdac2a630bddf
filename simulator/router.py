"""Which data-parallel replica a request goes to (``--dp-size`` > 1): SGLang's router policies.

- ``round_robin``: each replica in turn, whatever the request (SGLang's built-in DP controller by
  default, and the router's ``round_robin``). Round-robin splits a shared prefix's requests over every
  replica, so each replica's cache computes it and keeps its own copy.
- ``total_requests`` (SGLang's DP controller with ``--load-balance-method total_requests``): the
  replica holding the fewest requests, the first on ties. The controller counts from what the
  schedulers report; the model counts exactly.
- ``cache_aware`` (the router package's default), as ``smg`` 1.13.0 (the release parasweep launches)
  decides on HTTP workers: the router keeps an approximate prefix tree of the prompts it sent to each
  replica. When the longest beginning any replica's tree shares with the prompt is more than
  ``CACHE_THRESHOLD`` of it, the candidate is the least-loaded replica holding that beginning; it takes
  the request unless it is over the spill gate (more than ``BALANCE_REL`` times the mean load of the
  replicas *and* more than the mean plus a margin: ``BALANCE_ABS`` capped at two standard deviations of
  a Poisson count at that mean, ``ceil(2 * sqrt(mean))``, and never under ``MIN_MARGIN``), when the idlest
  replica takes it. Without such a beginning the idlest replica takes it. The request is then added to
  the chosen replica's tree, so a prefix that spilled gains a second home. Defaults are the router's
  (threshold 0.3, 64 requests, 1.5 times).

A replica's load is the requests it holds (waiting or running), which is what the router counts when it
is the only client. Not modelled: the router's "expected wait" choice among idle replicas (it scores them
from the engines' ``/v1/loads``; here the idlest, the first on ties), its fleet-wide fallback under KV
pressure, and the trimming of its trees to a size limit every minute; the trees are on token ids, as the
router's are for ``/generate`` with ``input_ids``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simulator.prefix_cache import RadixCache
from vocab.model import DP_ROUTERS

ROUTER_POLICIES = DP_ROUTERS
CACHE_THRESHOLD = 0.3
BALANCE_ABS = 64
BALANCE_REL = 1.5
MIN_MARGIN = 4.0  # the gate's absolute margin is never under this (unless BALANCE_ABS is)


class Router:
    def __init__(self, policy: str, replicas: int) -> None:
        if policy not in ROUTER_POLICIES:
            raise ValueError(f"router policy {policy!r}: valid: {', '.join(ROUTER_POLICIES)}")
        self.policy = policy
        self.replicas = replicas
        self._next = 0
        self._trees = [RadixCache(1, lambda: 0.0) for _ in range(replicas)] if policy == "cache_aware" else []

    def pick(self, prompt: np.ndarray | None, loads: Sequence[int]) -> int:
        """The replica for a request with ``prompt`` (None: its ids are unknown), given each replica's
        requests in flight."""
        if self.replicas == 1:
            return 0
        idlest = min(range(self.replicas), key=lambda k: loads[k])
        if self.policy == "total_requests":
            return idlest
        if self.policy == "round_robin" or prompt is None:
            i = self._next
            self._next = (self._next + 1) % self.replicas
            return i
        matched = [tree.match(prompt)[0] for tree in self._trees]
        longest = max(matched)
        choice = idlest
        if len(prompt) and longest / len(prompt) > CACHE_THRESHOLD:
            holder = min((k for k in range(self.replicas) if matched[k] == longest), key=lambda k: loads[k])
            if not over_spill_gate(loads[holder], sum(loads) / self.replicas):
                choice = holder
        self._trees[choice].insert(prompt)
        return choice


def spill_margin(mean: float) -> float:
    """The spill gate's absolute margin at a mean load of ``mean``: two standard deviations of a Poisson
    count at that mean, in whole requests, at least ``MIN_MARGIN`` and at most ``BALANCE_ABS``."""
    return min(float(BALANCE_ABS), max(math.ceil(2.0 * math.sqrt(mean)), MIN_MARGIN))


def over_spill_gate(load: float, mean: float) -> bool:
    """Whether a replica holding ``load`` requests, against a mean of ``mean`` over the replicas, is too
    busy to take a request for its cached prefix (smg 1.13.0's count-pressure gate)."""
    return load > BALANCE_REL * mean and load > mean + spill_margin(mean)
