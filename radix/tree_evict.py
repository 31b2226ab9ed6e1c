"""TreeEvict: LRU eviction (evict, evict_count) on top of TreeCore."""

from __future__ import annotations

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

        Evicting a leaf can make its parent a leaf, which joins the LRU index (the cascade).
        """
        got = 0
        pop_oldest = self._lru.pop_oldest
        runs: list[tuple[int, int]] = []  # freed together, merged where adjacent
        while got < n_blocks:
            node = pop_oldest()
            if node is None:
                break
            got += self._remove_leaf(node, "lru", freed, pending=runs)
        if runs:
            self.pool._free_runs(runs)
        return got
