"""FreeExtents: the pool's free blocks as maximal runs of consecutive ids, merged on free in O(1)."""

from __future__ import annotations

from itertools import islice


class FreeExtents:
    """Free block ids as runs ``[start, start + length)``, newest last; a freed run merges with its free
    neighbours at once. Allocation looks at the newest runs first; a partly taken run stays on top."""

    # NOTE: invariants (radixd.radix.verify checks them):
    #  * _by_start[s] == k  <=>  _by_end[s + k] == s; every run has k >= 1;
    #  * runs never overlap and are maximal: no run ends where another starts;
    #  * count == sum of run lengths.

    __slots__ = ("_by_end", "_by_start", "count")

    def __init__(self) -> None:
        self._by_start: dict[int, int] = {}
        self._by_end: dict[int, int] = {}
        self.count = 0

    @property
    def num_runs(self) -> int:
        """How many free runs there are."""
        return len(self._by_start)

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
        """Take ``n >= 1`` blocks from the head of the shortest of the ``scan`` newest runs that holds
        them (best fit keeps long runs for long requests); -> the first id, or 0 when none is long enough."""
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
        self._take_head(best_a, best_k, n)
        return best_a

    def take_at(self, a: int, n: int) -> bool:
        """Take ``n >= 1`` blocks from the head of the free run that starts at ``a``, if there is one and
        it holds them; -> whether it did (a table growing into the blocks right after its last one)."""
        k = self._by_start.get(a, 0)
        if k < n:
            return False
        self._take_head(a, k, n)
        return True

    def _take_head(self, a: int, k: int, n: int) -> None:
        """Remove the first ``n`` blocks of free run ``(a, k)``; its remainder goes on top."""
        del self._by_start[a]
        if k > n:
            self._by_start[a + n] = k - n
            self._by_end[a + k] = a + n
        else:
            del self._by_end[a + k]
        self.count -= n

    def take_room(self, scan: int = 16) -> int:
        """Take one block in the middle of the longest of the ``scan`` newest runs, so that a table growing
        a block at a time beside others has room after it (:meth:`take_at`); -> its id, or 0 if none."""
        best_a = best_k = 0
        for a, k in islice(reversed(self._by_start.items()), scan):
            if k > best_k:
                best_a, best_k = a, k
        if not best_k:
            return 0
        a, k = best_a, best_k
        m = a + (k - 1) // 2
        del self._by_start[a]
        del self._by_end[a + k]
        if m + 1 < a + k:  # the room after: older than the part before, which others take first
            self._by_start[m + 1] = a + k - m - 1
            self._by_end[a + k] = m + 1
        if m > a:
            self._by_start[a] = m - a
            self._by_end[m] = a
        self.count -= 1
        return m

    def longest(self) -> int:
        """The length of the longest free run (0 when nothing is free). O(runs)."""
        return max(self._by_start.values(), default=0)

    def holds(self, n: int, scan: int = 16) -> bool:
        """Whether some free run holds ``n`` blocks: the ``scan`` newest runs first (where
        :meth:`take_fit` looks, and usually finds one), then all of them."""
        for k in islice(reversed(self._by_start.values()), scan):
            if k >= n:
                return True
        return self.longest() >= n

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
