"""BlockPool: the physical KV blocks, their reference counts and the free list."""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Protocol

from radixd.radix.errors import DoubleFree, InvalidRequest, OutOfBlocks
from radixd.radix.extents import FreeExtents

NULL_BLOCK = 0
_PROMOTE_AT = 65536  # pools at least this large move their lists to the oldest GC generation at once
"""Block 0 is never handed out: padded block-table entries point at it."""


def block_runs(blocks: list[int], ids: list[int], max_runs: int = 8) -> list[tuple[int, int]] | None:
    """``blocks`` as at most ``max_runs`` runs of consecutive ascending ids: ``[(first_id, length), ...]``.

    Allocation hands out mostly contiguous ids, so bulk updates (refcounts, ownership) can use one
    C-level slice store per run instead of a Python step per block. Each run's end is found with
    O(log n) probes and verified with one slice comparison; anything more fragmented returns None (the
    caller then takes its per-block path), so a miss costs only a few probes. ``ids`` is the pool's
    ``list(range(num_blocks))``: comparing against a slice of it creates no int objects.
    """
    n = len(blocks)
    if n < 2:
        return None
    runs: list[tuple[int, int]] = []
    i = 0
    while len(runs) < max_runs:
        a = blocks[i]
        rest = n - i
        if blocks[-1] == a + rest - 1 and blocks[i:] == ids[a : a + rest]:
            runs.append((a, rest))
            return runs
        lo, hi = 1, rest  # the probe blocks[i + m - 1] == a + m - 1 holds for m = lo, fails for m = hi
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if blocks[i + mid - 1] == a + mid - 1:
                lo = mid
            else:
                hi = mid
        if blocks[i : i + lo] != ids[a : a + lo]:
            return None  # the probes were fooled by a non-monotone list
        runs.append((a, lo))
        i += lo
    return None


class BlockOwner(Protocol):
    """What the pool needs to know about the cache entry (a tree node) that holds a block.

    ``n_solo`` counts the owner's blocks that nobody but the cache holds (refcount 1); ``hold`` is the
    owner's lease + pin count (0 means the cache may evict it).
    """

    n_solo: int
    hold: int


class BlockPool:
    """``num_blocks`` physical blocks of ``block_size`` tokens; block 0 is the null block.

    Free blocks are kept as maximal runs of consecutive ids (:class:`FreeExtents`): ``allocate(n)`` costs
    O(runs) Python steps whatever ``n`` is, and a freed block costs O(1); recently freed blocks are reused
    first, which is kind to caches. Each handed-out block carries a reference count; a block returns to
    the free extents exactly when its count drops to 0.

    The radix tree registers itself as the *owner* of the blocks it caches, which lets the pool keep an
    exact, O(1) count of blocks that are cached and evictable (held by the cache alone, in an entry that
    is neither leased nor pinned): ``num_evictable``.
    """

    # NOTE: invariants
    #  * refcount(b) == number of holders of b (tables + the tree), for every block b >= 1;
    #  * b lies in a free run  <=>  refcount(b) == 0, and in exactly one (no double free);
    #  * block 0 (NULL_BLOCK) is never on the free list and never handed out;
    #  * _evictable == #{b : owner(b) is not None and owner(b).hold == 0 and refcount(b) == 1}.

    __slots__ = ("_evictable", "_free", "_ids", "_owner", "_rc", "_tree_attached", "block_size", "num_blocks")

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if num_blocks < 2:
            raise InvalidRequest(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        if block_size < 1:
            raise InvalidRequest(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._rc: list[int] = [0] * num_blocks
        self._owner: list[BlockOwner | None] = [None] * num_blocks
        # Every block id as an int object: allocations hand out slices of it (no new ints) and run
        # checks compare against it (identity makes them cheap).
        self._ids: list[int] = list(range(num_blocks))
        self._free = FreeExtents()
        self._free.put(1, num_blocks - 1)  # block 1 is handed out first
        self._evictable = 0
        self._tree_attached = False  # at most one RadixTree per pool
        if num_blocks >= _PROMOTE_AT:
            # The per-block lists above hold millions of entries. Left in the young GC generation, the
            # next collections would walk them: a pause of tens of ms in the middle of serving. Promote
            # them now, once, at construction (startup) time.
            gc.collect(1)

    # ------------------------------------------------------------------ counts
    @property
    def num_usable(self) -> int:
        """Blocks that can ever be handed out (all but the null block)."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return self._free.count

    @property
    def num_evictable(self) -> int:
        """Blocks held only by the cache, in entries that are neither leased nor pinned."""
        return self._evictable

    @property
    def num_in_use(self) -> int:
        """Allocated blocks that are not cached-evictable (held by a table, a lease or a pin)."""
        return self.num_blocks - 1 - self._free.count - self._evictable

    def refcount(self, block: int) -> int:
        self._check_id(block)
        return self._rc[block]

    # ------------------------------------------------------------ allocation
    def allocate(self, n: int) -> list[int]:
        """Hand out ``n`` free blocks, each with refcount 1 (the caller's reference).

        Raises OutOfBlocks (and changes nothing) when fewer than ``n`` blocks are free.
        """
        if n <= 0:
            if n == 0:
                return []
            raise InvalidRequest(f"cannot allocate a negative number of blocks ({n})")
        free = self._free
        if n > free.count:
            raise OutOfBlocks(n, free.count, self._evictable)
        rc = self._rc
        ids = self._ids
        out: list[int] = []
        for a, k in free.take(n):  # one C-level slice copy and store per run, no per-block step
            out += ids[a : a + k]
            rc[a : a + k] = [1] * k
        return out

    def incref(self, block: int) -> None:
        """Add one holder to an allocated block."""
        rc = self._rc
        if not 0 < block < self.num_blocks or rc[block] == 0:
            self._bad_incref(block)
        c = rc[block] + 1
        rc[block] = c
        if c == 2:
            owner = self._owner[block]
            if owner is not None:
                owner.n_solo -= 1
                if owner.hold == 0:
                    self._evictable -= 1

    def decref(self, block: int) -> bool:
        """Drop one holder; the block returns to the free list when none is left. Returns True if freed."""
        rc = self._rc
        if not 0 < block < self.num_blocks or rc[block] == 0:
            self._bad_decref(block)
        c = rc[block] - 1
        rc[block] = c
        if c == 0:
            self._free.put(block, 1)
            return True
        if c == 1:
            owner = self._owner[block]
            if owner is not None:
                owner.n_solo += 1
                if owner.hold == 0:
                    self._evictable += 1
        return False

    def incref_all(self, blocks: Iterable[int]) -> None:
        """incref each block (inlined: this runs per block of every shared prefix)."""
        rc = self._rc
        owner = self._owner
        nb = self.num_blocks
        for b in blocks:
            if not 0 < b < nb or rc[b] == 0:
                self._bad_incref(b)
            c = rc[b] + 1
            rc[b] = c
            if c == 2:
                o = owner[b]
                if o is not None:
                    o.n_solo -= 1
                    if o.hold == 0:
                        self._evictable -= 1

    def decref_all(self, blocks: Iterable[int]) -> int:
        """decref each block (inlined: this runs per block of every finished request); returns #freed."""
        rc = self._rc
        owner = self._owner
        free = self._free
        nb = self.num_blocks
        freed = 0
        for b in blocks:
            if not 0 < b < nb or rc[b] == 0:
                self._bad_decref(b)
            c = rc[b] - 1
            rc[b] = c
            if c == 0:
                free.put(b, 1)
                freed += 1
            elif c == 1:
                o = owner[b]
                if o is not None:
                    o.n_solo += 1
                    if o.hold == 0:
                        self._evictable += 1
        return freed

    # ------------------------------------------------------- cache ownership
    # Used by RadixTree only: it marks the blocks it stores so refcount changes made by tables keep
    # the evictable count exact without the tree scanning anything.
    def _set_owner(self, block: int, owner: BlockOwner | None) -> None:
        self._owner[block] = owner

    # ------------------------------------------------------------ validation
    def _check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise InvalidRequest(f"block id {block} is out of range [0, {self.num_blocks})")

    def _bad_incref(self, block: int) -> None:
        self._check_id(block)
        if block == NULL_BLOCK:
            raise InvalidRequest("block 0 is the null block; it is never allocated or shared")
        raise InvalidRequest(f"block {block} is free; only allocated blocks can gain holders (incref)")

    def _bad_decref(self, block: int) -> None:
        self._check_id(block)
        if block == NULL_BLOCK:
            raise InvalidRequest("block 0 is the null block; it is never allocated or released")
        raise DoubleFree(f"block {block} is already free: one of its holders released it twice")

    def __repr__(self) -> str:
        return (
            f"BlockPool(num_blocks={self.num_blocks}, block_size={self.block_size}, free={self.num_free}, "
            f"evictable={self._evictable}, in_use={self.num_in_use})"
        )
