"""BlockPool: the physical KV blocks, their reference counts, owners and free extents."""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from radixd.radix.blockids import ID_BYTES, BlockIds
from radixd.radix.errors import DoubleFree, InvalidRequest, OutOfBlocks
from radixd.radix.extents import FreeExtents

NULL_BLOCK = 0
"""Block 0 is never handed out: padded block-table entries point at it."""
RC_MASK = 0xFFFFFFFF
"""A block's state word: ``owner_id << OWNER_SHIFT | refcount``."""
OWNER_SHIFT = 32
_MAX_BLOCKS = 2**31 - 1  # ids must fit the packed int32 form (BlockIds)
_SPLIT_HINTS = 16  # split allocations whose runs the pool remembers (newest first out)
_PROMOTE_AT = 65536  # pools at least this large move their lists to the oldest GC generation at once


class BlockOwner(Protocol):
    """What the pool needs to know about the cache entry (a tree node) that holds a block.

    ``n_solo`` counts the owner's blocks that nobody but the cache holds (refcount 1); ``hold`` is the
    owner's lease + pin count (0 means the cache may evict it); ``oid`` is the id the pool gave it.
    """

    n_solo: int
    hold: int
    oid: int


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
    #  * block 0 (NULL_BLOCK) is never free and never handed out;
    #  * _evictable == #{b : owner(b) is not None and owner(b).hold == 0 and refcount(b) == 1};
    #  * owner id of b (_state[b] >> 32) is 0 or a key of _owners (registered while it holds blocks).

    __slots__ = (
        "_evictable",
        "_free",
        "_free_oids",
        "_id_bytes",
        "_ids",
        "_next_oid",
        "_ones_bytes",
        "_ones_view",
        "_owners",
        "_split_hints",
        "_state",
        "_state_bytes",
        "_tree_attached",
        "_zeros_view",
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
        # One int64 word per block: owner id (0 = none) in the high 32 bits, refcount in the low 32.
        # The tree moves whole runs of blocks (a thousand per request at block size 1): adopting a
        # freshly allocated run is one memcmp ("refcount 1, no owner" everywhere) plus one slice store,
        # and freeing it is one slice store, whatever the run's length. _owners maps an id to its owner.
        self._state: npt.NDArray[np.int64] = np.zeros(num_blocks, dtype=np.int64)
        self._owners: dict[int, BlockOwner] = {}
        # State words of "refcount 1, no owner", as bytes, for that memcmp.
        self._ones_bytes = np.ones(num_blocks, dtype=np.int64).tobytes()
        # Whole runs of state words are written through these byte views: a memcpy costs a fraction of
        # numpy's slice assignment, whose per-call overhead dominates at these sizes.
        self._ones_view = memoryview(self._ones_bytes)
        self._zeros_view = memoryview(bytes(8 * num_blocks))
        self._state_bytes = memoryview(self._state.data).cast("B")  # NOTE: _state is never resized
        self._next_oid = 1
        self._free_oids: list[int] = []
        # Every block id as an int object: allocations hand out slices of it (no new ints) and run
        # checks compare against it (identity makes them cheap).
        self._ids: list[int] = list(range(num_blocks))
        # The same ids packed (see BlockIds): packed allocations are slices of it, and one memcmp
        # against it proves that packed ids form a run.
        self._id_bytes = np.arange(num_blocks, dtype=np.int32).tobytes()
        self._free = FreeExtents()
        self._split_hints: dict[int, list[tuple[int, int]]] = {}  # first id -> runs of a split allocation
        self._free.put(1, num_blocks - 1)  # block 1 is handed out first
        self._evictable = 0
        self._tree_attached = False  # at most one RadixTree per pool
        if num_blocks >= _PROMOTE_AT:
            # The id list above holds millions of entries. Left in the young GC generation, the
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
        return int(self._state[block]) & RC_MASK

    # ------------------------------------------------------------ allocation
    def allocate(self, n: int) -> list[int]:
        """Hand out ``n`` free blocks, each with refcount 1 (the caller's reference).

        Raises OutOfBlocks (and changes nothing) when fewer than ``n`` blocks are free.
        """
        ids = self._ids
        a = self._take_run(n)
        if a:
            return ids[a : a + n]  # no new int objects: a slice of the shared id list
        out: list[int] = []
        for a, k in self._take_split(n):
            out += ids[a : a + k]
        return out

    def allocate_ids(self, n: int) -> BlockIds:
        """:meth:`allocate`, packed: the same blocks and references, as :class:`BlockIds`.

        For callers that keep block tables packed (or as arrays): a run of fresh blocks is then one slice
        of the pool's packed ids, whatever its length, and the tree recognises it as a run with one memcmp.
        """
        idb = self._id_bytes
        a = self._take_run(n)
        if a:
            return BlockIds(idb[a * ID_BYTES : (a + n) * ID_BYTES])
        return BlockIds(b"".join([idb[a * ID_BYTES : (a + k) * ID_BYTES] for a, k in self._take_split(n)]))

    def _take_run(self, n: int) -> int:
        """The common case of an allocation: ``n`` blocks from one free run, each at refcount 1 and no
        owner. Returns the run's first block, or 0 (never a usable block) when no single run fits."""
        if 0 < n <= self._free.count:
            a = self._free.take_fit(n)
            if a:
                self._state_bytes[a * 8 : (a + n) * 8] = self._ones_view[: n * 8]
            return a
        return 0

    def _take_split(self, n: int) -> list[tuple[int, int]]:
        """Remove ``n`` blocks from the free extents over several runs, newest first (for when no run
        that :meth:`FreeExtents.take_fit` looks at holds them all), each block at refcount 1, no owner."""
        if n <= 0:
            if n == 0:
                return []
            raise InvalidRequest(f"cannot allocate a negative number of blocks ({n})")
        free = self._free
        if n > free.count:
            raise OutOfBlocks(n, free.count, self._evictable)
        sb = self._state_bytes
        ones = self._ones_view
        runs = free.take(n)
        for a, k in runs:  # one memcpy per run, no per-block step
            sb[a * 8 : (a + k) * 8] = ones[: k * 8]
        # Remember how this allocation was split, so the tree can adopt it run by run after a cheap
        # check (spells_runs) instead of searching the ids for run boundaries.
        hints = self._split_hints
        hints[runs[0][0]] = runs
        if len(hints) > _SPLIT_HINTS:
            del hints[next(iter(hints))]
        return runs

    def _free_runs(self, runs: list[tuple[int, int]]) -> None:
        """Free whole runs ``(first, length)`` of blocks nobody holds any more (for the tree, which held
        them alone): their state words become 0 and the runs go back to the free extents.

        A run that continues the one before it in ``runs`` is merged with it first: blocks allocated
        one after another (a batch of requests) tend to be evicted together, in the same order, and each
        merged run costs one store and one extent merge instead of one per run. The order is kept, not
        sorted: it is the order in which the free extents hand runs out again (newest first), and
        sorting it made W2 split a fifth more of its allocations.
        """
        sb = self._state_bytes
        zeros = self._zeros_view
        put = self._free.put
        s = e = 0  # the group being merged: blocks [s, e)
        for a, k in [*runs, (NULL_BLOCK, 0)]:  # the null block (never freed) ends the last group
            if a != e:
                if e:
                    sb[s * 8 : e * 8] = zeros[: (e - s) * 8]
                    put(s, e - s)
                s = a
            e = a + k

    def incref(self, block: int) -> None:
        """Add one holder to an allocated block."""
        if not 0 < block < self.num_blocks:
            self._bad_incref(block)
        st = self._state
        w = int(st[block])
        c = w & RC_MASK
        if c == 0:
            self._bad_incref(block)
        st[block] = w + 1
        if c == 1 and w >> OWNER_SHIFT:
            owner = self._owners[w >> OWNER_SHIFT]
            owner.n_solo -= 1
            if owner.hold == 0:
                self._evictable -= 1

    def decref(self, block: int) -> bool:
        """Drop one holder; the block becomes free when none is left. Returns True if freed."""
        if not 0 < block < self.num_blocks:
            self._bad_decref(block)
        st = self._state
        w = int(st[block])
        c = w & RC_MASK
        if c == 0:
            self._bad_decref(block)
        if c == 1:
            st[block] = 0  # free blocks have no owner
            self._free.put(block, 1)
            return True
        st[block] = w - 1
        if c == 2 and w >> OWNER_SHIFT:
            owner = self._owners[w >> OWNER_SHIFT]
            owner.n_solo += 1
            if owner.hold == 0:
                self._evictable += 1
        return False

    def incref_all(self, blocks: Iterable[int]) -> None:
        """incref each block (inlined: this runs per block of every shared prefix)."""
        st = self._state
        owners = self._owners
        nb = self.num_blocks
        for b in blocks:
            w = int(st[b]) if 0 < b < nb else 0
            if not w & RC_MASK:
                self._bad_incref(b)
            st[b] = w + 1
            if w & RC_MASK == 1 and w >> OWNER_SHIFT:
                o = owners[w >> OWNER_SHIFT]
                o.n_solo -= 1
                if o.hold == 0:
                    self._evictable -= 1

    def decref_all(self, blocks: Iterable[int]) -> int:
        """decref each block (inlined: this runs per block of every finished request); returns #freed."""
        st = self._state
        owners = self._owners
        free = self._free
        nb = self.num_blocks
        freed = 0
        for b in blocks:
            w = int(st[b]) if 0 < b < nb else 0
            c = w & RC_MASK
            if c == 0:
                self._bad_decref(b)
            if c == 1:
                st[b] = 0  # free blocks have no owner
                free.put(b, 1)
                freed += 1
                continue
            st[b] = w - 1
            if c == 2 and w >> OWNER_SHIFT:
                o = owners[w >> OWNER_SHIFT]
                o.n_solo += 1
                if o.hold == 0:
                    self._evictable += 1
        return freed

    # ------------------------------------------------------- cache ownership
    # Used by RadixTree only: it marks the blocks it stores so refcount changes made by tables keep
    # the evictable count exact without the tree scanning anything.
    def _register(self, owner: BlockOwner) -> int:
        """Give ``owner`` an id (stored in the high bits of each of its blocks' state words).

        Ids of dropped owners are reused, so they stay below the number of live nodes + 1 and always
        fit the 31 bits available (a fresh id per node would overflow after 2**31 inserts).
        """
        free_ids = self._free_oids
        if free_ids:
            oid = free_ids.pop()
        else:
            oid = self._next_oid
            self._next_oid = oid + 1
        self._owners[oid] = owner
        owner.oid = oid
        return oid

    def _unregister(self, owner: BlockOwner) -> None:
        if self._owners.pop(owner.oid, None) is not None:
            self._free_oids.append(owner.oid)
        owner.oid = 0

    def owner_of(self, block: int) -> BlockOwner | None:
        """The cache entry holding ``block`` (None when the cache does not hold it)."""
        self._check_id(block)
        oid = int(self._state[block]) >> OWNER_SHIFT
        return self._owners[oid] if oid else None

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
