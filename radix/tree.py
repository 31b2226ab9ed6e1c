"""RadixTree: token-exact prefix cache over paged KV blocks (match, insert, leases, pins, eviction).

One class, composed of the owners of its state: a :class:`NodeStore` (the nodes, their LRU order and
counts; radix/store.py), :class:`Holds` (the locks of leases and pins; radix/holds.py) and :class:`Pins`
(pinned prefixes and their budget; radix/pins.py); the tree itself counts match hits and misses. Every
walk down the tree is :meth:`NodeStore.descend`. Blocks change owner only through :class:`BlockPool`.
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
"""Blocks :meth:`RadixTree.evict_for_run` may evict per block asked for. On bench/block_layout.py's
churned pool, 1 left an agent's context in 128 runs of 195 blocks, 2 in 29, 4 in 23, with the prefix
hit rate unchanged (docs/bench-kernels.md, seventh run)."""

__all__ = ["RadixTree"]

Key = Sequence[int] | bytes | TokenKey


class RadixTree:
    """Prefix cache of KV blocks keyed by (namespace, token ids).

    * ``match`` returns the longest cached prefix as full blocks plus the partially matching next
      block (block id + matched token count) and a :class:`Lease` locking that path.
    * ``insert_table`` caches a running sequence's tokens with its table's blocks (prompt and generated
      tokens; the last block may be partial) and moves the sequence's lease onto them.
    * ``evict`` frees least-recently-used unlocked, unpinned leaves in O(log n) per node, cascading to
      parents that become leaves; ``evict_prefix``, ``flush``, ``pin`` / ``unpin`` manage the cache.

    Not thread-safe: one owner (the engine thread) drives it.
    """

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
        """Longest cached prefix of ``tokens``; locks it until ``result.lease.release()``.

        ``tokens``: token ids, or packed ones (``encode_tokens``) to skip the conversion. To keep at
        least one token to compute (for logits), match ``tokens[:-1]``. The lease of an empty match
        locks nothing yet, but an insert with it locks the inserted path.
        """
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
        """Up to ``max_tokens`` tokens the tree holds right after the whole of ``tokens``, in
        ``namespace`` only: what followed this very prefix in earlier requests (a speculative decoding
        draft). Where the cached paths branch, the most recently used one is followed. [] when
        ``tokens`` is not a cached prefix or nothing follows it. Read-only: no lock, LRU or stats
        change, so a draft never keeps anything cached.
        """
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
            # NOTE: a partial-block leaf may hold exactly ``rest`` and nothing after it, beside a
            # sibling that goes on: only children with something past ``rest`` can draft.
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
                    path.append(best)
                    store.lru.use(path)
                return best, blocks, best.blocks[0], best_len
        if use and path:
            store.lru.use(path)
        return (node if node.parent is not None else None), blocks, None, 0

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
        """Cache ``tokens`` (``n_blocks`` blocks of ``table``) for the table's owner, who holds ``lease``.

        The protocol a scheduler runs (the engine's ``KVManager`` and ``bench/radix_adapter.py`` both
        call it): the table's first ``table.leased`` blocks are the tree's, kept by ``lease``; only the
        blocks after them are passed, with the table's references donated. ``lease`` moves to the
        inserted path and ``table.leased`` becomes ``n_blocks``: the table then holds no reference on
        those blocks, and where the tree already cached a position in another block the table reads the
        tree's block from then on (the tree released the table's own: a duplicate). The table's later
        blocks (a partial tail) stay its own. The key must fill exactly ``n_blocks`` blocks.

        ``final=True``: the owner releases the table and the lease right after (a finishing
        sequence), so the lease is not moved: the inserted path is cached unlocked, and the lease
        keeps only what it kept before until its release. Saves locking a path that is unlocked at
        once. The table must not be appended to or read past ``leased`` afterwards.
        """
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
        # NOTE: a running sequence publishes each block it fills, and its path grows a node per block:
        # walking it from the root each time would make a generation's inserts quadratic in its
        # length. Its lease ends where the last insert ended, so the walk starts there. A final
        # insert walks from the root, which marks the whole path used as the sequence ends.
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
        """Cache key ``t`` (non-empty) with blocks ``bl`` after ``c`` of the tree's own blocks.

        Returns (the node where ``t`` ends, the caller's duplicate blocks, tokens newly cached).
        ``start``: a live node whose path spells ``t``'s first ``c`` blocks (a lease's); the walk starts
        there instead of at the root, and the nodes above it are not touched. Raises InvalidRequest,
        having cached and split nothing, when the tree does not cache ``t``'s first ``c`` blocks.
        """
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
        """Free at least ``n_blocks`` blocks if possible, least recently used leaves first.

        Returns the blocks that became free (fewer when not enough is evictable). O(log n) per node.
        """
        freed: list[int] = []
        self.store.evict_lru(n_blocks, freed)
        return freed

    def evict_count(self, n_blocks: int) -> int:
        """Like :meth:`evict` but returns only how many blocks became free.

        For callers that size the free pool and never look at the ids (a scheduler making room): it
        skips building the list, which at block size 1 is a thousand ids per evicted request.
        """
        return self.store.evict_lru(n_blocks, None)

    def evict_for_run(self, n_blocks: int, budget: int | None = None) -> int:
        """Evict least recently used leaves, at most ``budget`` blocks' worth (the last leaf may pass
        it; default ``RUN_EVICTION_BUDGET * n_blocks``), until the pool holds ``n_blocks`` consecutive
        free ids; -> blocks freed (0 when such a run is already free, or ``n_blocks <= 1``).

        Why: in a full pool, the blocks that eviction frees lie wherever the evicted leaves held
        them, and an allocation served from such scraps is split into as many runs; a context spread
        a block here and a block there is read by the CPU attention at about 0.6 times the rate of
        one in long runs (bench/block_layout.py). A few more leaves from the cold end of the cache
        usually free the neighbours of what is already free and join the scraps into one run.
        """
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
        """Drop every unlocked, unpinned cached sequence that starts with ``tokens``.

        An empty ``tokens`` means the whole namespace. Returns the number of blocks dropped.
        """
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
        """Exempt the cached prefix of ``tokens`` from eviction; returns the number of tokens pinned.

        Pins whole cached blocks (a partial trailing block only when it ends a cached leaf). Pinning
        the same tokens again is a no-op. Raises PinBudgetExceeded, changing nothing, when the newly
        pinned blocks would exceed the budget (``pin_budget_fraction`` of the pool).
        """
        return self._pins.pin(as_tokens(tokens), namespace)

    def unpin(self, tokens: Key, namespace: str = "") -> int:
        """Undo :meth:`pin` of exactly these tokens; returns the tokens unpinned. Raises NotPinned."""
        return self._pins.unpin(as_tokens(tokens), namespace)

    # ================================================================= stats
    def replay(self, listener: CacheListener) -> int:
        """Report every cached node to ``listener`` as ``stored``, parents before children, as if it
        had just been inserted (so an observer attached late starts from the tree's content); the
        tree's own listener is not called. -> nodes reported."""
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
