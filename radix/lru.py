"""LRU index over evictable leaves: a persistent SortedList keyed by a logical clock."""

from __future__ import annotations

from sortedcontainers import SortedList

from radixd.radix.node import Node


class LruIndex:
    """Evictable leaves ordered by last access (``Node.tick``); never rebuilt, O(log n) per change.

    Ticks come from the tree's logical clock and are unique among live nodes, so the tick alone is
    the sort key and a dict maps it back to the node.
    """

    __slots__ = ("_nodes", "_ticks")

    def __init__(self) -> None:
        self._ticks = SortedList()
        self._nodes: dict[int, Node] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def add(self, node: Node) -> None:
        self._ticks.add(node.tick)
        self._nodes[node.tick] = node
        node.in_lru = True

    def discard(self, node: Node) -> None:
        if node.in_lru:
            self._ticks.remove(node.tick)
            del self._nodes[node.tick]
            node.in_lru = False

    def pop_oldest(self) -> Node:
        tick = self._ticks.pop(0)
        node = self._nodes.pop(tick)
        node.in_lru = False
        return node

    def oldest_first(self) -> list[Node]:
        """Snapshot in eviction order (for tests and introspection; O(n))."""
        return [self._nodes[t] for t in self._ticks]

    def clear(self) -> None:
        for node in self._nodes.values():
            node.in_lru = False
        self._ticks.clear()
        self._nodes.clear()
