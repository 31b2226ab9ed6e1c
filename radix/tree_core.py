"""TreeCore: radix-tree state plus the structural primitives every operation builds on.

Splitting and removing nodes, the first-token index, leases (lock / unlock a path) and statistics live
here; ``tree_evict`` adds LRU eviction, ``tree_admin`` prefix eviction, flush and pins, ``tree_adopt`` the
creation of leaves, ``tree`` match / insert.
"""

from __future__ import annotations

import numpy as np

from radixd.radix.blockids import ID_BYTES, BlockIds, packed_runs
from radixd.radix.errors import InvalidRequest, RadixError, UnknownLease
from radixd.radix.events import CacheListener
from radixd.radix.lru import LruIndex
from radixd.radix.node import TOKEN_BYTES, Node, Tokens, split_runs, token_ids
from radixd.radix.pool import OWNER_SHIFT, RC_MASK, BlockPool
from radixd.radix.results import CacheStats, Lease

EVICT_REASONS = ("lru", "prefix", "flush", "superseded")


class TreeCore:
    """State and structural primitives of :class:`radixd.radix.RadixTree` (use that class)."""

    def __init__(self, pool: BlockPool, pin_budget_fraction: float = 0.25) -> None:
        if not 0.0 <= pin_budget_fraction <= 1.0:
            raise InvalidRequest(f"pin_budget_fraction must be within [0, 1], got {pin_budget_fraction}")
        if pool._tree_attached:
            raise RadixError("this BlockPool already serves a RadixTree; use one tree per pool")
        pool._tree_attached = True
        self.pool = pool
        self.block_size = pool.block_size
        self._bb = pool.block_size * TOKEN_BYTES  # a block's tokens, in packed bytes
        self.pin_budget_blocks = int(pin_budget_fraction * pool.num_usable)
        self._roots: dict[str, Node] = {}
        self._lru = LruIndex()
        # NOTE: a lease that locks nothing never changes (nothing ever moves it), so every empty match
        # and every clone of one can share this one.
        self._clock = 0
        self._epoch = 0
        self._nodes = 0
        self._cached_blocks = 0
        self._pinned_blocks = 0
        self._pins: dict[tuple[str, Tokens], Node] = {}
        self._leases = 0
        self._hit_tokens = 0
        self._miss_tokens = 0
        self._evicted = dict.fromkeys(EVICT_REASONS, 0)
        # Observer of content changes (see radix/events.py); None costs one test per leaf added/removed.
        self.listener: CacheListener | None = None

    # ============================================================ structure
    def _touch(self, node: Node, tick: int) -> None:
        if node.in_lru:
            self._lru.discard(node)
            node.tick = tick
            self._lru.add(node)
        else:
            node.tick = tick

    # The first-token index of a node's children (kept when block_size > 1) finds the sibling that shares
    # the longest partial first block without scanning every child.
    def _index_first(self, parent: Node, child: Node) -> None:
        by_first = parent.by_first
        if by_first is None:
            by_first = parent.by_first = {}
        first = child.key[:TOKEN_BYTES]
        lst = by_first.get(first)
        if lst is None:
            by_first[first] = [child]
        else:
            lst.append(child)

    def _unindex_first(self, parent: Node, child: Node) -> None:
        by_first = parent.by_first
        if by_first is not None:
            first = child.key[:TOKEN_BYTES]
            lst = by_first[first]
            if len(lst) == 1:
                del by_first[first]
            else:
                lst.remove(child)

    def _split(self, child: Node, k: int) -> Node:
        """Split ``child`` after its first ``k`` blocks; returns the new upper node.

        The lower part keeps the node's identity, so leases and pins that end at it stay valid and
        keep covering the whole path (the upper part inherits their hold and pin counts).
        """
        B = self._bb
        parent = child.parent
        if parent is None or not 0 < k < len(child.blocks):
            raise RadixError(f"internal: cannot split a node of {len(child.blocks)} blocks at {k}")
        ct = child.tokens
        cb = memoryview(child.blocks)
        upper = Node(ct[: k * B], BlockIds(cb[: k * ID_BYTES]), parent, child.key, child.tick)
        self._clock += 1
        self._touch(child, self._clock)  # keep ticks unique: the upper part took the old one
        # Re-seat: same key in the parent, so replace in place.
        parent.children[upper.key] = upper
        if parent.by_first is not None:
            lst = parent.by_first[upper.key[:TOKEN_BYTES]]
            lst[lst.index(child)] = upper
        child.tokens = ct[k * B :]
        child.blocks = BlockIds(cb[k * ID_BYTES :])
        if child.runs is not None:
            upper.runs, child.runs = split_runs(child.runs, k)
        child.key = child.tokens[:B]
        child.parent = upper
        upper.children[child.key] = child
        if self.block_size > 1:
            upper.by_first = {child.key[:TOKEN_BYTES]: [child]}
        upper.hold = child.hold
        upper.pin = child.pin
        pool = self.pool
        st = pool._state
        high = pool._register(upper) << OWNER_SHIFT
        if upper.runs is not None:
            solo = 0
            for a, n in upper.runs:
                rcs = st[a : a + n] & RC_MASK
                st[a : a + n] = rcs | high
                solo += int(np.count_nonzero(rcs == 1))
        else:
            idx = upper.blocks.array()
            rcs = st[idx] & RC_MASK
            st[idx] = rcs | high
            solo = int(np.count_nonzero(rcs == 1))
        upper.n_solo = solo
        child.n_solo -= solo
        self._nodes += 1
        return upper

    def _path(self, node: Node) -> tuple[str, list[int]]:
        """The namespace and the token path from the root to the end of ``node`` (for listeners)."""
        parts: list[bytes] = []
        x: Node | None = node
        root = node
        while x is not None:
            parts.append(bytes(x.tokens))
            root = x
            x = x.parent
        ns = next((name for name, r in self._roots.items() if r is root), "")
        return ns, token_ids(b"".join(reversed(parts)))

    def _remove_leaf(
        self,
        node: Node,
        reason: str,
        freed: list[int] | None,
        keep_root: bool = False,
        pending: list[tuple[int, int]] | None = None,
    ) -> int:
        """Drop a leaf and its tree references; returns how many of its blocks became free.

        Blocks that became free go back to the pool; when ``freed`` is given they are also appended to
        it (``evict`` returns them). With ``pending``, whole runs that became free are appended to it
        instead, for the caller to free with the runs of other removed leaves (``pool._free_runs``).
        """
        parent = node.parent
        if parent is None or node.children:
            raise RadixError("internal: only a leaf can be removed")
        blocks = node.blocks
        n = bytes.__len__(blocks) // ID_BYTES
        if self.listener is not None:
            ns, path = self._path(node)
            start = len(path) - len(node.tokens) // TOKEN_BYTES
            self.listener.removed(ns, path, start, n, reason)
        del parent.children[node.key]
        if parent.by_first is not None:
            self._unindex_first(parent, node)
        if node.in_lru:
            self._lru.discard(node)
        pool = self.pool
        if node.hold == 0:
            pool._evictable -= node.n_solo
        runs = None
        if node.n_solo == n:
            runs = node.runs if node.runs is not None else packed_runs(blocks, pool._id_bytes)
        if runs is not None:
            # Fast path (the common case): nobody else holds any of them, so every run becomes free
            # (refcount 0, no owner) with one slice store and one merge into the free extents.
            if pending is None:
                pool._free_runs(runs)
            else:
                pending += runs  # NOTE: their state words stay stale until the caller frees them
            if freed is not None:
                freed += blocks.tolist()
            n_freed = n
        else:
            n_freed = 0
            st = pool._state
            free = pool._free
            # Inlined decref that also clears the owner, so the pool's ownership hook has nothing to do.
            for b in blocks.tolist():
                c = (int(st[b]) & RC_MASK) - 1
                st[b] = c
                if c == 0:
                    free.put(b, 1)
                    n_freed += 1
                    if freed is not None:
                        freed.append(b)
        node.alive = False
        node.n_solo = 0
        pool._unregister(node)
        self._nodes -= 1
        self._cached_blocks -= n
        self._evicted[reason] += n
        if parent.parent is not None:
            if not parent.children and parent.hold == 0:
                self._lru.add(parent)
        elif not parent.children and not keep_root:
            self._drop_root(parent)
        return n_freed

    def _drop_root(self, root: Node) -> None:
        for ns, r in self._roots.items():
            if r is root:
                del self._roots[ns]
                return

    # ================================================================= leases
    def _lock_path(self, node: Node) -> None:
        pool = self.pool
        x: Node | None = node
        while x is not None and x.parent is not None:
            x.hold += 1
            if x.hold == 1:
                pool._evictable -= x.n_solo
                if x.in_lru:
                    self._lru.discard(x)
            x = x.parent

    def _unlock_path(self, node: Node) -> None:
        pool = self.pool
        x: Node | None = node
        while x is not None and x.parent is not None:
            x.hold -= 1
            if x.hold == 0:
                pool._evictable += x.n_solo
                if not x.children:
                    self._lru.add(x)
            x = x.parent

    def _release(self, lease: Lease) -> None:
        node = lease._node
        lease._node = None
        if node is None or lease._epoch != self._epoch:
            return  # already released, or its nodes went away in flush("force")
        self._leases -= 1
        self._unlock_path(node)

    def _clone_lease(self, lease: Lease) -> Lease:
        if lease._tree is not self:
            raise UnknownLease("clone() of a lease issued by another RadixTree")
        node = lease._node
        if node is None or lease._epoch != self._epoch:
            # Nothing to lock (yet): a live empty lease, which a later insert can lock with.
            return Lease(self, None, self._epoch)
        self._lock_path(node)
        self._leases += 1
        return Lease(self, node, self._epoch)

    def release(self, lease: Lease) -> None:
        """Release ``lease`` (idempotent). Raises UnknownLease for a lease of another tree."""
        if lease._tree is not self:
            raise UnknownLease("release() of a lease issued by another RadixTree")
        lease.release()

    # ================================================================= stats
    @property
    def num_nodes(self) -> int:
        return self._nodes

    @property
    def num_cached_blocks(self) -> int:
        return self._cached_blocks

    @property
    def num_pinned_blocks(self) -> int:
        return self._pinned_blocks

    @property
    def num_leases(self) -> int:
        return self._leases

    def stats(self) -> CacheStats:
        pool = self.pool
        return CacheStats(
            block_size=self.block_size,
            usable_blocks=pool.num_usable,
            free_blocks=pool.num_free,
            evictable_blocks=pool._evictable,
            in_use_blocks=pool.num_in_use,
            cached_blocks=self._cached_blocks,
            pinned_blocks=self._pinned_blocks,
            pin_budget_blocks=self.pin_budget_blocks,
            nodes=self._nodes,
            leases=self._leases,
            hit_tokens=self._hit_tokens,
            miss_tokens=self._miss_tokens,
            evicted_blocks=dict(self._evicted),
        )
