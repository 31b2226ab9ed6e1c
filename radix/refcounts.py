"""Refcounts: holders (tables, forks) gaining and dropping references on allocated blocks.

A block is freed exactly when its count drops to 0; an owned block's owner ``n_solo`` and the evictable
count follow its changes between 1 and 2 holders.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixd.radix.extents import FreeExtents
from radixd.radix.owners import Owners
from radixd.radix.words import OWNER_SHIFT, RC_MASK, BlockWords


class Refcounts:
    """incref / decref, one block or many, over the pool's words, owners and free extents."""

    __slots__ = ("_free", "_owners", "_words")

    def __init__(self, words: BlockWords, owners: Owners, free: FreeExtents) -> None:
        self._words = words
        self._owners = owners
        self._free = free

    def incref(self, block: int) -> None:
        """Add one holder to an allocated block."""
        words = self._words
        w = int(words.state[block]) if 0 < block < words.num_blocks else 0
        if not w & RC_MASK:
            words.bad_incref(block)
        words.state[block] = w + 1
        if w & RC_MASK == 1 and w >> OWNER_SHIFT:
            owner = self._owners.by_id[w >> OWNER_SHIFT]
            owner.n_solo -= 1
            if owner.hold == 0:
                self._owners.evictable -= 1

    def decref(self, block: int) -> bool:
        """Drop one holder; the block becomes free when none is left. Returns True if freed."""
        words = self._words
        w = int(words.state[block]) if 0 < block < words.num_blocks else 0
        if w & RC_MASK == 1:
            words.state[block] = 0  # free blocks have no owner
            self._free.put(block, 1)
            return True
        if not w & RC_MASK:
            words.bad_decref(block)
        words.state[block] = w - 1
        if w & RC_MASK == 2 and w >> OWNER_SHIFT:
            owner = self._owners.by_id[w >> OWNER_SHIFT]
            owner.n_solo += 1
            if owner.hold == 0:
                self._owners.evictable += 1
        return False

    def incref_all(self, blocks: Iterable[int]) -> None:
        """:meth:`incref` each block (inlined: this runs per block of every shared prefix)."""
        words, owners = self._words, self._owners
        st, by_id, nb = words.state, owners.by_id, words.num_blocks
        for b in blocks:
            w = int(st[b]) if 0 < b < nb else 0
            if not w & RC_MASK:
                words.bad_incref(b)
            st[b] = w + 1
            if w & RC_MASK == 1 and w >> OWNER_SHIFT:
                o = by_id[w >> OWNER_SHIFT]
                o.n_solo -= 1
                if o.hold == 0:
                    owners.evictable -= 1

    def decref_all(self, blocks: Iterable[int]) -> int:
        """:meth:`decref` each block (inlined: this runs per block of every finished request); -> #freed."""
        words, owners, free = self._words, self._owners, self._free
        st, by_id, nb = words.state, owners.by_id, words.num_blocks
        freed = 0
        for b in blocks:
            w = int(st[b]) if 0 < b < nb else 0
            c = w & RC_MASK
            if c == 0:
                words.bad_decref(b)
            if c == 1:
                st[b] = 0  # free blocks have no owner
                free.put(b, 1)
                freed += 1
                continue
            st[b] = w - 1
            if c == 2 and w >> OWNER_SHIFT:
                o = by_id[w >> OWNER_SHIFT]
                o.n_solo += 1
                if o.hold == 0:
                    owners.evictable += 1
        return freed
