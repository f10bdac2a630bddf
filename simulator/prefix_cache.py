"""The radix cache: SGLang's prefix tree over prompt token ids, whose nodes own KV pool slots.

A node holds a run of token ids (whole pages of ``page_size`` tokens; an unaligned tail is never
cached), its children keyed by their first page, a lock count and the time it was last used. A request
that is matched locks the path from the root to its last matched node (``lock``): locked tokens are
*protected*, the rest *evictable*. When the pool needs room, unlocked leaves go first, least recently
used first, and a parent whose last child went becomes a leaf in its turn (``evict``).

Only the structure and its bookkeeping live here; ``admission.py`` decides when a request is matched,
when its prompt and output are inserted and how the pool's tokens are budgeted (docs/simulator.md,
"The prefix cache").
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import numpy as np

from vocab.token_ids import shared_prefix_len

Key = int | tuple[int, ...]


class CacheNode:
    __slots__ = ("children", "ids", "last_used", "lock_ref", "parent", "stamp")

    def __init__(self, ids: np.ndarray, parent: CacheNode | None, last_used: float) -> None:
        self.ids = ids
        self.parent = parent
        self.children: dict[Key, CacheNode] = {}
        self.lock_ref = 0
        self.last_used = last_used
        self.stamp = -1  # the sequence number of this node's live entry in the eviction heap


class RadixCache:
    """A prefix tree of token ids at ``page_size`` granularity. ``clock`` gives the time a use is
    stamped with (the simulated clock)."""

    def __init__(self, page_size: int, clock: Callable[[], float]) -> None:
        self.page = max(1, page_size)
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        """Drop every cached token (``/flush_cache``; only valid with no request holding a lock)."""
        self.root = CacheNode(np.empty(0, dtype=np.int64), None, 0.0)
        self.root.lock_ref = 1  # the root is never evicted
        self.total = 0  # tokens the tree holds (pool slots)
        self.evictable = 0  # of which no running request holds a lock
        self._heap: list[tuple[float, int, CacheNode]] = []
        self._seq = itertools.count()

    @property
    def protected(self) -> int:
        return self.total - self.evictable

    def _key(self, ids: np.ndarray, at: int) -> Key:
        return int(ids[at]) if self.page == 1 else tuple(ids[at:at + self.page].tolist())

    def _aligned(self, n: int) -> int:
        return n - n % self.page

    # -- matching and insertion --------------------------------------------------------------------------

    def match(self, ids: np.ndarray) -> tuple[int, CacheNode]:
        """The longest cached prefix of ``ids`` (whole pages): its length and its last node. A match that
        ends inside a node splits it there, so the returned node covers exactly the matched tokens. Every
        node on the path counts as used now."""
        now = self.clock()
        node, pos = self.root, 0
        usable = self._aligned(len(ids))
        while pos < usable:
            child = node.children.get(self._key(ids, pos))
            if child is None:
                break
            n = self._aligned(shared_prefix_len(child.ids, ids[pos:usable]))
            if n == 0:
                break
            if n < len(child.ids):
                child = self._split(child, n)
            child.last_used = now
            node, pos = child, pos + n
            if n < len(child.ids):
                break
        self._touch_leaf(node)
        return pos, node

    def insert(self, ids: np.ndarray) -> tuple[int, CacheNode]:
        """Cache ``ids`` (whole pages): the tokens it added (the rest were cached already) and the node
        that ends it."""
        matched, node = self.match(ids)
        usable = self._aligned(len(ids))
        if matched >= usable:
            return 0, node
        leaf = CacheNode(ids[matched:usable].copy(), node, self.clock())
        node.children[self._key(ids, matched)] = leaf
        added = usable - matched
        self.total += added
        self.evictable += added
        self._touch_leaf(leaf)
        return added, leaf

    def _split(self, child: CacheNode, n: int) -> CacheNode:
        """Cut ``child`` after its first ``n`` tokens; the new upper node keeps its locks (every lock
        passing through ``child`` passes through it) and takes its place under the parent."""
        parent = child.parent
        assert parent is not None
        upper = CacheNode(child.ids[:n], parent, child.last_used)
        upper.lock_ref = child.lock_ref
        parent.children[self._key(child.ids, 0)] = upper
        child.ids = child.ids[n:]
        child.parent = upper
        upper.children[self._key(child.ids, 0)] = child
        return upper

    # -- locks -------------------------------------------------------------------------------------------

    def lock(self, node: CacheNode) -> None:
        """A request holds ``node`` and everything above it: they cannot be evicted."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable -= len(node.ids)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: CacheNode) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable += len(node.ids)
                self._touch_leaf(node)
            node = node.parent  # type: ignore[assignment]

    # -- eviction ----------------------------------------------------------------------------------------

    def _touch_leaf(self, node: CacheNode) -> None:
        """Queue ``node`` for eviction at its current last use, if it is an unlocked leaf (older queue
        entries of the node go stale and are skipped)."""
        if node.lock_ref == 0 and not node.children and node is not self.root:
            node.stamp = next(self._seq)
            heapq.heappush(self._heap, (node.last_used, node.stamp, node))

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` slots from unlocked leaves, least recently used first (fewer when
        not that many are evictable); returns the tokens freed."""
        freed = 0
        heap = self._heap
        while freed < tokens and heap:
            _, stamp, node = heapq.heappop(heap)
            if stamp != node.stamp or node.lock_ref or node.children or node.parent is None:
                continue  # used, locked or extended since it was queued, or already gone
            parent = node.parent
            del parent.children[self._key(node.ids, 0)]
            node.parent = None
            n = len(node.ids)
            freed += n
            self.total -= n
            self.evictable -= n
            self._touch_leaf(parent)
        return freed
