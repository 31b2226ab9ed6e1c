"""SlidingTable: one running sequence's pages for its sliding-window layers.

A model whose layers attend either to everything (global layers) or to the last ``window`` tokens
(sliding layers) keeps two kinds of KV. The global layers' KV lives in the sequence's BlockTable and in
the radix tree, as for any model. The sliding layers' KV lives in ``groups`` pages per block position,
ordinary blocks of the same pool (so memory is fungible between the two), listed here; the pages of
positions that fell out of the window are released while the sequence runs (:meth:`slide`).
"""

from __future__ import annotations

from array import array

from radixd.radix.errors import InvalidRequest, OutOfBlocks
from radixd.radix.pool import BlockPool
from radixd.radix.table import CopyOp


def window_start(n_tokens: int, window: int, block_size: int) -> int:
    """The first block position the next query (at position ``n_tokens``) reads through a window of
    ``window`` tokens: keys ``[n_tokens - window + 1, n_tokens]``."""
    return max(0, n_tokens - window + 1) // block_size


class SlidingTable:
    """Block position -> ``groups`` page ids (one per sliding group); 0 where released (left of the
    window). Copy-on-write like BlockTable: a shared, partly filled last position is copied before it
    is written."""

    # NOTE: invariants: every nonzero entry is one reference this table holds in the pool; entries of
    # positions below `lo` are 0 and every entry from `lo` on is nonzero; all `groups` arrays have
    # ceil(num_tokens / B) entries; the pages of one position share their holders (they are taken,
    # shared and dropped together), so the first group's refcount speaks for the position.

    __slots__ = ("groups", "lo", "num_tokens", "pages", "pool")

    def __init__(self, pool: BlockPool, groups: int) -> None:
        if groups < 1:
            raise InvalidRequest(f"a sliding table needs >= 1 group, got {groups}")
        self.pool = pool
        self.groups = groups
        self.pages: tuple[array[int], ...] = tuple(array("i") for _ in range(groups))
        self.lo = 0
        self.num_tokens = 0

    @property
    def num_positions(self) -> int:
        return len(self.pages[0])

    # ------------------------------------------------------------------ growth
    def _growth(self, n_tokens: int) -> tuple[int, bool]:
        B = self.pool.block_size
        n = self.num_positions
        cow = (
            n_tokens > 0
            and self.num_tokens % B > 0
            and n > self.lo
            and self.pool.refcount(self.pages[0][-1]) > 1
        )
        return -(-(self.num_tokens + n_tokens) // B) - n + cow, cow

    def new_pages_for(self, n_tokens: int) -> int:
        """Pages :meth:`append` ``(n_tokens)`` takes (new positions, and the copy of a shared last one)."""
        return self._growth(n_tokens)[0] * self.groups

    def append(self, n_tokens: int) -> list[CopyOp]:
        """Pages for ``n_tokens`` more tokens; -> copies to run first. All-or-nothing (OutOfBlocks)."""
        if n_tokens < 0:
            raise InvalidRequest(f"cannot append a negative number of tokens ({n_tokens})")
        positions, cow = self._growth(n_tokens)
        need = positions * self.groups
        pool = self.pool
        if need > pool.num_free:
            raise OutOfBlocks(need, pool.num_free, pool.num_evictable)
        copies: list[CopyOp] = []
        if positions:
            fresh = pool.allocate(need)
            filled = self.num_tokens % pool.block_size
            for g, ids in enumerate(self.pages):
                mine = fresh[g :: self.groups]
                if cow:
                    src = ids[-1]
                    ids[-1] = mine[0]
                    copies.append((src, mine[0], filled))
                    pool.decref(src)
                    mine = mine[1:]
                ids.extend(mine)
        self.num_tokens += n_tokens
        return copies

    # ------------------------------------------------------------------ shrink
    def slide(self, lo: int) -> int:
        """Release the pages of positions below ``lo`` (out of the window for good); -> pages freed."""
        lo = min(lo, self.num_positions)
        if lo <= self.lo:
            return 0
        dropped: list[int] = []
        for ids in self.pages:
            dropped.extend(ids[self.lo : lo])
            ids[self.lo : lo] = array("i", bytes(4 * (lo - self.lo)))
        self.lo = lo
        return self.pool.decref_all(dropped)

    def truncate(self, n_tokens: int) -> int:
        """Shrink to the first ``n_tokens`` (rejected draft tokens); -> pages freed."""
        if not 0 <= n_tokens <= self.num_tokens:
            raise InvalidRequest(f"truncate({n_tokens}) outside [0, {self.num_tokens}]")
        keep = -(-n_tokens // self.pool.block_size)
        dropped: list[int] = []
        for ids in self.pages:
            dropped.extend(p for p in ids[max(keep, self.lo) :])
            del ids[keep:]
        self.lo = min(self.lo, keep)
        self.num_tokens = n_tokens
        return self.pool.decref_all(dropped) if dropped else 0

    def release(self) -> int:
        """Drop every reference (idempotent); -> pages freed."""
        dropped: list[int] = []
        for ids in self.pages:
            dropped.extend(ids[self.lo :])
        self.pages = tuple(array("i") for _ in range(self.groups))
        self.lo = self.num_tokens = 0
        return self.pool.decref_all(dropped) if dropped else 0

    # ------------------------------------------------------------------ sharing
    def fork(self, k: int) -> list[SlidingTable]:
        """``k`` tables sharing every page (one reference more per page each)."""
        out: list[SlidingTable] = []
        for _ in range(k):
            t = SlidingTable(self.pool, self.groups)
            t.pages = tuple(array("i", ids) for ids in self.pages)
            t.lo, t.num_tokens = self.lo, self.num_tokens
            for ids in t.pages:
                self.pool.incref_all(ids[t.lo :])
            out.append(t)
        return out

    def span(self, n_tokens: int, window: int) -> tuple[int, tuple[array[int], ...]]:
        """The pages of the window that ends at ``n_tokens``: (first position, pages per group); the
        table must still hold them."""
        B = self.pool.block_size
        if not 0 < n_tokens <= self.num_tokens:
            raise InvalidRequest(f"span({n_tokens}) outside (0, {self.num_tokens}]")
        lo, hi = window_start(n_tokens, window, B), -(-n_tokens // B)
        if lo < self.lo:
            raise InvalidRequest(
                f"the window ending at {n_tokens} starts at position {lo}, released up to {self.lo}"
            )
        return lo, tuple(ids[lo:hi] for ids in self.pages)

    def adopt(self, lo: int, pages: tuple[array[int], ...], n_tokens: int) -> None:
        """Start this (empty) table from a kept window: positions ``lo..`` hold ``pages``, the
        ``n_tokens`` before it are in other layers' blocks (one reference taken per page)."""
        if self.num_tokens:
            raise InvalidRequest("adopt needs an empty sliding table")
        hi = -(-n_tokens // self.pool.block_size)
        if len(pages) != self.groups or any(len(ids) != hi - lo for ids in pages):
            raise InvalidRequest(f"a window of positions [{lo}, {hi}) needs {self.groups} x {hi - lo} pages")
        for ids in pages:
            self.pool.incref_all(ids)
        zeros = bytes(4 * lo)
        self.pages = tuple(array("i", zeros) + array("i", ids) for ids in pages)
        self.lo, self.num_tokens = lo, n_tokens

    def start_at(self, n_tokens: int, window: int) -> None:
        """Start this (empty) table at ``n_tokens`` with fresh pages for the window ending there only (a
        sequence whose KV comes back from elsewhere, e.g. swapped in). All-or-nothing (OutOfBlocks)."""
        if self.num_tokens:
            raise InvalidRequest("start_at needs an empty sliding table")
        B = self.pool.block_size
        lo, hi = window_start(n_tokens, window, B), -(-n_tokens // B)
        need = (hi - lo) * self.groups
        if need > self.pool.num_free:
            raise OutOfBlocks(need, self.pool.num_free, self.pool.num_evictable)
        fresh = self.pool.allocate(need) if need else []
        zeros = bytes(4 * lo)
        self.pages = tuple(
            array("i", zeros) + array("i", fresh[g :: self.groups]) for g in range(self.groups)
        )
        self.lo, self.num_tokens = lo, n_tokens

    def held_pages(self) -> list[tuple[int, int]]:
        """(page, position) of every page held, group by group."""
        return [(p, self.lo + i) for ids in self.pages for i, p in enumerate(ids[self.lo :])]

    def __repr__(self) -> str:
        return f"SlidingTable(num_tokens={self.num_tokens}, lo={self.lo}, groups={self.groups})"
