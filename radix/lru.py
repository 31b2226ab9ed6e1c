"""LRU index over evictable leaves, ordered by logical-clock ticks: O(1) for fresh ticks, O(log n) else."""

from __future__ import annotations

from collections import OrderedDict
from itertools import pairwise

from sortedcontainers import SortedList

from radixd.radix.node import Node


class LruIndex:
    """Evictable leaves ordered by last access (``Node.tick``, unique), never rebuilt, and the clock.
    Newest ticks go to an insertion-ordered dict (O(1)); older ones to a ``SortedList`` (O(log n))."""

    # NOTE: invariants (radixd.radix.verify checks them):
    #  * _recent's keys ascend in insertion order, and every one is <= _newest;
    #  * _aside[t] is the node with tick t for every tick in _older, and _older holds exactly _aside's keys;
    #  * a node is in exactly one of _recent / _aside iff its in_lru is set.
    # Nearly every add carries the newest tick, which the dict takes at O(1)
    # (docs/measurements/bench-radix.md).

    __slots__ = ("_aside", "_clock", "_newest", "_older", "_recent")

    def __init__(self) -> None:
        self._recent: OrderedDict[int, Node] = OrderedDict()
        self._newest = 0
        self._older = SortedList()
        self._aside: dict[int, Node] = {}
        self._clock = 0  # logical time of the last use

    def next_tick(self) -> int:
        self._clock += 1
        return self._clock

    def use(self, path: list[Node]) -> None:
        """New ticks for ``path``'s nodes, in order, taking them out of the index: a lease is about to
        lock them (a match)."""
        clock = self._clock
        for x in path:
            if x.in_lru:
                self.discard(x)
            clock += 1
            x.tick = clock
        self._clock = clock

    def touch_all(self, path: list[Node]) -> None:
        """New ticks for ``path``'s nodes, in order, moving those in the index to its newest end."""
        clock = self._clock
        for x in path:
            clock += 1
            if x.in_lru:
                self.discard(x)
                x.tick = clock
                self.add(x)
            else:
                x.tick = clock
        self._clock = clock

    def touch(self, node: Node) -> None:
        """Give ``node`` the next tick, moving it within the index."""
        self.touch_all([node])

    def __len__(self) -> int:
        return len(self._recent) + len(self._aside)

    def __bool__(self) -> bool:
        return bool(self._recent) or bool(self._aside)

    def __contains__(self, node: Node) -> bool:
        t = node.tick
        return self._recent.get(t, self._aside.get(t)) is node

    def add(self, node: Node) -> None:
        t = node.tick
        if t > self._newest:
            self._recent[t] = node
            self._newest = t
        else:
            self._aside[t] = node
            self._older.add(t)
        node.in_lru = True

    def discard(self, node: Node) -> None:
        if node.in_lru:
            t = node.tick
            if self._recent.pop(t, None) is None:
                del self._aside[t]
                self._older.remove(t)
            node.in_lru = False

    def pop_oldest(self) -> Node | None:
        """Remove and return the least recently used node; None when the index is empty."""
        aside = self._aside
        recent = self._recent
        if aside and (not recent or self._older[0] < next(iter(recent))):
            node = aside.pop(self._older.pop(0))
        elif recent:
            node = recent.popitem(last=False)[1]
        else:
            return None
        node.in_lru = False
        return node

    def oldest_first(self) -> list[Node]:
        """Snapshot in eviction order (for tests and introspection)."""
        every = {**self._recent, **self._aside}
        return [every[t] for t in sorted(every)]

    def in_order(self) -> bool:
        """Whether both tiers keep their order invariants (for the invariant checker)."""
        ticks = list(self._recent)
        recent_ok = all(a < b for a, b in pairwise(ticks)) and (not ticks or ticks[-1] <= self._newest)
        older_ok = list(self._older) == sorted(self._aside)
        return recent_ok and older_ok and not set(ticks) & self._aside.keys()

    def clear(self) -> None:
        for node in (*self._recent.values(), *self._aside.values()):
            node.in_lru = False
        self._recent.clear()
        self._older.clear()
        self._aside.clear()
