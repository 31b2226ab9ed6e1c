"""BlockPool: the physical KV blocks, their reference counts, owners and free extents."""

from __future__ import annotations

import gc
import sys
from array import array
from collections.abc import Iterable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from radixd.radix.blockids import ID_BYTES, BlockIds, disjoint_within, packed_runs, spells_runs, unpack_id
from radixd.radix.errors import DoubleFree, InvalidRequest, OutOfBlocks, RadixError
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
        "_id_view",
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
        self._id_view = memoryview(self._id_bytes)
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

    def solo(self, blocks: array[int]) -> list[bool]:
        """Whether each of ``blocks`` (packed ids) has exactly one holder: one vectorized read for a
        whole decode batch instead of a :meth:`refcount` call per table."""
        if not blocks:
            return []
        ids = np.frombuffer(blocks, dtype=np.int32)
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks:
            bad = next(b for b in blocks if not 0 <= b < self.num_blocks)
            self._check_id(bad)
        return ((self._state[ids] & RC_MASK) == 1).tolist()  # type: ignore[no-any-return]

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

        For callers that keep block tables packed (or as arrays; :meth:`allocate_into` appends to one
        directly): the tree recognises a run of fresh ids with one memcmp.
        """
        ids: array[int] = array("i")
        self.allocate_into(ids, n)
        return BlockIds(ids)

    def allocate_into(self, ids: array[int], n: int, after: int = 0) -> None:
        """:meth:`allocate_ids`, appended to a packed id array (a block table's) as they are taken: the
        ids are copied once, from the pool's packed ids into ``ids``, with no object in between.

        ``after``: the block the new ones follow in the table (0: none). The blocks right after it are
        taken when they are free, and a single block that cannot follow it starts where the table has
        room to grow (:meth:`FreeExtents.take_room`), so that a table's blocks lie in long runs of
        consecutive ids, which the CPU attention reads as streams (bench/block_layout.py)."""
        view = self._id_view
        a = self._take_run(n, after)
        if a:
            ids.frombytes(view[a * ID_BYTES : (a + n) * ID_BYTES])
            return
        for a, k in self._take_split(n):
            ids.frombytes(view[a * ID_BYTES : (a + k) * ID_BYTES])

    def _take_run(self, n: int, after: int = 0) -> int:
        """The common case of an allocation: ``n`` blocks from one free run, each at refcount 1 and no
        owner (``after``: see :meth:`allocate_into`). Returns the run's first block, or 0 (never a
        usable block) when no single run fits."""
        if 0 < n <= self._free.count:
            free = self._free
            if after and free.take_at(after + 1, n):
                a = after + 1
            elif after and n == 1:
                a = free.take_room()
            else:  # best fit among the newest runs, else among all before splitting
                a = free.take_fit(n) or free.take_fit(n, scan=free.num_runs)
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
    # For the radix tree only: it marks the blocks it stores with their owner (a node), so refcount
    # changes made by tables keep the evictable count exact without the tree scanning anything. Every
    # change of a block's owner or of an owner's hold goes through these methods.
    def attach_cache(self) -> None:
        """Claim the pool for one cache (a RadixTree); a second claim raises RadixError."""
        if self._tree_attached:
            raise RadixError("this BlockPool already serves a RadixTree; use one tree per pool")
        self._tree_attached = True

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

    def owner_held(self, owner: BlockOwner) -> None:
        """``owner.hold`` went from 0 to 1: its solo blocks stop being evictable."""
        self._evictable -= owner.n_solo

    def owner_unheld(self, owner: BlockOwner) -> None:
        """``owner.hold`` went back to 0: its solo blocks are evictable again."""
        self._evictable += owner.n_solo

    def _runs_of(self, blocks: bytes) -> list[tuple[int, int]] | None:
        """``blocks`` (packed) as a few runs of consecutive ids, or None (scattered, or invalid ids).

        One run is proven by one memcmp; a split allocation of this pool by the runs it remembers for it
        (runs of one allocation are disjoint); anything else by one vectorised pass.
        """
        if not bytes.__len__(blocks):
            return []
        a: int = unpack_id(blocks)[0]
        idb = self._id_bytes
        if a >= 1 and idb.startswith(blocks, a * ID_BYTES):  # one run (the common case)
            return [(a, bytes.__len__(blocks) // ID_BYTES)]
        hint = self._split_hints.pop(a, None)
        if hint is not None and spells_runs(blocks, idb, hint):
            return hint
        runs = packed_runs(blocks, idb)
        return runs if runs is not None and disjoint_within(runs, self.num_blocks) else None

    def adopt(self, owner: BlockOwner, blocks: BlockIds, donate: bool) -> list[tuple[int, int]] | None:
        """Make ``owner`` (new, holding nothing yet) the owner of ``blocks``; sets ``owner.n_solo``.

        The owner takes one reference per block: the caller's own with ``donate`` (the count stays),
        else a new one. When the blocks are a few runs of freshly allocated ids (refcount 1, no owner:
        the common case) their words are written one memcpy per run, and the runs are returned, for the
        owner to keep (:meth:`disown` then frees them run by run). Otherwise the blocks are adopted one by
        one, validated as they go, and None is returned; on a bad block everything is undone and
        InvalidRequest (or DoubleFree) is raised. The new solo blocks count as evictable (hold 0).
        """
        runs = self._runs_of(blocks)
        ones = self._ones_bytes
        sb = self._state_bytes
        if runs is None:
            fresh = False
        elif len(runs) == 1:  # the common case, without a generator
            a, k = runs[0]
            fresh = ones.startswith(sb[a * 8 : (a + k) * 8])
        else:
            fresh = all(ones.startswith(sb[a * 8 : (a + k) * 8]) for a, k in runs)
        oid = self._register(owner)
        if runs is not None and fresh:
            # Donated blocks keep the caller's reference; otherwise the caller keeps its own too: counts
            # are 2 and nobody is solo yet.
            word = ((oid << OWNER_SHIFT) | (1 if donate else 2)).to_bytes(8, sys.byteorder)
            for a, k in runs:
                sb[a * 8 : (a + k) * 8] = word * k
            solo = bytes.__len__(blocks) // ID_BYTES if donate else 0
        else:
            runs = None
            solo = self._adopt_each(owner, blocks.tolist(), donate)
        owner.n_solo = solo
        self._evictable += solo
        return runs

    def _adopt_each(self, owner: BlockOwner, ids: list[int], donate: bool) -> int:
        """Adopt ``ids`` one by one (blocks shared with tables, or scattered ids); -> solo count."""
        st = self._state
        nblocks = self.num_blocks
        step = 0 if donate else 1  # donated blocks keep the caller's reference; others gain one
        high = owner.oid << OWNER_SHIFT
        solo = 0
        for i, b in enumerate(ids):
            w = int(st[b]) if 0 < b < nblocks else 0
            if w & RC_MASK == 0 or w >> OWNER_SHIFT:
                for a in ids[:i]:
                    st[a] = (int(st[a]) & RC_MASK) - step
                self._unregister(owner)
                if w & RC_MASK:
                    raise InvalidRequest(
                        f"block {b} is already cached by the tree (or given twice); "
                        "every position needs its own block"
                    )
                self._bad_incref(b)
            # Without donate the caller keeps its reference, so the count goes to >= 2 and n_solo
            # starts at 0; the refcount hooks keep it exact when the caller drops its reference later.
            c = (w & RC_MASK) + step
            st[b] = high | c
            if c == 1:
                solo += 1
        return solo

    def split_owner(
        self, upper: BlockOwner, upper_blocks: BlockIds, runs: list[tuple[int, int]] | None, lower: BlockOwner
    ) -> None:
        """``upper`` (new) takes over ``upper_blocks`` from ``lower`` (a node split in two); moves the
        matching part of ``lower.n_solo`` to it. ``runs``: those blocks' runs when known."""
        st = self._state
        high = self._register(upper) << OWNER_SHIFT
        if runs is not None:
            solo = 0
            for a, n in runs:
                rcs = st[a : a + n] & RC_MASK
                st[a : a + n] = rcs | high
                solo += int(np.count_nonzero(rcs == 1))
        else:
            idx = upper_blocks.array()
            rcs = st[idx] & RC_MASK
            st[idx] = rcs | high
            solo = int(np.count_nonzero(rcs == 1))
        upper.n_solo = solo
        lower.n_solo -= solo

    def disown(
        self,
        owner: BlockOwner,
        blocks: BlockIds,
        runs: list[tuple[int, int]] | None,
        freed: list[int] | None,
        pending: list[tuple[int, int]] | None,
    ) -> int:
        """Drop ``owner`` and its reference on each of ``blocks``; -> how many blocks became free.

        With ``freed``, the blocks that became free are appended to it. With ``pending``, whole runs that
        became free are appended to it instead of being freed, for the caller to free together with the
        runs of other owners (:meth:`release_runs`).
        """
        n = bytes.__len__(blocks) // ID_BYTES
        if owner.hold == 0:
            self._evictable -= owner.n_solo
        if owner.n_solo == n and runs is None:
            runs = packed_runs(blocks, self._id_bytes)
        if owner.n_solo == n and runs is not None:
            # Fast path (the common case): nobody else holds any of them, so every run becomes free
            # (refcount 0, no owner) with one slice store and one merge into the free extents.
            if pending is None:
                self.release_runs(runs)
            else:
                pending += runs  # NOTE: their state words stay stale until the caller frees them
            if freed is not None:
                freed += blocks.tolist()
            n_freed = n
        else:
            n_freed = 0
            st = self._state
            free = self._free
            # Inlined decref that also clears the owner, so the ownership hooks have nothing to do.
            for b in blocks.tolist():
                c = (int(st[b]) & RC_MASK) - 1
                st[b] = c
                if c == 0:
                    free.put(b, 1)
                    n_freed += 1
                    if freed is not None:
                        freed.append(b)
        owner.n_solo = 0
        self._unregister(owner)
        return n_freed

    def release_runs(self, runs: list[tuple[int, int]]) -> None:
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

    # ---------------------------------------------------------- introspection
    def refcounts(self) -> list[int]:
        """Every block's reference count, by id (O(num_blocks); for checks and tests)."""
        return (self._state & RC_MASK).tolist()  # type: ignore[no-any-return]

    def owner_ids(self) -> list[int]:
        """Every block's owner id (0: none), by id (O(num_blocks); for checks and tests)."""
        return (self._state >> OWNER_SHIFT).tolist()  # type: ignore[no-any-return]

    def owner_by_id(self, oid: int) -> BlockOwner | None:
        return self._owners.get(oid)

    @property
    def num_owners(self) -> int:
        """Registered owners (live tree nodes that hold blocks)."""
        return len(self._owners)

    def longest_free_run(self) -> int:
        """Blocks in the longest run of consecutive free ids: the largest allocation that can be one
        run. O(free runs)."""
        return self._free.longest()

    def holds_run(self, n: int) -> bool:
        """Whether ``n`` consecutive ids are free (an allocation of ``n`` can be one run); O(1) where one
        of the newest free runs holds them, else O(free runs)."""
        return self._free.holds(n)

    def free_extents(self) -> list[tuple[int, int]]:
        """The free runs ``[(first, length)]``, newest last (for checks and tests)."""
        return self._free.runs()

    def free_extents_problem(self) -> str | None:
        """The first broken invariant of the free extents, or None (for the consistency checker)."""
        return self._free.problem(self.num_blocks)

    def split_hint(self, first: int) -> list[tuple[int, int]] | None:
        """The runs of the recent split allocation that began at ``first`` (for tests)."""
        return self._split_hints.get(first)

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
