"""The order in which waiting requests are considered for admission (SGLang's ``--schedule-policy``).

The queue is reordered before each prefill batch is built (docs/simulator.md, "The prefix cache"), as
SGLang's ``SchedulePolicy.calc_priority`` does:

- ``fcfs``: arrival order (the default). ``routing-key``: the same here (it groups requests by a routing
  key that running requests carry; none does).
- ``lof``: longest output (``max_new_tokens``) first. ``random``: shuffled (seeded by ``--random-seed``).
- ``lpm``: longest cached prefix first; while more than 128 requests wait, arrival order (matching every
  one would cost the scheduler more than it saves).
- ``dfs-weight``: a depth-first walk of the cache's tree, heavier branches (more waiting requests ending
  in them) first, a node's own requests after its children's, so requests of one prefix run together.
- ``hrrn`` (SGLang 0.5.20+): highest response ratio first: the prompt tokens the engine has computed
  since the request arrived, over the tokens it still needs computed (a fully cached prompt first);
  arrival order above 128 waiting, as ``lpm``.
- ``shortest-prefill-first`` (0.5.22+): fewest tokens left to compute first, then arrival.

The cache-aware ones (all but ``fcfs``, ``routing-key``, ``lof`` and ``random``) also move to the back a
request whose cached prefix is at most 32 tokens and which shares 32 or more tokens with a request ahead
of it in the queue (SGLang's in-batch prefix check; ``dfs-weight`` computes it and ignores it). It only
reorders: such a request is still admitted in the same batch when the budgets allow. Without the cache,
every cache-aware policy is ``fcfs`` (``shortest-prefill-first`` refuses to start, as SGLang's does).
``priority`` is refused: SGLang accepts it on the command line and then fails at start-up.
"""

from __future__ import annotations

import random
from collections import deque

from simulator.entities import Request
from simulator.prefix_cache import CacheNode, RadixCache
from vocab.model import SCHEDULE_POLICIES

CACHE_AWARE = ("lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
POLICIES = SCHEDULE_POLICIES
MATCH_FALLBACK_QUEUE = 128  # more waiting requests than this: lpm and hrrn keep arrival order
# in-batch prefix sharing: requests whose cached prefix is at most this short are compared with each
# other, and one whose prompt shares at least this many not-yet-cached tokens with an earlier one waits
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32


class SchedulePolicy:
    def __init__(self, name: str, cache: RadixCache | None, seed: int) -> None:
        if name not in POLICIES:
            raise ValueError(f"Unknown schedule_policy: policy={name!r}; the simulated engine models "
                             f"{', '.join(POLICIES)}")
        if name == "shortest-prefill-first" and cache is None:
            raise ValueError("Experimental shortest-prefill-first requires prefix caching")
        self.name = name if (cache is not None or name not in CACHE_AWARE) else "fcfs"
        self.cache = cache
        self.rng = random.Random(seed)

    def order(self, waiting: deque[Request], computed_tokens: int) -> None:
        """Reorder ``waiting`` in place for the next prefill batch. ``computed_tokens``: prompt tokens
        the engine has computed since it started (hrrn's clock)."""
        name = self.name
        if name in ("fcfs", "routing-key"):
            return
        if name == "lof":
            ordered = sorted(waiting, key=lambda r: -r.max_new_tokens)
        elif name == "random":
            ordered = list(waiting)
            self.rng.shuffle(ordered)
        elif name in ("lpm", "hrrn") and len(waiting) > MATCH_FALLBACK_QUEUE:
            return
        else:
            ordered = self._cache_aware(list(waiting), computed_tokens)
        waiting.clear()
        waiting.extend(ordered)

    def _cache_aware(self, reqs: list[Request], computed_tokens: int) -> list[Request]:
        cache = self.cache
        assert cache is not None
        matched: dict[int, tuple[int, CacheNode]] = {}
        for r in reqs:
            if r.prompt is not None:
                matched[id(r)] = cache.match(r.prompt[:r.input_len - 1])
        if self.name == "dfs-weight":  # SGLang computes the in-batch check for it and ignores it
            return _depth_first(reqs, matched, cache.root)
        held = self._held_back(reqs, matched)

        def hit(r: Request) -> int:
            return matched[id(r)][0] if id(r) in matched else 0

        if self.name == "lpm":
            key = lambda r: (id(r) in held, -hit(r))  # noqa: E731 - one-line sort keys
        elif self.name == "hrrn":
            def key(r: Request) -> tuple[bool, float]:
                uncached = r.input_len - hit(r)
                ratio = float("inf") if uncached <= 0 else (computed_tokens - r.arrival_work) / uncached
                return id(r) in held, -ratio
        else:  # shortest-prefill-first
            key = lambda r: (id(r) in held, max(1, r.input_len - hit(r)))  # noqa: E731
        return sorted(reqs, key=key)  # stable: ties keep arrival order

    @staticmethod
    def _held_back(reqs: list[Request], matched: dict[int, tuple[int, CacheNode]]) -> set[int]:
        """Requests that share an uncached prefix with an earlier one (compared on a scratch tree of the
        waiting prompts, as SGLang does)."""
        scratch = RadixCache(1, lambda: 0.0)
        held: set[int] = set()
        for r in reqs:
            if r.prompt is None or matched[id(r)][0] > IN_BATCH_CHECK_TOKENS:
                continue
            prompt = r.prompt[:r.input_len - 1]
            shared, _ = scratch.match(prompt)
            if shared >= IN_BATCH_DEPRIORITIZE_TOKENS:
                held.add(id(r))
            else:
                scratch.insert(prompt)
        return held


def _depth_first(reqs: list[Request], matched: dict[int, tuple[int, CacheNode]],
                 root: CacheNode) -> list[Request]:
    """SGLang's dfs-weight: a node's weight is the number of waiting requests whose match ends at or below
    it; children are visited heaviest first, and a node's own requests come after its children's."""
    at: dict[int, list[Request]] = {}
    weight: dict[int, int] = {}
    loose: list[Request] = []
    for r in reqs:
        if id(r) not in matched:
            loose.append(r)
            continue
        node: CacheNode | None = matched[id(r)][1]
        at.setdefault(id(node), []).append(r)
        while node is not None:
            weight[id(node)] = weight.get(id(node), 0) + 1
            node = node.parent
    out: list[Request] = []
    # iterative post-order: a node is entered (its children pushed, heaviest on top), then left (its
    # own requests emitted) once they are done
    stack: list[tuple[CacheNode, bool]] = [(root, False)]
    while stack:
        node, left = stack.pop()
        if left:
            out.extend(at.get(id(node), ()))
            continue
        stack.append((node, True))
        kids = [c for c in node.children.values() if id(c) in weight]
        kids.sort(key=lambda c: weight[id(c)])  # the heaviest is popped first
        stack.extend((c, False) for c in kids)
    return out + loose
