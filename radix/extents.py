"""FreeExtents: the pool's free blocks as maximal runs of consecutive ids, merged on free in O(1)."""

from __future__ import annotations

from itertools import islice


class FreeExtents:
    """Free block ids kept as runs ``[start, start + length)``.

    Why runs: a request at block size 1 moves about a thousand blocks. Handing them out as a few runs
    lets the pool set refcounts with one C-level slice store per run and lets the tree recognise them as
    runs without probing. Freed runs merge with free neighbours at once (two dict lookups), so the free
    space never fragments into runs that are adjacent but kept apart, whatever order blocks come back in.

    Allocation looks at the newest runs first (``dict`` keeps insertion order): :meth:`take_fit` takes
    the shortest of the 16 newest runs that holds the whole request (best fit keeps long runs for long
    requests, so requests are split over several runs less often); when none does, :meth:`take` splits
    it over the newest runs. A run that is only partly taken keeps its remainder on top.
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
        """Take ``n >= 1`` blocks from the head of the shortest run that holds them among the ``scan``
        newest runs (the newest first on a tie; an exact fit ends the search).

        Returns the first id taken, or 0 (the null block is never free) when none of those runs is long
        enough. Why: an allocation served by one run is one slice for the caller and one run for the tree
        to adopt, where splitting it over the newest runs (:meth:`take`) would hand out several; taking
        the shortest run that fits (best fit) keeps long runs for long requests, which makes splits rarer.
        A run that is only partly taken keeps its remainder on top, so the next allocation continues it.
        """
        by_start = self._by_start
        best_a = 0
        best_k = self.count + 1  # longer than any run
        for a, k in islice(reversed(by_start.items()), scan):
            if n <= k < best_k:
                best_a = a
                best_k = k
                if k == n:
                    break
        if not best_a:
            return 0
        a = best_a
        k = best_k
        del by_start[a]
        if k > n:
            by_start[a + n] = k - n
            self._by_end[a + k] = a + n
        else:
            del self._by_end[a + k]
        self.count -= n
        return a

    def contains(self, b: int) -> bool:
        """Whether block ``b`` is free (O(runs); for checks and tests)."""
        return any(a <= b < a + k for a, k in self._by_start.items())

    def problem(self, num_blocks: int) -> str | None:
        """The first broken invariant among ids ``[1, num_blocks)``, or None (O(runs); for checks)."""
        runs = sorted(self._by_start.items())
        end = 1
        for a, k in runs:
            if k < 1 or a < end:
                return f"free run ({a}, {k}) is empty or overlaps the previous run or the null block"
            if a == end and end > 1:
                return f"free run ({a}, {k}) touches the previous one: runs were not merged"
            if self._by_end.get(a + k) != a:
                return f"free run ({a}, {k}) is missing from the end index"
            end = a + k
        if end > num_blocks or len(self._by_end) != len(runs):
            return "free runs go past the pool or the end index has stale entries"
        if sum(k for _a, k in runs) != self.count:
            return f"free extents count {self.count} blocks but hold {sum(k for _a, k in runs)}"
        return None
