"""LRU index over evictable leaves: a persistent binary heap of logical-clock ticks, lazily pruned."""

from __future__ import annotations

from heapq import heappop, heappush

from radixd.radix.node import Node

_SLACK = 64  # stale heap entries tolerated beyond the live count before the heap is rebuilt


class LruIndex:
    """Evictable leaves ordered by last access (``Node.tick``); never rebuilt per call, O(log n) per change.

    Ticks come from the tree's logical clock and are unique among live nodes, so the tick alone is the
    heap key and a dict maps it back to the node. Removing a node only drops it from the dict (O(1));
    its heap entry goes stale and is skipped when it surfaces. Adding and popping are ``heapq`` calls
    (C code), several times cheaper than an ordered container's Python-level bookkeeping.
    """

    # NOTE: invariants (radixd.radix.verify checks them):
    #  * _nodes[t] is the node with tick t, for every indexed node, and that node has in_lru set;
    #  * _heap is a binary heap holding every key of _nodes at least once (and stale ticks besides);
    #  * stale entries appear only on discard, which rebuilds the heap once they outnumber the live ones
    #    (+ _SLACK): they cost O(1) amortised per operation and the heap stays within twice its peak size.

    __slots__ = ("_heap", "_nodes")

    def __init__(self) -> None:
        self._heap: list[int] = []
        self._nodes: dict[int, Node] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def add(self, node: Node) -> None:
        self._nodes[node.tick] = node
        heappush(self._heap, node.tick)
        node.in_lru = True

    def discard(self, node: Node) -> None:
        if node.in_lru:
            del self._nodes[node.tick]
            node.in_lru = False
            if len(self._heap) > 2 * len(self._nodes) + _SLACK:
                self._heap = sorted(self._nodes)  # a sorted list is a valid heap

    def pop_oldest(self) -> Node:
        """Remove and return the least recently used node (the index must not be empty)."""
        heap = self._heap
        nodes = self._nodes
        while True:
            node = nodes.pop(heappop(heap), None)
            if node is not None:
                node.in_lru = False
                return node

    def oldest_first(self) -> list[Node]:
        """Snapshot in eviction order (for tests and introspection; O(n log n))."""
        return [self._nodes[t] for t in sorted(self._nodes)]

    def clear(self) -> None:
        for node in self._nodes.values():
            node.in_lru = False
        self._heap.clear()
        self._nodes.clear()
