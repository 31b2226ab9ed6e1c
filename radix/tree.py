"""RadixTree: token-exact prefix cache over paged KV blocks (match, insert, leases, pins, eviction)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from radixd.radix.errors import (
    FlushRefused,
    InvalidRequest,
    NotPinned,
    PinBudgetExceeded,
    RadixError,
    UnknownLease,
)
from radixd.radix.lru import LruIndex
from radixd.radix.node import Node, Tokens, common_prefix_len
from radixd.radix.pool import BlockPool, is_run
from radixd.radix.results import CacheStats, InsertResult, Lease, PrefixMatch

FlushMode = Literal["unlocked", "refuse", "force"]
EVICT_REASONS = ("lru", "prefix", "flush", "superseded")


def _as_tokens(tokens: Sequence[int]) -> Tokens:
    return tokens if type(tokens) is tuple else tuple(tokens)


class RadixTree:
    """Prefix cache of KV blocks keyed by (namespace, token ids).

    * ``match`` returns the longest cached prefix as full blocks plus the partially matching next
      block (block id + matched token count) and a :class:`Lease` locking that path.
    * ``insert`` caches any token sequence with its blocks (prompt and generated tokens; the last block
      may be partial) and reports the caller's blocks that duplicate cached ones.
    * ``evict`` frees least-recently-used unlocked, unpinned leaves in O(log n) per node, cascading to
      parents that become leaves; ``evict_prefix``, ``flush``, ``pin`` / ``unpin`` manage the cache.

    Not thread-safe: one owner (the engine thread) drives it.
    """

    # NOTE: ownership invariants (tests/radix check them after every step):
    #  * the tree holds exactly one pool reference per block it stores (per occurrence in a node);
    #  * a block is exactly one of: free / cached-evictable (refcount 1, held by the tree in a node
    #    with hold == 0) / in use; free + evictable + in_use == pool.num_usable;
    #  * a node with hold > 0 (leased or pinned, or an ancestor of one) is never evicted, except by
    #    flush("force"), which also invalidates every outstanding lease (epoch bump);
    #  * different namespaces have different roots and never share a node or a block.

    def __init__(self, pool: BlockPool, pin_budget_fraction: float = 0.25) -> None:
        if not 0.0 <= pin_budget_fraction <= 1.0:
            raise InvalidRequest(f"pin_budget_fraction must be within [0, 1], got {pin_budget_fraction}")
        if pool._tree_attached:
            raise RadixError("this BlockPool already serves a RadixTree; use one tree per pool")
        pool._tree_attached = True
        self.pool = pool
        self.block_size = pool.block_size
        self.pin_budget_blocks = int(pin_budget_fraction * pool.num_usable)
        self._roots: dict[str, Node] = {}
        self._lru = LruIndex()
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

    # ================================================================== lookup
    def match(self, tokens: Sequence[int], namespace: str = "") -> PrefixMatch:
        """Longest cached prefix of ``tokens``; locks it until ``result.lease.release()``.

        Pass a tuple to avoid a copy. To keep at least one token to compute (for logits), match
        ``tokens[:-1]``.
        """
        t = _as_tokens(tokens)
        node, blocks, pblock, ptok = self._walk(t, namespace, touch=True)
        num_tokens = len(blocks) * self.block_size
        self._hit_tokens += num_tokens + ptok
        self._miss_tokens += len(t) - num_tokens - ptok
        if node is None:
            return PrefixMatch(blocks, num_tokens, pblock, ptok, Lease(self, None, self._epoch))
        self._lock_path(node)
        self._leases += 1
        return PrefixMatch(blocks, num_tokens, pblock, ptok, Lease(self, node, self._epoch))

    def peek(self, tokens: Sequence[int], namespace: str = "") -> int:
        """Cached prefix length of ``tokens`` (full + partial block tokens); no lock, LRU or stats change."""
        _node, blocks, _pb, ptok = self._walk(_as_tokens(tokens), namespace, touch=False)
        return len(blocks) * self.block_size + ptok

    def _walk(self, t: Tokens, namespace: str, touch: bool) -> tuple[Node | None, list[int], int | None, int]:
        """(deepest node used or None, full blocks, partial block, partial tokens)."""
        blocks: list[int] = []
        node = self._roots.get(namespace)
        if node is None:
            return None, blocks, None, 0
        B = self.block_size
        n = len(t)
        pos = 0
        clock = self._clock
        while pos + B <= n:
            child = node.children.get(t[pos : pos + B])
            if child is None:
                break
            if touch:
                # Every touched node ends up on the leased path, so it leaves the LRU index anyway.
                if child.in_lru:
                    self._lru.discard(child)
                clock += 1
                child.tick = clock
            ct = child.tokens
            L = len(ct)
            if t[pos : pos + L] == ct and not L % B:
                blocks += child.blocks
                pos += L
                node = child
                continue
            # The query leaves this node inside it (or covers its partial last block).
            m = common_prefix_len(t, pos, ct)
            k = m // B
            blocks += child.blocks[:k]
            self._clock = clock
            r = m - k * B
            return child, blocks, (child.blocks[k] if r else None), r
        self._clock = clock
        if B > 1 and pos < n and node.by_first:
            best, best_len = self._best_partial(node, t, pos)
            if best is not None:
                if touch:
                    self._lru.discard(best)
                    self._clock += 1
                    best.tick = self._clock
                return best, blocks, best.blocks[0], best_len
        return (node if node.parent is not None else None), blocks, None, 0

    def _best_partial(self, node: Node, t: Tokens, pos: int) -> tuple[Node | None, int]:
        """The child whose first block shares the longest (partial) prefix with t[pos:pos+B]."""
        by_first = node.by_first
        cands = by_first.get(t[pos]) if by_first is not None else None
        best: Node | None = None
        best_len = 0
        if cands:
            q = t[pos : pos + self.block_size]
            for c in cands:
                m = common_prefix_len(q, 0, c.key)
                if m > best_len:
                    best, best_len = c, m
        return best, best_len

    # ================================================================== insert
    def insert(
        self,
        tokens: Sequence[int],
        blocks: Sequence[int],
        namespace: str = "",
        lease: Lease | None = None,
        *,
        donate: bool = False,
    ) -> InsertResult:
        """Cache ``tokens`` whose KV lives in ``blocks`` (``ceil(len(tokens) / block_size)`` of them).

        The tree takes one reference on each block it adopts; the caller keeps its own. Blocks at
        positions the tree already caches in other blocks are returned as duplicates. If ``lease`` (a
        live lease of this tree) is given it is moved to the inserted path, so the caller's blocks stay
        protected until it releases the lease.

        ``donate=True`` hands the tree the caller's single reference on every block that is not already
        the tree's own block at its position (typically: the blocks the caller allocated for the
        uncached suffix). Adopted blocks keep that reference, duplicates are released by the tree, and
        the caller must not release any of them afterwards. It saves a pass over the blocks.
        """
        t = _as_tokens(tokens)
        B = self.block_size
        n = len(t)
        nb = -(-n // B)
        if len(blocks) != nb:
            raise InvalidRequest(f"insert of {n} tokens needs ceil({n}/{B}) = {nb} blocks, got {len(blocks)}")
        if lease is not None and lease._tree is not self:
            raise UnknownLease("insert(lease=...) got a lease issued by another RadixTree")
        if n == 0:
            return InsertResult([], 0, 0)
        if type(blocks) is not list:
            blocks = list(blocks)
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = Node((), [], None, (), 0)
        node = root
        dups: list[int] = []
        j = 0
        nf = n // B
        clock = self._clock
        while j < nf:
            pos = j * B
            child = node.children.get(t[pos : pos + B])
            if child is None:
                break
            clock += 1
            self._touch(child, clock)
            ct = child.tokens
            cb = child.blocks
            L = len(ct)
            if t[pos : pos + L] == ct and not L % B:
                mine = blocks[j : j + len(cb)]
                if mine != cb:
                    dups.extend(a for a, c in zip(mine, cb, strict=True) if a != c)
                j += len(cb)
                node = child
                continue
            k = common_prefix_len(t, pos, ct) // B  # >= 1: the first block matched as a key
            mine = blocks[j : j + k]
            dups.extend(a for a, c in zip(mine, cb, strict=False) if a != c)
            node = self._split(child, k)
            j += k
            break
        self._clock = clock
        new_tokens = 0
        final = node
        if j < nb:
            rest = t[j * B :]
            rest_blocks = blocks[j:]
            covered = self._settle_partial(node, rest, rest_blocks, dups) if B > 1 else None
            if covered is not None:
                final = covered
            else:
                final = self._add_leaf(node, rest, rest_blocks, donate)
                new_tokens = len(rest)
        if lease is not None and lease._node is not None and lease._epoch == self._epoch:
            old = lease._node
            self._lock_path(final)
            self._unlock_path(old)
            lease._node = final
        if donate and dups:
            self.pool.decref_all(dups)
        return InsertResult(dups, n - new_tokens, new_tokens)

    def _settle_partial(
        self, node: Node, rest: Tokens, rest_blocks: list[int], dups: list[int]
    ) -> Node | None:
        """Resolve partial-block overlaps between ``rest`` and ``node``'s children.

        Returns the child that already covers ``rest`` (``rest`` is a single partial block whose tokens
        begin a cached block) after recording the duplicate; otherwise drops unleased single-block
        partial leaves that ``rest`` supersedes and returns None (the caller adds ``rest`` as a leaf).
        """
        by_first = node.by_first
        cands = by_first.get(rest[0]) if by_first is not None else None
        if not cands:
            return None
        first = rest[: self.block_size]
        lf = len(first)
        for c in list(cands):
            key = c.key
            if len(key) >= lf:
                if lf < self.block_size and key[:lf] == first:
                    if rest_blocks[0] != c.blocks[0]:
                        dups.append(rest_blocks[0])
                    self._clock += 1
                    self._touch(c, self._clock)
                    return c
            elif first[: len(key)] == key and c.hold == 0:
                # c is a one-block partial leaf whose tokens are a prefix of ours: ours supersedes it.
                self._remove_leaf(c, "superseded", None, keep_root=True)
        return None

    def _add_leaf(self, parent: Node, tokens: Tokens, blocks: list[int], donate: bool) -> Node:
        pool = self.pool
        rc = pool._rc
        owner = pool._owner
        nblocks = pool.num_blocks
        self._clock += 1
        leaf = Node(tokens, blocks, parent, tokens[: self.block_size], self._clock)
        step = 0 if donate else 1  # donated blocks keep the caller's reference; others gain one
        n = len(blocks)
        a = blocks[0]
        if is_run(blocks) and a > 0 and a + n <= nblocks:
            seg = rc[a : a + n]
            if 0 not in seg and owner[a : a + n].count(None) == n:
                # Contiguous, allocated, not cached yet: adopt with slice stores.
                if donate:
                    solo = seg.count(1)
                else:
                    rc[a : a + n] = [c + 1 for c in seg]
                    solo = 0
                owner[a : a + n] = [leaf] * n
                return self._finish_leaf(parent, leaf, solo)
        # One pass: validate and adopt; undo on the first bad block so a failed insert changes nothing.
        solo = 0
        for i, b in enumerate(blocks):
            if not 0 < b < nblocks or rc[b] == 0 or owner[b] is not None:
                cached = 0 < b < nblocks and rc[b] > 0
                for a in blocks[:i]:
                    rc[a] -= step
                    owner[a] = None
                if parent.parent is None and not parent.children:
                    self._drop_root(parent)  # created for this insert only
                if cached:
                    raise InvalidRequest(
                        f"block {b} is already cached by the tree (or given twice); "
                        "every position needs its own block"
                    )
                pool._bad_incref(b)
            # Without donate the caller keeps its reference, so the count goes to >= 2 and n_solo
            # starts at 0; the pool's hook keeps it exact when the caller drops its reference later.
            c = rc[b] + step
            rc[b] = c
            if c == 1:
                solo += 1
            owner[b] = leaf
        return self._finish_leaf(parent, leaf, solo)

    def _finish_leaf(self, parent: Node, leaf: Node, solo: int) -> Node:
        leaf.n_solo = solo
        self.pool._evictable += solo
        self._link(parent, leaf)
        self._nodes += 1
        self._cached_blocks += len(leaf.blocks)
        self._lru.add(leaf)
        return leaf

    # ============================================================ structure
    def _touch(self, node: Node, tick: int) -> None:
        if node.in_lru:
            self._lru.discard(node)
            node.tick = tick
            self._lru.add(node)
        else:
            node.tick = tick

    def _link(self, parent: Node, child: Node) -> None:
        if parent.in_lru:
            self._lru.discard(parent)
        parent.children[child.key] = child
        if self.block_size > 1:
            by_first = parent.by_first
            if by_first is None:
                by_first = parent.by_first = {}
            lst = by_first.get(child.key[0])
            if lst is None:
                by_first[child.key[0]] = [child]
            else:
                lst.append(child)

    def _unlink(self, parent: Node, child: Node) -> None:
        del parent.children[child.key]
        by_first = parent.by_first
        if by_first is not None:
            lst = by_first[child.key[0]]
            if len(lst) == 1:
                del by_first[child.key[0]]
            else:
                lst.remove(child)

    def _split(self, child: Node, k: int) -> Node:
        """Split ``child`` after its first ``k`` blocks; returns the new upper node.

        The lower part keeps the node's identity, so leases and pins that end at it stay valid and
        keep covering the whole path (the upper part inherits their hold and pin counts).
        """
        B = self.block_size
        parent = child.parent
        if parent is None or not 0 < k < len(child.blocks):
            raise RadixError(f"internal: cannot split a node of {len(child.blocks)} blocks at {k}")
        ct = child.tokens
        upper = Node(ct[: k * B], child.blocks[:k], parent, child.key, child.tick)
        self._clock += 1
        self._touch(child, self._clock)  # keep ticks unique: the upper part took the old one
        # Re-seat: same key in the parent, so replace in place.
        parent.children[upper.key] = upper
        if parent.by_first is not None:
            lst = parent.by_first[upper.key[0]]
            lst[lst.index(child)] = upper
        child.tokens = ct[k * B :]
        child.blocks = child.blocks[k:]
        child.key = child.tokens[:B]
        child.parent = upper
        upper.children[child.key] = child
        if B > 1:
            upper.by_first = {child.key[0]: [child]}
        upper.hold = child.hold
        upper.pin = child.pin
        rc = self.pool._rc
        owner = self.pool._owner
        solo = 0
        for b in upper.blocks:
            owner[b] = upper
            if rc[b] == 1:
                solo += 1
        upper.n_solo = solo
        child.n_solo -= solo
        self._nodes += 1
        return upper

    def _remove_leaf(self, node: Node, reason: str, freed: list[int] | None, keep_root: bool = False) -> None:
        """Drop a leaf and its tree references; appends blocks that became free to ``freed``."""
        parent = node.parent
        if parent is None or node.children:
            raise RadixError("internal: only a leaf can be removed")
        self._unlink(parent, node)
        self._lru.discard(node)
        pool = self.pool
        if node.hold == 0:
            pool._evictable -= node.n_solo
        owner = pool._owner
        rc = pool._rc
        free = pool._free
        blocks = node.blocks
        n = len(blocks)
        if node.n_solo == n:
            # Fast path (the common case): nobody else holds any of them, so all become free.
            if is_run(blocks):
                a = blocks[0]
                owner[a : a + n] = [None] * n
                rc[a : a + n] = [0] * n
            else:
                for b in blocks:
                    owner[b] = None
                    rc[b] = 0
            free.extend(blocks)
            if freed is not None:
                freed.extend(blocks)
        else:
            # Inlined decref: owner is cleared first, so the pool's ownership hook has nothing to do.
            for b in blocks:
                owner[b] = None
                c = rc[b] - 1
                rc[b] = c
                if c == 0:
                    free.append(b)
                    if freed is not None:
                        freed.append(b)
        node.alive = False
        node.n_solo = 0
        self._nodes -= 1
        self._cached_blocks -= len(node.blocks)
        self._evicted[reason] += len(node.blocks)
        if parent.parent is not None:
            if not parent.children and parent.hold == 0:
                self._lru.add(parent)
        elif not parent.children and not keep_root:
            self._drop_root(parent)

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
        self._unlock_path(node)
        self._leases -= 1

    def _clone_lease(self, lease: Lease) -> Lease:
        if lease._tree is not self:
            raise UnknownLease("clone() of a lease issued by another RadixTree")
        node = lease._node
        if node is None or lease._epoch != self._epoch:
            return Lease(self, None, self._epoch)
        self._lock_path(node)
        self._leases += 1
        return Lease(self, node, self._epoch)

    def release(self, lease: Lease) -> None:
        """Release ``lease`` (idempotent). Raises UnknownLease for a lease of another tree."""
        if lease._tree is not self:
            raise UnknownLease("release() of a lease issued by another RadixTree")
        lease.release()

    # =============================================================== eviction
    def evictable_blocks(self) -> int:
        """Blocks that evicting every unlocked, unpinned entry would free (exact, O(1))."""
        return self.pool._evictable

    def evict(self, n_blocks: int) -> list[int]:
        """Free at least ``n_blocks`` blocks if possible, least recently used leaves first.

        Returns the blocks that became free (fewer when not enough is evictable). O(log n) per node.
        """
        freed: list[int] = []
        lru = self._lru
        while len(freed) < n_blocks and len(lru):
            self._remove_leaf(lru.pop_oldest(), "lru", freed)
        return freed

    def evict_prefix(self, tokens: Sequence[int], namespace: str = "") -> int:
        """Drop every unlocked, unpinned cached sequence that starts with ``tokens``.

        An empty ``tokens`` means the whole namespace. Returns the number of blocks dropped.
        """
        root = self._roots.get(namespace)
        if root is None:
            return 0
        t = _as_tokens(tokens)
        before = self._evicted["prefix"]
        for top in self._subtrees_with_prefix(root, t):
            self._evict_subtree(top, "prefix")
        return self._evicted["prefix"] - before

    def _subtrees_with_prefix(self, root: Node, t: Tokens) -> list[Node]:
        B = self.block_size
        node = root
        pos = 0
        n = len(t)
        while pos < n:
            rem = n - pos
            if rem >= B:
                child = node.children.get(t[pos : pos + B])
                if child is None:
                    return []
                L = len(child.tokens)
                if rem <= L:
                    return [child] if child.tokens[:rem] == t[pos:] else []
                if L % B or child.tokens != t[pos : pos + L]:
                    return []
                node = child
                pos += L
            else:
                by_first = node.by_first
                cands = by_first.get(t[pos], []) if by_first is not None else []
                return [c for c in cands if c.tokens[:rem] == t[pos:]]
        return list(node.children.values()) if node.parent is None else [node]

    def _evict_subtree(self, top: Node, reason: str) -> None:
        order: list[Node] = []
        stack = [top]
        while stack:
            x = stack.pop()
            if x.hold == 0:
                order.append(x)
                stack.extend(x.children.values())
            else:
                stack.extend(c for c in x.children.values())
        for x in reversed(order):  # children before their parents
            if x.alive and not x.children and x.hold == 0:
                self._remove_leaf(x, reason, None)

    def flush(self, mode: FlushMode = "unlocked", include_pinned: bool = False) -> int:
        """Drop cached entries; returns the number of blocks the tree released.

        * ``"unlocked"``: evict everything not leased (and not pinned unless ``include_pinned``).
        * ``"refuse"``: like ``"unlocked"`` but raise FlushRefused (changing nothing) while any lease is
          held. (Waiting for idle is the engine's job: it retries once its requests have drained.)
        * ``"force"``: drop everything, leased and pinned included; outstanding leases become inert
          (releasing them later is a no-op). Blocks still held by tables stay allocated to them.
        """
        if mode not in ("unlocked", "refuse", "force"):
            raise InvalidRequest(f"flush mode must be 'unlocked', 'refuse' or 'force', got {mode!r}")
        if mode == "refuse" and self._leases:
            raise FlushRefused(
                f"flush refused: {self._leases} lease(s) still held; release them or flush('unlocked')"
            )
        before = self._cached_blocks
        if mode == "force":
            self._force_clear()
            return before
        if include_pinned:
            for ns, toks in list(self._pins):
                self.unpin(toks, ns)
        lru = self._lru
        while len(lru):
            self._remove_leaf(lru.pop_oldest(), "flush", None)
        return before - self._cached_blocks

    def _force_clear(self) -> None:
        pool = self.pool
        owner = pool._owner
        dropped = 0
        for root in self._roots.values():
            stack = list(root.children.values())
            while stack:
                x = stack.pop()
                stack.extend(x.children.values())
                if x.hold == 0:
                    pool._evictable -= x.n_solo
                for b in x.blocks:
                    owner[b] = None
                    pool.decref(b)
                dropped += len(x.blocks)
                x.alive = False
                x.in_lru = False
        self._evicted["flush"] += dropped
        self._roots.clear()
        self._lru = LruIndex()
        self._pins.clear()
        self._nodes = self._cached_blocks = self._pinned_blocks = self._leases = 0
        self._epoch += 1

    # ================================================================== pins
    def pin(self, tokens: Sequence[int], namespace: str = "") -> int:
        """Exempt the cached prefix of ``tokens`` from eviction; returns the number of tokens pinned.

        Pins whole cached blocks (a partial trailing block only when it ends a cached leaf). Pinning
        the same tokens again is a no-op. Raises PinBudgetExceeded, changing nothing, when the newly
        pinned blocks would exceed the budget (``pin_budget_fraction`` of the pool).
        """
        t = _as_tokens(tokens)
        key = (namespace, t)
        done = self._pins.get(key)
        if done is not None:
            return self._depth_tokens(done)
        root = self._roots.get(namespace)
        if root is None:
            return 0
        node = self._pin_target(root, t)
        if node is None:
            return 0
        add = 0
        x: Node | None = node
        while x is not None and x.parent is not None:
            if x.pin == 0:
                add += len(x.blocks)
            x = x.parent
        if self._pinned_blocks + add > self.pin_budget_blocks:
            raise PinBudgetExceeded(
                f"pinning {add} more blocks would exceed the pin budget: {self._pinned_blocks} of "
                f"{self.pin_budget_blocks} already pinned; unpin something or raise pin_budget_fraction"
            )
        pool = self.pool
        x = node
        while x is not None and x.parent is not None:
            x.pin += 1
            x.hold += 1
            if x.pin == 1:
                self._pinned_blocks += len(x.blocks)
            if x.hold == 1:
                pool._evictable -= x.n_solo
                self._lru.discard(x)
            x = x.parent
        self._pins[key] = node
        return self._depth_tokens(node)

    def _pin_target(self, root: Node, t: Tokens) -> Node | None:
        """Deepest node fully covered by ``t`` (splitting at a block boundary when ``t`` ends inside)."""
        B = self.block_size
        node = root
        pos = 0
        n = len(t)
        while pos < n:
            child = node.children.get(t[pos : pos + B]) if pos + B <= n else node.children.get(t[pos:])
            if child is None:
                break
            L = len(child.tokens)
            if t[pos : pos + L] == child.tokens:
                node = child
                pos += L
                if L % B:
                    break
                continue
            k = common_prefix_len(t, pos, child.tokens) // B
            if k >= 1:
                node = self._split(child, k)
            break
        return node if node.parent is not None else None

    def _depth_tokens(self, node: Node) -> int:
        total = 0
        x: Node | None = node
        while x is not None:
            total += len(x.tokens)
            x = x.parent
        return total

    def unpin(self, tokens: Sequence[int], namespace: str = "") -> int:
        """Undo :meth:`pin` of exactly these tokens; returns the tokens unpinned. Raises NotPinned."""
        key = (namespace, _as_tokens(tokens))
        node = self._pins.pop(key, None)
        if node is None:
            raise NotPinned(
                f"no pin for these {len(key[1])} tokens in namespace {namespace!r}; "
                "unpin takes the same tokens that were pinned"
            )
        pool = self.pool
        x: Node | None = node
        while x is not None and x.parent is not None:
            x.pin -= 1
            x.hold -= 1
            if x.pin == 0:
                self._pinned_blocks -= len(x.blocks)
            if x.hold == 0:
                pool._evictable += x.n_solo
                if not x.children:
                    self._lru.add(x)
            x = x.parent
        return self._depth_tokens(node)

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
