"""WindowStore: the sliding-layer windows the prefix cache keeps, beside the radix tree's global blocks.

A cached prefix of a model with sliding-window layers is resumable at position ``q`` only if the sliding
layers still hold the window that ends there (the pages of keys ``[q - window + 1, q)``). The tree keeps
every cached token's global-layer blocks; this store keeps such windows at chosen points: where a
conversation's last turn ended (a leaf, where an agent resumes) and where requests branched off a shared
prefix (a system prompt). A match is usable up to the deepest kept window inside it; the rest is
recomputed. A conversation's earlier turn's window goes once a later turn went on past it; under memory
pressure a window is dropped (the tree's blocks stay: a tombstone), least recently used first.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from radixd.radix.errors import InvalidRequest
from radixd.radix.node import TOKEN_BYTES
from radixd.radix.pool import BlockPool

WindowKey = tuple[str, bytes]
"""(namespace, packed tokens the window ends after)."""

KINDS = ("leaf", "branch")
"""Why a window is kept: a request ended there (where its conversation resumes), or requests branched
there (a shared prefix such as a system prompt)."""


@dataclass(slots=True)
class KeptWindow:
    """The pages of the window that ends after ``num_tokens`` tokens: positions ``lo..`` per group."""

    num_tokens: int
    lo: int
    pages: tuple[array[int], ...]
    kind: str
    holds: int = 0  # pins and sessions that keep it from eviction

    @property
    def num_pages(self) -> int:
        return sum(len(ids) for ids in self.pages)


class WindowStore:
    """Kept windows by (namespace, prefix), in LRU order; one pool reference per page per window."""

    # NOTE: invariants: each window holds exactly one pool reference on each of its pages; a window's
    # key is the packed prefix its num_tokens end (len(key) == num_tokens * TOKEN_BYTES); `_lengths`
    # counts the kept windows of each namespace by num_tokens.

    def __init__(self, pool: BlockPool, window: int, groups: int) -> None:
        if window < 1 or groups < 1:
            raise InvalidRequest(f"a window store needs window >= 1 and groups >= 1, got {window}, {groups}")
        self.pool = pool
        self.window = window
        self.groups = groups
        self._windows: OrderedDict[WindowKey, KeptWindow] = OrderedDict()  # least recently used first
        self._lengths: dict[str, dict[int, int]] = {}
        self.dropped = 0  # windows dropped under pressure or by an operator (tombstones made)

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._windows)

    def __iter__(self) -> Iterator[tuple[WindowKey, KeptWindow]]:
        return iter(list(self._windows.items()))

    def page_refs(self) -> int:
        """Pool references the store holds (a page shared by two overlapping windows counts twice)."""
        return sum(w.num_pages for w in self._windows.values())

    def pages(self) -> set[int]:
        """The distinct pages the store keeps alive."""
        return {p for w in self._windows.values() for ids in w.pages for p in ids}

    def evictable_pages(self) -> int:
        """Pages that dropping every unheld window would free (held by nothing else)."""
        refs: dict[int, int] = {}
        pinned: set[int] = set()
        for w in self._windows.values():
            for ids in w.pages:
                for p in ids:
                    refs[p] = refs.get(p, 0) + 1
                    if w.holds:
                        pinned.add(p)
        rc = self.pool.refcount
        return sum(1 for p, n in refs.items() if p not in pinned and rc(p) == n)

    def find(self, namespace: str, packed: bytes, limit: int) -> KeptWindow | None:
        """The deepest kept window ending within the first ``limit`` tokens of ``packed``; refreshes it."""
        lengths = self._lengths.get(namespace)
        if not lengths:
            return None
        for q in sorted((q for q in lengths if q <= limit), reverse=True):
            key = (namespace, packed[: q * TOKEN_BYTES])
            w = self._windows.get(key)
            if w is not None:
                self._windows.move_to_end(key)
                return w
        return None

    def get(self, namespace: str, packed: bytes) -> KeptWindow | None:
        return self._windows.get((namespace, packed))

    # ------------------------------------------------------------------ keeping
    def keep(self, namespace: str, packed: bytes, lo: int, pages: tuple[array[int], ...], kind: str) -> bool:
        """Keep the window ending after ``packed`` (one reference taken per page); an existing one is
        refreshed (a branch stays a branch). -> whether a new window was stored."""
        if kind not in KINDS:
            raise InvalidRequest(f"window kind must be one of {KINDS}, got {kind!r}")
        n = len(packed) // TOKEN_BYTES
        if n < 1 or len(pages) != self.groups:
            raise InvalidRequest(f"a kept window needs >= 1 token and {self.groups} page groups")
        key = (namespace, packed)
        old = self._windows.get(key)
        if old is not None:
            if kind == "branch":
                old.kind = kind
            self._windows.move_to_end(key)
            return False
        for ids in pages:
            self.pool.incref_all(ids)
        self._windows[key] = KeptWindow(n, lo, tuple(array("i", ids) for ids in pages), kind)
        per = self._lengths.setdefault(namespace, {})
        per[n] = per.get(n, 0) + 1
        return True

    def supersede(self, namespace: str, packed: bytes) -> int:
        """A later turn went on past this leaf window: it is no longer where its conversation resumes, so
        it goes (unless held, or a branch point); -> pages freed."""
        key = (namespace, packed)
        w = self._windows.get(key)
        if w is None or w.kind != "leaf" or w.holds:
            return 0
        self.dropped -= 1  # not a tombstone: nothing resumable was lost
        return self.drop(key)

    def hold(self, namespace: str, packed: bytes) -> bool:
        """Keep the window ending after ``packed`` from eviction (a pin, a session); -> found."""
        w = self._windows.get((namespace, packed))
        if w is not None:
            w.holds += 1
        return w is not None

    def unhold(self, namespace: str, packed: bytes) -> None:
        w = self._windows.get((namespace, packed))
        if w is not None and w.holds > 0:
            w.holds -= 1

    # ------------------------------------------------------------------ dropping
    def drop(self, key: WindowKey) -> int:
        """Drop one window; -> pages freed."""
        w = self._windows.pop(key)
        per = self._lengths[key[0]]
        per[w.num_tokens] -= 1
        if not per[w.num_tokens]:
            del per[w.num_tokens]
        if not per:
            del self._lengths[key[0]]
        self.dropped += 1
        freed = 0
        for ids in w.pages:
            freed += self.pool.decref_all(ids)
        return freed

    def evict(self, n_pages: int) -> int:
        """Drop unheld windows, least recently used first, until ``n_pages`` are freed or none is left;
        -> pages freed."""
        freed = 0
        for key, w in list(self._windows.items()):
            if freed >= n_pages:
                break
            if not w.holds:
                freed += self.drop(key)
        return freed

    def drop_where(self, dead: Callable[[str, bytes, KeptWindow], bool], held_too: bool = False) -> int:
        """Drop the windows ``dead`` names (unheld ones unless ``held_too``); -> pages freed."""
        freed = 0
        for key, w in list(self._windows.items()):
            if (held_too or not w.holds) and dead(key[0], key[1], w):
                freed += self.drop(key)
        return freed

    def flush(self) -> int:
        """Drop every unheld window; -> pages freed."""
        return self.drop_where(lambda _ns, _key, _w: True)
