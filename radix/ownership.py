"""CacheOwnership: the tree's side of the pool, the only code that changes which owner a block has.

An owned block's state word carries its owner's id (a node), so refcount changes made by tables keep the
owner's ``n_solo`` and the evictable count exact. A few runs of fresh blocks move one memcpy per run.
"""

from __future__ import annotations

import sys

import numpy as np

from radixd.radix.allocator import Allocator, Runs
from radixd.radix.blockids import ID_BYTES, BlockIds, disjoint_within, packed_runs, spells_runs, unpack_id
from radixd.radix.errors import InvalidRequest
from radixd.radix.extents import FreeExtents
from radixd.radix.owners import BlockOwner, Owners
from radixd.radix.words import NULL_BLOCK, OWNER_SHIFT, RC_MASK, BlockWords


class CacheOwnership:
    """adopt / split_owner / disown / release_runs, and holds (``held`` / ``unheld``), for one tree."""

    # NOTE: invariants: the owner id of block b is 0 or a registered owner's, and b lies in that owner's
    # blocks; Owners.evictable == #{b : owner(b).hold == 0 and refcount(b) == 1}.

    __slots__ = ("_alloc", "_free", "_owners", "_words")

    def __init__(self, words: BlockWords, owners: Owners, free: FreeExtents, alloc: Allocator) -> None:
        self._words = words
        self._owners = owners
        self._free = free
        self._alloc = alloc

    def held(self, owner: BlockOwner) -> None:
        """``owner.hold`` went from 0 to 1: its solo blocks stop being evictable."""
        self._owners.evictable -= owner.n_solo

    def unheld(self, owner: BlockOwner) -> None:
        """``owner.hold`` went back to 0: its solo blocks are evictable again."""
        self._owners.evictable += owner.n_solo

    def owner_by_id(self, oid: int) -> BlockOwner | None:
        return self._owners.get(oid)

    @property
    def num_owners(self) -> int:
        """Registered owners (live nodes that hold blocks)."""
        return len(self._owners)

    def runs_of(self, blocks: bytes) -> Runs | None:
        """``blocks`` (packed) as a few runs of consecutive ids, or None (scattered, or invalid ids); a
        split allocation is recognised by the runs the allocator remembers for it."""
        if not bytes.__len__(blocks):
            return []
        a: int = unpack_id(blocks)[0]
        idb = self._words.id_bytes
        if a >= 1 and idb.startswith(blocks, a * ID_BYTES):  # one run (the common case)
            return [(a, bytes.__len__(blocks) // ID_BYTES)]
        hint = self._alloc.pop_split_hint(a)
        if hint is not None and spells_runs(blocks, idb, hint):
            return hint
        runs = packed_runs(blocks, idb)
        return runs if runs is not None and disjoint_within(runs, self._words.num_blocks) else None

    def adopt(self, owner: BlockOwner, blocks: BlockIds, donate: bool) -> Runs | None:
        """Make ``owner`` (new) the owner of ``blocks`` with one reference each (the caller's, with
        ``donate``); -> their runs when they were fresh runs, else None. A bad block undoes everything
        and raises InvalidRequest (or DoubleFree)."""
        words = self._words
        runs = self.runs_of(blocks)
        oid = self._owners.register(owner)
        if runs is not None and words.fresh(runs):
            # Donated blocks keep the caller's reference; otherwise the caller keeps its own too: counts
            # are 2 and nobody is solo yet.
            word = ((oid << OWNER_SHIFT) | (1 if donate else 2)).to_bytes(8, sys.byteorder)
            for a, k in runs:
                words.fill(a, k, word)
            solo = bytes.__len__(blocks) // ID_BYTES if donate else 0
        else:
            runs = None
            solo = self._adopt_each(owner, blocks.tolist(), donate)
        owner.n_solo = solo
        self._owners.evictable += solo
        return runs

    def _adopt_each(self, owner: BlockOwner, ids: list[int], donate: bool) -> int:
        """Adopt ``ids`` one by one (blocks shared with tables, or scattered ids); -> solo count."""
        words = self._words
        st = words.state
        nblocks = words.num_blocks
        step = 0 if donate else 1  # donated blocks keep the caller's reference; others gain one
        high = owner.oid << OWNER_SHIFT
        solo = 0
        for i, b in enumerate(ids):
            w = int(st[b]) if 0 < b < nblocks else 0
            if w & RC_MASK == 0 or w >> OWNER_SHIFT:
                for a in ids[:i]:
                    st[a] = (int(st[a]) & RC_MASK) - step
                self._owners.unregister(owner)
                if w & RC_MASK:
                    raise InvalidRequest(
                        f"block {b} is already cached by the tree (or given twice); "
                        "every position needs its own block"
                    )
                words.bad_incref(b)
            c = (w & RC_MASK) + step
            st[b] = high | c
            if c == 1:
                solo += 1
        return solo

    def split_owner(
        self, upper: BlockOwner, upper_blocks: BlockIds, runs: Runs | None, lower: BlockOwner
    ) -> None:
        """``upper`` (new) takes ``upper_blocks`` over from ``lower`` (a node split in two) with the matching
        part of ``lower.n_solo``. ``runs``: those blocks' runs when known."""
        st = self._words.state
        high = self._owners.register(upper) << OWNER_SHIFT
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
        runs: Runs | None,
        freed: list[int] | None,
        pending: Runs | None,
    ) -> int:
        """Drop ``owner`` and its reference on each of ``blocks``; -> blocks freed (appended to ``freed``
        if given). With ``pending``, wholly freed runs go there for :meth:`release_runs` instead."""
        n = bytes.__len__(blocks) // ID_BYTES
        owners = self._owners
        if owner.hold == 0:
            owners.evictable -= owner.n_solo
        if owner.n_solo == n and runs is None:
            runs = packed_runs(blocks, self._words.id_bytes)
        if owner.n_solo == n and runs is not None:
            # Nobody else holds any of them (the common case): every run becomes free at once.
            if pending is None:
                self.release_runs(runs)
            else:
                pending += runs  # NOTE: their state words stay stale until the caller frees them
            if freed is not None:
                freed += blocks.tolist()
            n_freed = n
        else:
            n_freed = 0
            st = self._words.state
            free = self._free
            # An inlined decref that also clears the owner, so no owner's count needs updating.
            for b in blocks.tolist():
                c = (int(st[b]) & RC_MASK) - 1
                st[b] = c
                if c == 0:
                    free.put(b, 1)
                    n_freed += 1
                    if freed is not None:
                        freed.append(b)
        owner.n_solo = 0
        owners.unregister(owner)
        return n_freed

    def release_runs(self, runs: Runs) -> None:
        """Free whole runs ``(first, length)`` the cache held alone, merging a run with the one before it
        when it continues it. The order is kept, not sorted: the free extents hand runs out newest first."""
        words = self._words
        put = self._free.put
        s = e = 0  # the group being merged: blocks [s, e)
        for a, k in [*runs, (NULL_BLOCK, 0)]:  # the null block (never freed) ends the last group
            if a != e:
                if e:
                    words.clear(s, e)
                    put(s, e - s)
                s = a
            e = a + k
