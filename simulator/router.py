"""Which data-parallel replica a request goes to (``--dp-size`` > 1): SGLang's router policies.

- ``round_robin``: each replica in turn, whatever the request (SGLang's built-in DP controller by
  default, and the router's ``round_robin``). Round-robin splits a shared prefix's requests over every
  replica, so each replica's cache computes it and keeps its own copy.
- ``cache_aware`` (the ``sglang-router`` package's default): the router keeps an approximate prefix tree
  per replica of the prompts it sent there. If the load is out of balance (the busiest replica has more
  than ``BALANCE_ABS`` requests in flight above the idlest *and* more than ``BALANCE_REL`` times as
  many), the idlest replica takes the request. Otherwise the replica whose tree shares the longest
  beginning with the prompt takes it when that beginning is more than ``CACHE_THRESHOLD`` of the prompt,
  else the idlest replica. The request is then added to the chosen replica's tree. Defaults are the
  Python launcher's (threshold 0.3, 64 requests, 1.5 times).

A replica's load is the requests it holds (waiting or running), which is what the router counts when it
is the only client. The router's trees are on token ids here (the real one works on text) and are never
evicted (the real one trims them to a size limit every minute).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.prefix_cache import RadixCache
from vocab.model import DP_ROUTERS

ROUTER_POLICIES = DP_ROUTERS
CACHE_THRESHOLD = 0.3
BALANCE_ABS = 64
BALANCE_REL = 1.5


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
        if self.policy == "round_robin" or prompt is None:
            i = self._next
            self._next = (self._next + 1) % self.replicas
            return i
        idlest = min(range(self.replicas), key=lambda k: loads[k])
        busiest = max(loads)
        if busiest - loads[idlest] > BALANCE_ABS and busiest > BALANCE_REL * loads[idlest]:
            choice = idlest
        else:
            matched = [tree.match(prompt)[0] for tree in self._trees]
            best = max(range(self.replicas), key=lambda k: matched[k])
            choice = best if len(prompt) and matched[best] / len(prompt) > CACHE_THRESHOLD else idlest
        self._trees[choice].insert(prompt)
        return choice
