"""The order in which waiting requests are considered for admission (SGLang's ``--schedule-policy``).

The queue is reordered before each prefill batch is built (docs/simulator.md, "The prefix cache"):

- ``fcfs``: arrival order (the default). ``priority``: the same, as no request carries a priority here.
- ``lof``: longest output (``max_new_tokens``) first.
- ``random``: shuffled (seeded by ``--random-seed``).
- ``lpm``: longest cached prefix first. While more than 128 requests wait it falls back to ``fcfs``
  (matching every one would cost the scheduler more than it saves).
- ``dfs-weight``: a depth-first walk of the cache's tree, heavier branches (more waiting requests ending
  in them) first, so requests that share a prefix run together.

The cache-aware two (``lpm``, ``dfs-weight``) also hold back requests that share a not-yet-cached prefix
of at least 32 tokens with a request ahead of them in the queue: only the first is admitted now, the
others go to the back and find the prefix cached once its prefill has run. Without the cache, every
policy that needs it is ``fcfs``.
"""

from __future__ import annotations

import random
from collections import deque

from simulator.entities import Request
from simulator.prefix_cache import CacheNode, RadixCache
from vocab.model import SCHEDULE_POLICIES

CACHE_AWARE = ("lpm", "dfs-weight")
POLICIES = SCHEDULE_POLICIES
LPM_FALLBACK_QUEUE = 128  # more waiting requests than this: lpm orders them first come, first served
# in-batch prefix sharing: requests whose cached prefix is at most this short are compared with each
# other, and one whose prompt shares at least this many not-yet-cached tokens with an earlier one waits
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32


class SchedulePolicy:
    def __init__(self, name: str, cache: RadixCache | None, seed: int) -> None:
        if name not in POLICIES:
            raise ValueError(f"--schedule-policy {name!r} is not modelled; choose one of "
                             f"{', '.join(POLICIES)}")
        self.name = name if (cache is not None or name not in CACHE_AWARE) else "fcfs"
        self.cache = cache
        self.rng = random.Random(seed)

    def order(self, waiting: deque[Request]) -> None:
        """Reorder ``waiting`` in place for the next prefill batch."""
        name = self.name
        if name in ("fcfs", "priority"):
            return
        if name == "lof":
            ordered = sorted(waiting, key=lambda r: -r.max_new_tokens)
        elif name == "random":
            ordered = list(waiting)
            self.rng.shuffle(ordered)
        elif len(waiting) > LPM_FALLBACK_QUEUE and name == "lpm":
            return
        else:
            ordered = self._cache_aware(list(waiting))
        waiting.clear()
        waiting.extend(ordered)

    def _cache_aware(self, reqs: list[Request]) -> list[Request]:
        cache = self.cache
        assert cache is not None
        matched: dict[int, tuple[int, CacheNode]] = {}
        for r in reqs:
            if r.prompt is not None:
                matched[id(r)] = cache.match(r.prompt[:r.input_len - 1])
        held_back = self._held_back(reqs, matched)
        front = [r for r in reqs if id(r) not in held_back]
        if self.name == "lpm":
            front.sort(key=lambda r: -matched.get(id(r), (0, None))[0])
        else:
            front = _depth_first(front, matched, cache.root)
        return front + [r for r in reqs if id(r) in held_back]

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
    it; children are visited heaviest first, and a node's own requests go before its children's."""
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
    stack = [root]
    while stack:
        node = stack.pop()
        out.extend(at.get(id(node), ()))
        kids = [c for c in node.children.values() if id(c) in weight]
        kids.sort(key=lambda c: weight[id(c)])  # the heaviest is popped first
        stack.extend(kids)
    return out + loose
