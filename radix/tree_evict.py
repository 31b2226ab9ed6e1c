"""TreeEvict: LRU eviction (evict, evict_count) on top of TreeCore."""

from __future__ import annotations

from typing import cast

from radixd.radix.blockids import ID_BYTES
from radixd.radix.node import Node
from radixd.radix.tree_core import TreeCore


class TreeEvict(TreeCore):
    """LRU eviction of :class:`radixd.radix.RadixTree` (use that class)."""

    def evictable_blocks(self) -> int:
        """Blocks that evicting every unlocked, unpinned entry would free (exact, O(1))."""
        return self.pool._evictable

    def evict(self, n_blocks: int) -> list[int]:
        """Free at least ``n_blocks`` blocks if possible, least recently used leaves first.

        Returns the blocks that became free (fewer when not enough is evictable). O(log n) per node.
        """
        freed: list[int] = []
        self._evict_lru(n_blocks, freed)
        return freed

    def evict_count(self, n_blocks: int) -> int:
        """Like :meth:`evict` but returns only how many blocks became free.

        For callers that size the free pool and never look at the ids (a scheduler making room): it
        skips building the list, which at block size 1 is a thousand ids per evicted request.
        """
        return self._evict_lru(n_blocks, None)

    def _evict_lru(self, n_blocks: int, freed: list[int] | None) -> int:
        """Remove least recently used leaves until ``n_blocks`` blocks are free or none is evictable.

        The common leaf (its blocks held by the tree alone, as the runs they were adopted in, and no
        listener to tell) is removed here without a call per leaf; any other goes through _remove_leaf.
        """
        got = 0
        lru = self._lru
        pool = self.pool
        sb = pool._state_bytes
        zeros = pool._zeros_view
        put = pool._free.put
        owners = pool._owners
        plain = self.listener is None
        removed = dropped = 0
        while got < n_blocks and lru:
            node = lru.pop_oldest()
            runs = node.runs
            n = node.n_solo
            if not plain or runs is None or n != bytes.__len__(node.blocks) // ID_BYTES:
                got += self._remove_leaf(node, "lru", freed)
                continue
            # NOTE: the same steps as _remove_leaf for an LRU leaf (no children, hold == 0, n_solo == n).
            parent = cast(Node, node.parent)  # an LRU leaf is never the root
            self._unlink(parent, node)
            pool._evictable -= n
            for a, k in runs:
                sb[a * 8 : (a + k) * 8] = zeros[: k * 8]
                put(a, k)
            if freed is not None:
                freed += node.blocks.tolist()
            node.alive = False
            node.n_solo = 0
            if owners.pop(node.oid, None) is not None:
                pool._free_oids.append(node.oid)
            node.oid = 0
            removed += 1
            dropped += n
            got += n
            if not parent.children:
                if parent.parent is not None:
                    if parent.hold == 0:
                        lru.add(parent)
                else:
                    self._drop_root(parent)
        self._nodes -= removed
        self._cached_blocks -= dropped
        self._evicted["lru"] += dropped
        return got
