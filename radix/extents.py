"""FreeExtents: the pool's free blocks as maximal runs of consecutive ids, merged on free in O(1)."""

from __future__ import annotations


class FreeExtents:
    """Free block ids kept as runs ``[start, start + length)``.

    Why runs: a request at block size 1 moves about a thousand blocks. Handing them out as a few runs
    lets the pool set refcounts with one C-level slice store per run and lets the tree recognise them as
    runs without probing. Freed runs merge with free neighbours at once (two dict lookups), so the free
    space never fragments into runs that are adjacent but kept apart, whatever order blocks come back in.

    Allocation is LIFO over runs (``dict`` keeps insertion order and ``popitem`` takes the newest): the
    run freed (or merged) most recently is reused first, which is kind to caches; a run that is only
    partly taken keeps its remainder on top, so consecutive allocations continue where the last stopped.
    """

    # NOTE: invariants (radixd.radix.verify checks them):
    #  * _by_start[s] == k  <=>  _by_end[s + k] == s; every run has k >= 1;
    #  * runs never overlap and are maximal: no run ends where another starts;
    #  * count == sum of run lengths.

    __slots__ = ("_by_end", "_by_start", "count")

    def __init__(self) -> None:
        self._by_start: dict[int, int] = {}
        self._by_end: dict[int, int] = {}
        self.count = 0

    def runs(self) -> list[tuple[int, int]]:
        """Snapshot ``[(start, length), ...]`` (newest last)."""
        return list(self._by_start.items())

    def put(self, a: int, k: int) -> None:
        """Return run ``[a, a + k)`` (the caller guarantees its blocks are not free yet)."""
        self.count += k
        by_start = self._by_start
        by_end = self._by_end
        s = by_end.pop(a, None)
        if s is not None:  # a free run ends where this one starts: glue onto it
            del by_start[s]
            k += a - s
            a = s
        r = by_start.pop(a + k, None)
        if r is not None:  # a free run starts where this one ends
            del by_end[a + k + r]
            k += r
        by_start[a] = k
        by_end[a + k] = a

    def take(self, n: int) -> list[tuple[int, int]]:
        """Remove ``n`` blocks (``1 <= n <= count``) as runs, newest run first."""
        by_start = self._by_start
        by_end = self._by_end
        self.count -= n
        got: list[tuple[int, int]] = []
        while True:
            a, k = by_start.popitem()
            if k > n:  # keep the remainder on top, so the next allocation continues it
                by_start[a + n] = k - n
                by_end[a + k] = a + n
                got.append((a, n))
                return got
            del by_end[a + k]
            got.append((a, k))
            n -= k
            if not n:
                return got

    def take_fit(self, n: int, scan: int = 16) -> int:
        """Take ``n >= 1`` blocks from the head of the newest run, among the ``scan`` newest, that holds them.

        Returns the first id taken, or 0 (the null block is never free) when none of those runs is long
        enough. Why: an allocation served by one run is one slice for the caller and one run for the tree
        to adopt, where splitting it over the newest runs (:meth:`take`) would hand out several. A run
        that is only partly taken keeps its remainder on top, so consecutive allocations continue it.
        """
        by_start = self._by_start
        by_end = self._by_end
        if not by_start:
            return 0
        a, k = by_start.popitem()  # the newest run: the common case, without building an iterator
        if k < n:
            by_start[a] = k  # put it back (it stays the newest) and look at older runs
            if max(by_start.values()) < n:  # one C-level pass rules out the scan
                return 0
            for a, k in reversed(by_start.items()):
                if k >= n:
                    del by_start[a]
                    break
                scan -= 1
                if not scan:
                    return 0
            else:
                return 0
        if k > n:
            by_start[a + n] = k - n
            by_end[a + k] = a + n
        else:
            del by_end[a + k]
        self.count -= n
        return a

    def contains(self, b: int) -> bool:
        """Whether block ``b`` is free (O(runs); for checks and tests)."""
        return any(a <= b < a + k for a, k in self._by_start.items())
