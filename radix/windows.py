"""WindowStore: the sliding-layer windows the prefix cache keeps, beside the radix tree's global blocks.

A cached prefix of a model with sliding-window layers is resumable at position ``q`` only if the sliding
layers still hold the window that ends there (the pages of keys ``[q - window + 1, q)``). The tree keeps
every cached token's global-layer blocks; this store keeps such windows at chosen points: where a
conversation's last turn ended (a leaf, where an agent resumes) and where requests branched off a shared
prefix (a system prompt). A match is usable up to the deepest kept window inside it; the rest is
recomputed. A conversation's earlier turn's window goes once a later turn went on past it; under memory
pressure a window is dropped (the tree's blocks stay: a tombstone), least recently used first.
Every window kept and dropped is reported to ``listener`` (a `WindowListener`), like the tree's nodes.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right, insort
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from radixd.radix.errors import InvalidRequest
from radixd.radix.node import TOKEN_BYTES, token_ids
from radixd.radix.pool import BlockPool

_TAIL = 16 * TOKEN_BYTES  # the prefix's last bytes that index a window

WindowKey = tuple[str, bytes]
"""(namespace, packed tokens the window ends after)."""

KINDS = ("leaf", "branch")
"""Why a window is kept: a request ended there (where its conversation resumes), or requests branched
there (a shared prefix such as a system prompt)."""

DROP_REASONS = ("lru", "prefix", "flush", "dead", "superseded")
"""Why a window goes: memory pressure, an operator's prefix eviction or flush, its tokens left the tree
("dead": it can never be resumed from), or a later turn of its conversation went on past it."""


@runtime_checkable
class WindowListener(Protocol):
    """Receives the store's changes (set ``WindowStore.listener``).

    NOTE: called inside the store's operation, on its thread: quick, and no calls back into it."""

    def kept(self, namespace: str, tokens: list[int], start: int, num_pages: int) -> None:
        """The window ending after ``tokens`` (its whole path from the root) joined the cache: it holds
        the sliding layers' keys of ``tokens[start:]`` (``start`` is block-aligned) in ``num_pages``
        pages, every sliding group's together."""

    def dropped(self, namespace: str, tokens: list[int], start: int, num_pages: int, reason: str) -> None:
        """The window ending after ``tokens`` left the cache (the tree's blocks stay); ``reason`` is one
        of ``DROP_REASONS``."""


@dataclass(slots=True)
class KeptWindow:
    """The pages of the window that ends after ``num_tokens`` tokens: positions ``lo..`` per group."""

    num_tokens: int
    lo: int
    pages: tuple[array[int], ...]
    kind: str
    holds: int = 0  # pins, sessions and unattached prefix hits keeping it (WindowStore.hold_window)

    @property
    def num_pages(self) -> int:
        return sum(len(ids) for ids in self.pages)


class WindowStore:
    """Kept windows by (namespace, prefix), in LRU order; one pool reference per page per window."""

    # NOTE: invariants: each window holds exactly one pool reference on each of its pages; a window's
    # key is the packed prefix its num_tokens end (len(key) == num_tokens * TOKEN_BYTES); `_index`
    # lists every window's key under (namespace, num_tokens, its last TAIL tokens), and `_lengths` holds
    # each namespace's distinct num_tokens in order.

    def __init__(self, pool: BlockPool, window: int, groups: int) -> None:
        if window < 1 or groups < 1:
            raise InvalidRequest(f"a window store needs window >= 1 and groups >= 1, got {window}, {groups}")
        self.pool = pool
        self.window = window
        self.groups = groups
        self._windows: OrderedDict[WindowKey, KeptWindow] = OrderedDict()  # least recently used first
        self._index: dict[tuple[str, int, bytes], list[bytes]] = {}
        self._lengths: dict[str, list[int]] = {}  # sorted; one entry per distinct num_tokens
        self._counts: dict[tuple[str, int], int] = {}  # windows per (namespace, num_tokens)
        self.dropped = 0  # windows dropped under pressure or by an operator (tombstones made)
        self.listener: WindowListener | None = None

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
        # Per kept length, deepest first: a dict probe on the prefix's last tokens (a few bytes hashed),
        # then one memcmp of the whole prefix for a candidate (no slice of the long prefix is hashed).
        for i in range(bisect_right(lengths, limit) - 1, -1, -1):
            q = lengths[i]
            end = q * TOKEN_BYTES
            for key in self._index.get((namespace, q, packed[max(0, end - _TAIL) : end]), ()):
                if packed.startswith(key):
                    w = self._windows[(namespace, key)]
                    self._windows.move_to_end((namespace, key))
                    return w
        return None

    def get(self, namespace: str, packed: bytes) -> KeptWindow | None:
        return self._windows.get((namespace, packed))

    def replay(self, listener: WindowListener) -> int:
        """Report every kept window to ``listener`` as ``kept`` (least recently used first); -> windows."""
        for (ns, packed), w in self._windows.items():
            listener.kept(ns, token_ids(packed), w.lo * self.pool.block_size, w.num_pages)
        return len(self._windows)

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
        w = self._windows[key] = KeptWindow(n, lo, tuple(array("i", ids) for ids in pages), kind)
        self._index.setdefault(_index_key(namespace, packed), []).append(packed)
        count = self._counts.get((namespace, n), 0)
        if not count:
            insort(self._lengths.setdefault(namespace, []), n)
        self._counts[(namespace, n)] = count + 1
        if self.listener is not None:
            self.listener.kept(namespace, token_ids(packed), lo * self.pool.block_size, w.num_pages)
        return True

    def supersede(self, namespace: str, packed: bytes) -> int:
        """A later turn went on past this leaf window: it is no longer where its conversation resumes, so
        it goes (unless held, or a branch point); -> pages freed."""
        key = (namespace, packed)
        w = self._windows.get(key)
        if w is None or w.kind != "leaf" or w.holds:
            return 0
        self.dropped -= 1  # not a tombstone: nothing resumable was lost
        return self.drop(key, "superseded")

    def hold(self, namespace: str, packed: bytes) -> bool:
        """Keep the window ending after ``packed`` from eviction (a pin); -> found."""
        w = self._windows.get((namespace, packed))
        if w is not None:
            self.hold_window(w)
        return w is not None

    def unhold(self, namespace: str, packed: bytes) -> None:
        w = self._windows.get((namespace, packed))
        if w is not None:
            self.release_window(w)

    # NOTE: the only two places a window's ``holds`` changes: a held window is never evicted, so every
    # hold (a pin, a session, a prefix hit until it is attached) is released exactly once through here.
    @staticmethod
    def hold_window(w: KeptWindow) -> None:
        """Keep ``w`` from eviction until ``release_window(w)``."""
        w.holds += 1

    @staticmethod
    def release_window(w: KeptWindow) -> None:
        """End one hold on ``w`` (one that is not held is left as it is)."""
        if w.holds > 0:
            w.holds -= 1

    # ------------------------------------------------------------------ dropping
    def drop(self, key: WindowKey, reason: str = "lru") -> int:
        """Drop one window (``reason``: one of ``DROP_REASONS``); -> pages freed."""
        if reason not in DROP_REASONS:
            raise InvalidRequest(f"a window's drop reason must be one of {DROP_REASONS}, got {reason!r}")
        w = self._windows.pop(key)
        ns, packed = key
        ik = _index_key(ns, packed)
        slot = self._index[ik]
        slot.remove(packed)
        if not slot:
            del self._index[ik]
        ck = (ns, w.num_tokens)
        self._counts[ck] -= 1
        if not self._counts[ck]:
            del self._counts[ck]
            lengths = self._lengths[ns]
            lengths.remove(w.num_tokens)
            if not lengths:
                del self._lengths[ns]
        self.dropped += 1
        if self.listener is not None:
            ns, packed = key
            self.listener.dropped(ns, token_ids(packed), w.lo * self.pool.block_size, w.num_pages, reason)
        freed = 0
        for ids in w.pages:
            freed += self.pool.decref_all(ids)
        return freed

    def evict(self, n_pages: int, reason: str = "lru") -> int:
        """Drop unheld windows, least recently used first, until ``n_pages`` are freed or none is left;
        -> pages freed."""
        freed = 0
        for key, w in list(self._windows.items()):
            if freed >= n_pages:
                break
            if not w.holds:
                freed += self.drop(key, reason)
        return freed

    def drop_where(
        self, dead: Callable[[str, bytes, KeptWindow], bool], held_too: bool = False, reason: str = "dead"
    ) -> int:
        """Drop the windows ``dead`` names (unheld ones unless ``held_too``); -> pages freed."""
        freed = 0
        for key, w in list(self._windows.items()):
            if (held_too or not w.holds) and dead(key[0], key[1], w):
                freed += self.drop(key, reason)
        return freed

    def flush(self) -> int:
        """Drop every unheld window; -> pages freed."""
        return self.drop_where(lambda _ns, _key, _w: True, reason="flush")


def _index_key(namespace: str, packed: bytes) -> tuple[str, int, bytes]:
    end = len(packed)
    return namespace, end // TOKEN_BYTES, packed[max(0, end - _TAIL) : end]
