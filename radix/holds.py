"""Holds: the locks on cached paths (leases and pins) that keep their nodes from eviction."""

from __future__ import annotations

from radixd.radix.lru import LruIndex
from radixd.radix.node import Node
from radixd.radix.ownership import CacheOwnership


class Holds:
    """Every node's ``hold`` (the leases and pins whose path runs through it) and the count of leases
    that lock a path. A node whose hold goes from 0 to 1 leaves the LRU index, and its solo blocks stop
    counting as evictable in the pool; back at 0 they count again, and a leaf rejoins the index."""

    # NOTE: a parent's hold >= each child's, so hold == 0 means the whole subtree may be evicted.

    def __init__(self, ownership: CacheOwnership, lru: LruIndex) -> None:
        self._ownership = ownership
        self._lru = lru
        self.num_leases = 0  # leases that lock a path (a lease of an empty match locks none yet)

    def lease(self, node: Node) -> None:
        """A new lease locks ``node``'s path (:meth:`lock`, counted in ``num_leases``)."""
        self._lock_up_to(node, None)
        self.num_leases += 1

    def unlease(self, node: Node) -> None:
        """A lease that locked ``node``'s path is released."""
        self.num_leases -= 1
        self.unlock(node)

    def lock(self, node: Node) -> None:
        """One more hold on ``node`` and its ancestors: none of them is evictable while it lasts."""
        self._lock_up_to(node, None)

    def move_lock(self, old: Node, new: Node) -> None:
        """Move one hold from ``old``'s path to ``new``'s (a lease following its owner's inserts). When
        ``old`` is an ancestor of ``new`` only the nodes below it change (cost: the nodes added)."""
        if not self._lock_up_to(new, old):
            self.unlock(old)

    def _lock_up_to(self, node: Node, stop: Node | None) -> bool:
        """One more hold on ``node`` and its ancestors below ``stop``; -> whether the walk met ``stop``."""
        ownership = self._ownership
        x: Node | None = node
        while x is not None and x.parent is not None:
            if x is stop:
                return True
            x.hold += 1
            if x.hold == 1:
                ownership.held(x)
                if x.in_lru:
                    self._lru.discard(x)
            x = x.parent
        return False

    def unlock(self, node: Node) -> None:
        """Undo one :meth:`lock`; leaves whose last hold went become evictable again."""
        ownership = self._ownership
        x: Node | None = node
        while x is not None and x.parent is not None:
            x.hold -= 1
            if x.hold == 0:
                ownership.unheld(x)
                if not x.children:
                    self._lru.add(x)
            x = x.parent
