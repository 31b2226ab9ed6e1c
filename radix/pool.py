"""BlockPool: the physical KV blocks, composed of the parts that own their state.

BlockWords (refcount and owner per block), FreeExtents (free runs), Owners (owners, evictable count),
Refcounts and Allocator (for holders) and CacheOwnership (for the one tree: :meth:`attach_cache`).
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Iterable

from radixd.radix.allocator import Allocator, Runs
from radixd.radix.blockids import BlockIds
from radixd.radix.errors import InvalidRequest, RadixError
from radixd.radix.extents import FreeExtents
from radixd.radix.owners import Owners
from radixd.radix.ownership import CacheOwnership
from radixd.radix.refcounts import Refcounts
from radixd.radix.words import NULL_BLOCK, BlockWords

__all__ = ["NULL_BLOCK", "BlockPool"]

_MAX_BLOCKS = 2**31 - 1  # ids must fit the packed int32 form (BlockIds)
_PROMOTE_AT = 65536  # pools at least this large move their lists to the oldest GC generation at once


class BlockPool:
    """``num_blocks`` physical blocks of ``block_size`` tokens; block 0 is the null block. A block returns
    to the free extents exactly when its refcount drops to 0; recently freed blocks are reused first."""

    # NOTE: invariants:
    #  * refcount(b) == number of holders of b (tables + the tree), for every block b >= 1;
    #  * b lies in a free run  <=>  refcount(b) == 0, and in exactly one (no double free);
    #  * block 0 (NULL_BLOCK) is never free and never handed out;
    #  * num_free + num_evictable + num_in_use == num_usable.

    __slots__ = (
        "_alloc",
        "_free",
        "_owners",
        "_ownership",
        "_refs",
        "_tree_attached",
        "_words",
        "block_size",
        "num_blocks",
    )

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if num_blocks < 2:
            raise InvalidRequest(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        if num_blocks > _MAX_BLOCKS:
            raise InvalidRequest(f"num_blocks must be < 2**31 (ids are packed as int32), got {num_blocks}")
        if block_size < 1:
            raise InvalidRequest(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._words = BlockWords(num_blocks)
        self._free = FreeExtents()
        self._free.put(1, num_blocks - 1)  # block 1 is handed out first
        self._owners = Owners()
        self._refs = Refcounts(self._words, self._owners, self._free)
        self._alloc = Allocator(self._words, self._owners, self._free)
        self._ownership = CacheOwnership(self._words, self._owners, self._free, self._alloc)
        self._tree_attached = False
        if num_blocks >= _PROMOTE_AT:
            # The id list holds millions of ints: promote them now, at startup, rather than let the next
            # young-generation collections walk them mid-serving.
            gc.collect(1)

    # ---------------------------------------------------------------- counts
    @property
    def num_free(self) -> int:
        """Blocks in the free extents."""
        return self._free.count

    @property
    def num_in_use(self) -> int:
        """Allocated blocks that are not cached-evictable (held by a table, a lease or a pin)."""
        return self.num_blocks - 1 - self._free.count - self._owners.evictable

    @property
    def num_evictable(self) -> int:
        """Blocks held only by the cache, in entries that are neither leased nor pinned."""
        return self._owners.evictable

    @property
    def num_usable(self) -> int:
        """Blocks that can ever be handed out (all but the null block)."""
        return self.num_blocks - 1

    def refcount(self, block: int) -> int:
        return self._words.refcount(block)

    def solo(self, blocks: array[int]) -> list[bool]:
        """Whether each of ``blocks`` (packed ids) has exactly one holder, in one vectorized read."""
        return self._words.solo(blocks)

    # ------------------------------------------------------------ allocation
    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks, each with refcount 1; OutOfBlocks (nothing changed) when fewer are free."""
        return self._alloc.allocate(n)

    def allocate_ids(self, n: int) -> BlockIds:
        """:meth:`allocate`, packed."""
        return self._alloc.allocate_ids(n)

    def allocate_into(self, ids: array[int], n: int, after: int = 0) -> None:
        """:meth:`allocate`, appended to a packed id array; the blocks right after ``after`` when free."""
        self._alloc.allocate_into(ids, n, after)

    # ------------------------------------------------------------- refcounts
    def incref(self, block: int) -> None:
        """Add one holder to an allocated block."""
        self._refs.incref(block)

    def decref(self, block: int) -> bool:
        """Drop one holder; True when the block became free."""
        return self._refs.decref(block)

    def incref_all(self, blocks: Iterable[int]) -> None:
        self._refs.incref_all(blocks)

    def decref_all(self, blocks: Iterable[int]) -> int:
        """decref each block; -> how many became free."""
        return self._refs.decref_all(blocks)

    # ----------------------------------------------------------------- cache
    def attach_cache(self) -> CacheOwnership:
        """The pool's ownership side, for its one cache (a RadixTree); a second claim raises RadixError."""
        if self._tree_attached:
            raise RadixError("this BlockPool already serves a RadixTree; use one tree per pool")
        self._tree_attached = True
        return self._ownership

    # --------------------------------------------------------- introspection
    def longest_free_run(self) -> int:
        """The largest allocation that can be one run; O(free runs)."""
        return self._free.longest()

    def holds_run(self, n: int) -> bool:
        """Whether ``n`` consecutive ids are free; O(1) when one of the newest free runs holds them."""
        return self._free.holds(n)

    def refcounts(self) -> list[int]:
        """Every block's refcount, by id (O(num_blocks); for checks and tests)."""
        return self._words.refcounts()

    def owner_ids(self) -> list[int]:
        """Every block's owner id (0: none), by id (O(num_blocks); for checks and tests)."""
        return self._words.owner_ids()

    def free_extents(self) -> Runs:
        """The free runs ``[(first, length)]``, newest last (for checks and tests)."""
        return self._free.runs()

    def free_extents_problem(self) -> str | None:
        """The first broken invariant of the free extents, or None."""
        return self._free.problem(self.num_blocks)

    def split_hint(self, first: int) -> Runs | None:
        """The runs of the recent split allocation that began at ``first`` (for tests)."""
        return self._alloc.split_hint(first)

    def __repr__(self) -> str:
        return (
            f"BlockPool(num_blocks={self.num_blocks}, block_size={self.block_size}, free={self.num_free}, "
            f"evictable={self.num_evictable}, in_use={self.num_in_use})"
        )
