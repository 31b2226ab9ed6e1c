"""RadixTree: token-exact prefix cache over paged KV blocks (match, insert, leases, pins, eviction).

Composed of the owners of its state: NodeStore (nodes, LRU, counts; the one descent), Holds, Pins, and
the pool's CacheOwnership (block owners). The tree decides what changes and counts hits and misses.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixd.radix.blockids import EMPTY, ID_BYTES, BlockIds, differing_ids
from radixd.radix.errors import InvalidRequest, UnknownLease
from radixd.radix.events import CacheListener
from radixd.radix.holds import Holds
from radixd.radix.lease import Lease
from radixd.radix.node import TOKEN_BYTES, Node, TokenKey, Tokens, as_tokens, token_ids
from radixd.radix.pins import Pins
from radixd.radix.pool import BlockPool
from radixd.radix.results import CacheStats, InsertResult, PrefixMatch
from radixd.radix.store import NodeStore
from radixd.radix.table import BlockTable

RUN_EVICTION_BUDGET = 2
"""Blocks `evict_for_run` may evict per block asked for (docs/measurements/bench-kernels.md)."""

__all__ = ["RadixTree"]

Key = Sequence[int] | bytes | TokenKey


class RadixTree:
    """Prefix cache of KV blocks keyed by (namespace, token ids); one owner (the engine thread)."""

    # NOTE: ownership invariants (radixd.radix.verify checks them; tests/radix after every step):
    #  * the tree holds exactly one pool reference per block it stores (per occurrence in a node);
    #  * a block is exactly one of: free / cached-evictable (refcount 1, held by the tree in a node
    #    with hold == 0) / in use; free + evictable + in_use == pool.num_usable;
    #  * a node with hold > 0 (leased or pinned, or an ancestor of one) is never evicted;
    #  * different namespaces have different roots and never share a node or a block.

    def __init__(self, pool: BlockPool, pin_budget_fraction: float = 0.25) -> None:
        if not 0.0 <= pin_budget_fraction <= 1.0:
            raise InvalidRequest(f"pin_budget_fraction must be within [0, 1], got {pin_budget_fraction}")
        self.ownership = pool.attach_cache()
        self.pool = pool
        self.block_size = pool.block_size
        self._bb = pool.block_size * TOKEN_BYTES  # a block's tokens, in packed bytes
        self.store = NodeStore(self.ownership, pool.block_size)
        self.holds = Holds(self.ownership, self.store.lru)
        self._pins = Pins(self.store, self.holds, int(pin_budget_fraction * pool.num_usable))
        self._hit_tokens = 0
        self._miss_tokens = 0

    @property
    def listener(self) -> CacheListener | None:
        """Observer of content changes (see radix/events.py; ``FanOut`` feeds several)."""
        return self.store.listener

    @listener.setter
    def listener(self, listener: CacheListener | None) -> None:
        self.store.listener = listener

    # ================================================================== lookup
    def match(self, tokens: Key, namespace: str = "") -> PrefixMatch:
        """Longest cached prefix of ``tokens`` (full blocks + the partially matching next block), locked
        until ``result.lease.release()`` (a node the match ends inside is split after the blocks it
        reuses); an empty match's lease locks the path its insert creates."""
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        node, blocks, pblock, ptok = self._walk(t, namespace, True)
        num_tokens = bytes.__len__(blocks) // ID_BYTES * self.block_size
        self._hit_tokens += num_tokens + ptok
        self._miss_tokens += len(t) // TOKEN_BYTES - num_tokens - ptok
        holds = self.holds
        if node is not None:
            holds.lease(node)
        return PrefixMatch(blocks, num_tokens, pblock, ptok, Lease(holds, node, namespace))

    def peek(self, tokens: Key, namespace: str = "") -> int:
        """Cached prefix length of ``tokens`` (full + partial block tokens); no lock, LRU or stats change."""
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        _node, blocks, _pb, ptok = self._walk(t, namespace, False)
        return len(blocks) * self.block_size + ptok

    def following(self, tokens: Key, namespace: str = "", max_tokens: int = 8) -> list[int]:
        """Up to ``max_tokens`` cached tokens right after the whole of ``tokens`` (a speculative draft),
        along the most recently used branch; [] when none. Read-only: no lock, LRU or stats change."""
        if max_tokens <= 0:
            return []
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        root = self.store.roots.get(namespace)
        if root is None:
            return []
        path, child, m = self.store.descend(t, root)
        node = path[-1] if path else root
        if child is not None:  # the query leaves the path inside this child's edge
            if node.end + m != len(t):
                return []  # they differ before the query's end
            node, off = child, m
        else:
            rest = t[node.end :]
            if len(rest) >= self._bb:
                return []  # a whole block more than any cached continuation of the path
            # A partial-block leaf may hold exactly ``rest`` and nothing after it: only children with
            # something past ``rest`` can draft.
            starting = [c for c in node.children_starting(rest) if len(c.tokens) > len(rest) or c.children]
            if not starting and rest:
                return []
            if starting:
                node, off = max(starting, key=_tick), len(rest)
            else:
                off = len(node.tokens)
        want = max_tokens * TOKEN_BYTES
        parts = [node.tokens[off : off + want]]
        got = len(parts[0])
        while got < want and node.children:
            node = max(node.children.values(), key=_tick)
            parts.append(node.tokens[: want - got])
            got += len(parts[-1])
        return token_ids(b"".join(parts))

    def _walk(self, t: Tokens, namespace: str, use: bool) -> tuple[Node | None, BlockIds, int | None, int]:
        """(deepest node matched or None, full blocks, partial block, partial tokens) of key ``t``;
        ``use``: the matched nodes get new ticks and leave the LRU index (a lease will lock them)."""
        store = self.store
        root = store.roots.get(namespace)
        if root is None:
            return None, EMPTY, None, 0
        path, child, m = store.descend(t, root)
        if child is not None:  # the query leaves the path inside this child's edge
            k = m // self._bb
            r = (m - k * self._bb) // TOKEN_BYTES
            head = bytes.__getitem__(child.blocks, slice(0, k * ID_BYTES))  # k >= 1: a key matched
            blocks = BlockIds(b"".join([x.blocks for x in path]) + head if path else head)
            if use:
                child = self._reused_part(child, k + (1 if r else 0))
                path.append(child)
                store.lru.use(path)
            return child, blocks, (child.blocks[k] if r else None), r
        node = path[-1] if path else root
        pos = node.end
        # The blocks of the whole nodes (usually one node's own BlockIds, shared as is).
        if len(path) == 1:
            blocks = path[0].blocks
        else:
            blocks = BlockIds(b"".join([x.blocks for x in path])) if path else EMPTY
        by_first = node.by_first
        if by_first and t[pos : pos + TOKEN_BYTES] in by_first:  # a child may share part of a block
            best, best_len = node.best_partial(t[pos : pos + self._bb])
            if best is not None:
                if use:
                    best = self._reused_part(best, 1)
                    path.append(best)
                    store.lru.use(path)
                return best, blocks, best.blocks[0], best_len
        if use and path:
            store.lru.use(path)
        return (node if node.parent is not None else None), blocks, None, 0

    def _reused_part(self, node: Node, k: int) -> Node:
        """``node``'s first ``k`` blocks, split off when it has more: the node a match ending inside
        ``node`` locks. NOTE: a lease locks only the blocks its request reuses (with a partially matched
        block, which it copies), so the rest of a long cached node stays evictable while it runs."""
        return self.store.split(node, k) if k < len(node.blocks) else node

    # ================================================================== insert
    def insert_table(
        self,
        tokens: Key,
        table: BlockTable,
        n_blocks: int,
        namespace: str,
        lease: Lease,
        *,
        final: bool = False,
    ) -> InsertResult:
        """Cache ``tokens`` (exactly ``n_blocks`` blocks of ``table``) for the owner of ``lease``: the blocks
        after the table's ``leased`` ones are donated (duplicates of cached ones released, the table then
        reads the tree's), and ``lease`` moves onto the path unless ``final`` (table and lease end next)."""
        done = table.leased
        blocks = table.blocks
        if not done <= n_blocks <= len(blocks):
            raise InvalidRequest(f"insert_table of {n_blocks} blocks outside [{done}, {len(blocks)}]")
        if not lease.issued_by(self.holds):
            raise UnknownLease("insert_table got a lease issued by another RadixTree")
        if done and not lease.locks_path:
            raise InvalidRequest(f"insert_table: the table leases {done} blocks but its lease locks nothing")
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        n = bytes.__len__(t)
        bb = self._bb
        if n_blocks != -(-n // bb) or done > n // bb:
            raise _bad_insert(self.block_size, n, n_blocks - done, done)
        if n == 0:
            return InsertResult([], 0, 0)
        # The table's new blocks in one copy, as the immutable BlockIds a new leaf can keep as it is.
        with memoryview(blocks) as mv:
            new_blocks = BlockIds(mv[done:n_blocks])
        # A sequence's path grows a node per block it fills: walking it from the root on every insert
        # would be quadratic, so the walk starts where its lease ends (a final insert walks from the
        # root, marking the whole path used).
        start = None if final else lease.resume_point(t, done * bb, namespace)
        end, dups, new_tokens = self._insert(t, new_blocks, namespace, done, start)
        if not final:
            lease.follow(end, namespace)
        if dups:
            self.pool.decref_all(dups)
        n_tokens = n // TOKEN_BYTES
        # Positions cached before this insert (a leaf added now starts on a block boundary).
        known = n_blocks if new_tokens == 0 else (n_tokens - new_tokens) // self.block_size
        if known > done:
            # The table's blocks done..known sat at positions the tree had cached: it reads the tree's.
            theirs = None
            if dups:
                _node, full, partial, _ptok = self._walk(t[: known * bb], namespace, False)
                theirs = full.tolist() + ([partial] if partial is not None else [])
            table.settle_cached(done, known, dups, theirs)
        table.leased_up_to(n_blocks)
        return InsertResult(dups, n_tokens - new_tokens, new_tokens)

    def _insert(
        self, t: Tokens, bl: BlockIds, namespace: str, c: int, start: Node | None
    ) -> tuple[Node, list[int], int]:
        """Cache key ``t`` with blocks ``bl`` after ``c`` of the tree's own blocks, walking from ``start``
        (a node spelling ``t``'s first ``c`` blocks) or the root; -> (end node, duplicates, new tokens).
        InvalidRequest, with nothing changed, when the tree does not cache ``t``'s first ``c`` blocks."""
        store = self.store
        B = self._bb
        n = len(t)
        root = store.root_for_insert(namespace)
        path, child, m = store.descend(t, root if start is None else start)
        if child is not None:
            path.append(child)
            store.lru.touch_all(path)
            path.pop()
        elif path:
            store.lru.touch_all(path)
        dups: list[int] = []
        # Where the caller gave blocks (positions from c on: bl[i] is the block of position c + i), are
        # they the tree's own? Others are duplicates.
        for x in path:
            cb = x.blocks
            k = bytes.__len__(cb) // ID_BYTES
            j = (x.end - len(x.tokens)) // B
            if j >= c:
                if not bl.startswith(cb, (j - c) * ID_BYTES):
                    dups += differing_ids(bl, j - c, cb, 0, k)
            elif j + k > c:
                dups += differing_ids(bl, 0, cb, c - j, k)
        node = path[-1] if path else root if start is None else start
        j = node.end // B
        if child is not None:
            k = m // B  # >= 1: the first block matched as a key
            if j + k < c:  # the cached prefix would end inside this node: reported below, nothing split
                j += k
            else:
                if j + k > c:
                    lo = max(c - j, 0)
                    dups += differing_ids(bl, j + lo - c, child.blocks, lo, k)
                node = store.split(child, k)
                j += k
        if j < c:
            store.drop_if_empty_root(root)  # created for this insert only
            raise InvalidRequest(
                f"insert(cached={c}): only {j} leading blocks of these tokens are cached, but the table "
                "leases more: its lease must lock them until the insert"
            )
        if j == -(-n // B):
            return node, dups, 0
        rest = t[j * B :]
        # A BlockIds is immutable: when it is all new, the node can share the caller's object.
        rest_blocks = bl if j == c else BlockIds(memoryview(bl)[(j - c) * ID_BYTES :])
        by_first = node.by_first
        if by_first is not None and rest[:TOKEN_BYTES] in by_first:  # else no sibling can overlap
            covered = store.settle_partial(node, rest, rest_blocks, dups)
            if covered is not None:
                return covered, dups, 0
        return store.add_leaf(node, rest, rest_blocks, True), dups, len(rest) // TOKEN_BYTES

    # ================================================================= leases
    def release(self, lease: Lease) -> None:
        """Release ``lease`` (idempotent). Raises UnknownLease for a lease of another tree."""
        if not lease.issued_by(self.holds):
            raise UnknownLease("release() of a lease issued by another RadixTree")
        lease.release()

    # =============================================================== eviction
    def evictable_blocks(self) -> int:
        """Blocks that evicting every unlocked, unpinned entry would free (exact, O(1))."""
        return self.pool.num_evictable

    def evict(self, n_blocks: int) -> list[int]:
        """Free at least ``n_blocks`` blocks if possible, least recently used leaves first; -> the freed
        blocks. O(log n) per node."""
        freed: list[int] = []
        self.store.evict_lru(n_blocks, freed)
        return freed

    def evict_count(self, n_blocks: int) -> int:
        """:meth:`evict`, returning only how many blocks became free (no list of ids is built)."""
        return self.store.evict_lru(n_blocks, None)

    def evict_for_run(self, n_blocks: int, budget: int | None = None) -> int:
        """Evict LRU leaves (about ``budget`` blocks, ``RUN_EVICTION_BUDGET * n_blocks`` by default) until
        ``n_blocks`` consecutive ids are free, so an allocation is one run; -> blocks freed."""
        pool = self.pool
        if n_blocks <= 1:
            return 0
        limit = RUN_EVICTION_BUDGET * n_blocks if budget is None else budget
        got = 0
        while got < limit and not pool.holds_run(n_blocks):
            freed = self.store.evict_lru(1, None)
            if not freed:
                break
            got += freed
        return got

    def evict_prefix(self, tokens: Key, namespace: str = "") -> int:
        """Drop every unlocked, unpinned cached sequence starting with ``tokens`` ([]: the whole
        namespace); -> blocks dropped."""
        store = self.store
        root = store.roots.get(namespace)
        if root is None:
            return 0
        t = as_tokens(tokens)
        path, child, m = store.descend(t, root)
        node = path[-1] if path else root
        rest = len(t) - node.end
        if child is not None:  # t ends inside this child's edge, or leaves it
            tops = [child] if m == rest else []
        elif rest == 0:
            tops = [node] if node is not root else list(root.children.values())
        elif rest < self._bb:  # children may start with t's last, partial block
            tops = node.children_starting(t[node.end :])
        else:
            tops = []
        return sum(store.evict_subtree(top, "prefix") for top in tops)

    def flush(self) -> int:
        """Evict every cached entry that no lease or pin holds; -> blocks the tree released."""
        store = self.store
        before = store.num_cached_blocks
        store.evict_lru(before + 1, None, "flush")
        return before - store.num_cached_blocks

    # ================================================================== pins
    def pin(self, tokens: Key, namespace: str = "") -> int:
        """Exempt the cached prefix of ``tokens`` (whole blocks) from eviction; -> tokens pinned. Again: a
        no-op. PinBudgetExceeded, with nothing changed, past ``pin_budget_fraction`` of the pool."""
        return self._pins.pin(as_tokens(tokens), namespace)

    def unpin(self, tokens: Key, namespace: str = "") -> int:
        """Undo :meth:`pin` of exactly these tokens; returns the tokens unpinned. Raises NotPinned."""
        return self._pins.unpin(as_tokens(tokens), namespace)

    # ================================================================= stats
    def replay(self, listener: CacheListener) -> int:
        """Report every cached node to ``listener`` as ``stored``, parents first (an observer attached
        late starts from the content); -> nodes reported."""
        return self.store.replay(listener)

    @property
    def num_nodes(self) -> int:
        return self.store.num_nodes

    @property
    def num_cached_blocks(self) -> int:
        return self.store.num_cached_blocks

    @property
    def num_pinned_blocks(self) -> int:
        return self._pins.num_pinned_blocks

    @property
    def pin_budget_blocks(self) -> int:
        return self._pins.budget_blocks

    @property
    def num_leases(self) -> int:
        return self.holds.num_leases

    def stats(self) -> CacheStats:
        pool = self.pool
        store = self.store
        return CacheStats(
            block_size=self.block_size,
            usable_blocks=pool.num_usable,
            free_blocks=pool.num_free,
            evictable_blocks=pool.num_evictable,
            in_use_blocks=pool.num_in_use,
            cached_blocks=store.num_cached_blocks,
            pinned_blocks=self._pins.num_pinned_blocks,
            pin_budget_blocks=self._pins.budget_blocks,
            nodes=store.num_nodes,
            leases=self.holds.num_leases,
            hit_tokens=self._hit_tokens,
            miss_tokens=self._miss_tokens,
            evicted_blocks=dict(store.evicted),
        )


def _bad_insert(block_size: int, n: int, got: int, cached: int) -> InvalidRequest:
    """The error for an insert whose block count (or ``cached``) does not fit its ``n`` key bytes."""
    nt, bs = n // TOKEN_BYTES, block_size
    if not 0 <= cached <= nt // bs:
        return InvalidRequest(
            f"insert(cached={cached}) must be within [0, {nt // bs}]: the full blocks of {nt} tokens"
        )
    need = (
        f"ceil({nt}/{bs}) - {cached} = {-(-nt // bs) - cached} blocks"
        if cached
        else f"ceil({nt}/{bs}) = {-(-nt // bs)} blocks"
    )
    return InvalidRequest(f"insert of {nt} tokens needs {need}, got {got}")


def _tick(node: Node) -> int:
    """A node's last use (the LRU clock): the most recent branch is the likeliest continuation."""
    return node.tick
