"""Allocator: hands out free blocks at refcount 1, as few runs of consecutive ids as the free extents allow.

It remembers how recent split allocations were split, so the tree can adopt them run by run.
"""

from __future__ import annotations

from array import array

from radixd.radix.blockids import ID_BYTES, BlockIds
from radixd.radix.errors import InvalidRequest, OutOfBlocks
from radixd.radix.extents import FreeExtents
from radixd.radix.owners import Owners
from radixd.radix.words import BlockWords

SPLIT_HINTS = 16
"""Split allocations whose runs the allocator remembers."""

Runs = list[tuple[int, int]]


class Allocator:
    """allocate / allocate_ids / allocate_into over the pool's words and free extents."""

    __slots__ = ("_free", "_owners", "_split_hints", "_words")

    def __init__(self, words: BlockWords, owners: Owners, free: FreeExtents) -> None:
        self._words = words
        self._owners = owners  # read for the evictable count an OutOfBlocks error reports
        self._free = free
        self._split_hints: dict[int, Runs] = {}  # first id -> runs of a split allocation

    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks, each with refcount 1; OutOfBlocks (nothing changed) when fewer are free."""
        ids = self._words.ids
        a = self._take_run(n)
        if a:
            return ids[a : a + n]  # no new int objects: a slice of the shared id list
        out: list[int] = []
        for a, k in self._take_split(n):
            out += ids[a : a + k]
        return out

    def allocate_ids(self, n: int) -> BlockIds:
        """:meth:`allocate`, packed."""
        ids: array[int] = array("i")
        self.allocate_into(ids, n)
        return BlockIds(ids)

    def allocate_into(self, ids: array[int], n: int, after: int = 0) -> None:
        """:meth:`allocate`, appended to a packed id array (a table's blocks). ``after``: the table's last
        block (0: none); the blocks right after it are taken when free, so a table stays a few runs."""
        view = self._words.id_view
        a = self._take_run(n, after)
        if a:
            ids.frombytes(view[a * ID_BYTES : (a + n) * ID_BYTES])
            return
        for a, k in self._take_split(n):
            ids.frombytes(view[a * ID_BYTES : (a + k) * ID_BYTES])

    def split_hint(self, first: int) -> Runs | None:
        """The runs of the recent split allocation that began at ``first``."""
        return self._split_hints.get(first)

    def pop_split_hint(self, first: int) -> Runs | None:
        """:meth:`split_hint`, forgotten (an allocation is adopted once)."""
        return self._split_hints.pop(first, None)

    def _take_run(self, n: int, after: int = 0) -> int:
        """``n`` blocks from one free run, fresh (see :meth:`allocate_into` for ``after``); -> the run's
        first block, or 0 (never a usable block) when no single run fits."""
        free = self._free
        if 0 < n <= free.count:
            if after and free.take_at(after + 1, n):
                a = after + 1
            elif after and n == 1:
                a = free.take_room()
            else:  # best fit among the newest runs, else among all before splitting
                a = free.take_fit(n) or free.take_fit(n, scan=free.num_runs)
            if a:
                self._words.set_fresh(a, n)
            return a
        return 0

    def _take_split(self, n: int) -> Runs:
        """``n`` fresh blocks over several runs, newest first (no run :meth:`_take_run` looked at fits)."""
        if n <= 0:
            if n == 0:
                return []
            raise InvalidRequest(f"cannot allocate a negative number of blocks ({n})")
        free = self._free
        if n > free.count:
            raise OutOfBlocks(n, free.count, self._owners.evictable)
        runs = free.take(n)
        for a, k in runs:
            self._words.set_fresh(a, k)
        hints = self._split_hints
        hints[runs[0][0]] = runs
        if len(hints) > SPLIT_HINTS:
            del hints[next(iter(hints))]
        return runs
