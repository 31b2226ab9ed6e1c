"""RadixTree: token-exact prefix cache over paged KV blocks (match, insert, leases, pins, eviction).

One class. Its longer steps live in helper modules of functions, by concern: ``tree_nodes`` (adding,
splitting, removing nodes; locking paths), ``tree_insert`` (the lookup and insert walks), ``tree_admin``
(prefix eviction, flush, pins). Blocks change owner only through :class:`BlockPool` methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from radixd.radix import tree_admin, tree_insert
from radixd.radix.blockids import ID_BYTES, BlockIds, pack_blocks
from radixd.radix.errors import FlushRefused, InvalidRequest, UnknownLease
from radixd.radix.events import CacheListener
from radixd.radix.lru import LruIndex
from radixd.radix.node import TOKEN_BYTES, Node, TokenKey, Tokens, as_tokens
from radixd.radix.pool import BlockPool
from radixd.radix.results import CacheStats, InsertResult, Lease, PrefixMatch
from radixd.radix.table import BlockTable
from radixd.radix.tree_nodes import lock_path, move_lock, path_of, unlock_path

__all__ = ["EVICT_REASONS", "TREE_FLUSH_MODES", "RadixTree", "TreeFlushMode"]

EVICT_REASONS = ("lru", "prefix", "flush", "superseded")
# The tree's own flush operations, named for what they do (the engine's wire-level modes are
# `radixd.daemon.engine.types.FlushMode`; each of them evicts with "evict_unlocked").
TreeFlushMode = Literal["evict_unlocked", "refuse_if_leased", "drop_all"]
TREE_FLUSH_MODES: tuple[TreeFlushMode, ...] = get_args(TreeFlushMode)
Key = Sequence[int] | bytes | TokenKey


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

    # NOTE: ownership invariants (radixd.radix.verify checks them; tests/radix after every step):
    #  * the tree holds exactly one pool reference per block it stores (per occurrence in a node);
    #  * a block is exactly one of: free / cached-evictable (refcount 1, held by the tree in a node
    #    with hold == 0) / in use; free + evictable + in_use == pool.num_usable;
    #  * a node with hold > 0 (leased or pinned, or an ancestor of one) is never evicted, except by
    #    flush("drop_all"), which also invalidates every outstanding lease (epoch bump);
    #  * different namespaces have different roots and never share a node or a block.

    def __init__(self, pool: BlockPool, pin_budget_fraction: float = 0.25) -> None:
        if not 0.0 <= pin_budget_fraction <= 1.0:
            raise InvalidRequest(f"pin_budget_fraction must be within [0, 1], got {pin_budget_fraction}")
        pool.attach_cache()
        self.pool = pool
        self.block_size = pool.block_size
        self._bb = pool.block_size * TOKEN_BYTES  # a block's tokens, in packed bytes
        self.pin_budget_blocks = int(pin_budget_fraction * pool.num_usable)
        self._roots: dict[str, Node] = {}
        self._lru = LruIndex()
        self._clock = 0  # logical time of the last use; every node's tick is unique
        self._epoch = 0  # bumped by flush("drop_all"): leases of older epochs are inert
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

    # ================================================================== lookup
    def match(self, tokens: Key, namespace: str = "") -> PrefixMatch:
        """Longest cached prefix of ``tokens``; locks it until ``result.lease.release()``.

        ``tokens``: token ids, or packed ones (``encode_tokens``) to skip the conversion. To keep at
        least one token to compute (for logits), match ``tokens[:-1]``. The lease of an empty match
        locks nothing yet, but an insert with it locks the inserted path.
        """
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        node, blocks, pblock, ptok = tree_insert.walk(self, t, namespace, True)
        num_tokens = bytes.__len__(blocks) // ID_BYTES * self.block_size
        self._hit_tokens += num_tokens + ptok
        self._miss_tokens += len(t) // TOKEN_BYTES - num_tokens - ptok
        if node is not None:
            lock_path(self, node)
            self._leases += 1
        return PrefixMatch(blocks, num_tokens, pblock, ptok, Lease(self, node, self._epoch, namespace))

    def peek(self, tokens: Key, namespace: str = "") -> int:
        """Cached prefix length of ``tokens`` (full + partial block tokens); no lock, LRU or stats change."""
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        _node, blocks, _pb, ptok = tree_insert.walk(self, t, namespace, False)
        return len(blocks) * self.block_size + ptok

    def lookup(self, tokens: Key, namespace: str = "") -> tuple[BlockIds, int | None]:
        """The cached full blocks of ``tokens``' prefix and the partially matching next block (or None);
        no lock, LRU or stats change. For a caller that holds a lease on that path already."""
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        _node, blocks, pblock, _ptok = tree_insert.walk(self, t, namespace, False)
        return blocks, pblock

    # ================================================================== insert
    def insert(
        self,
        tokens: Key,
        blocks: Sequence[int] | bytes,
        namespace: str = "",
        lease: Lease | None = None,
        *,
        donate: bool = False,
        cached: int = 0,
    ) -> InsertResult:
        """Cache ``tokens`` whose KV lives in ``blocks`` (``ceil(len(tokens) / block_size)`` of them).

        ``blocks``: block ids, or packed ones (``BlockIds``, e.g. from ``allocate_ids`` and
        ``PrefixMatch.block_ids``; any ``bytes`` is read as packed ids), which skips the conversion.

        ``cached=k``: the first ``k`` full blocks of ``tokens`` are the tree's own (typically the blocks
        of the match whose lease the caller still holds), and ``blocks`` holds only the blocks after
        them. The tree checks that those ``k`` blocks of tokens are still cached; if not it raises
        InvalidRequest, having cached and split nothing.

        The tree takes one reference on each block it adopts; the caller keeps its own. Blocks at
        positions the tree already caches in other blocks are returned as duplicates. If ``lease`` (a
        live lease of this tree) is given it is moved to the inserted path, so the caller's blocks stay
        protected until it releases the lease.

        ``donate=True`` hands the tree the caller's single reference on every block that is not already
        the tree's own block at its position (typically: the blocks the caller allocated for the
        uncached suffix). Adopted blocks keep that reference, duplicates are released by the tree, and
        the caller must not release any of them afterwards. It saves a pass over the blocks.
        """
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        bl = blocks if type(blocks) is BlockIds or type(blocks) is bytes else pack_blocks(blocks)
        n = len(t)
        tree_insert.check_fit(self, n, bytes.__len__(bl) // ID_BYTES, cached)
        if lease is not None and lease._tree is not self:
            raise UnknownLease("insert(lease=...) got a lease issued by another RadixTree")
        if n == 0:
            return InsertResult([], 0, 0)
        return self._insert_packed(t, bl, namespace, lease, cached, donate)

    def _insert_packed(
        self,
        t: Tokens,
        bl: bytes,
        namespace: str,
        lease: Lease | None,
        cached: int,
        donate: bool,
        start: Node | None = None,
    ) -> InsertResult:
        """:meth:`insert` once its arguments are checked: a non-empty key, the right block count, and
        ``lease`` (if any) one of this tree's. ``start``: see ``tree_insert.insert``."""
        n = bytes.__len__(t)
        final, dups, new_tokens = tree_insert.insert(self, t, bl, namespace, cached, donate, start)
        if lease is not None and lease._open and lease._epoch == self._epoch:
            old = lease._node
            if old is None:  # an empty match's lease starts locking here
                lock_path(self, final)
                self._leases += 1
            else:
                move_lock(self, old, final)
            lease._node = final
            lease._namespace = namespace
        if donate and dups:
            self.pool.decref_all(dups)
        return InsertResult(dups, n // TOKEN_BYTES - new_tokens, new_tokens)

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
        tree's block from then on. The table's later blocks (a partial tail) stay its own.

        ``final=True``: the owner releases the table and the lease right after (a finishing
        sequence), so the lease is not moved: the inserted path is cached unlocked, and the lease
        keeps only what it kept before until its release. Saves locking a path that is unlocked at
        once. The table must not be appended to or read past ``leased`` afterwards.
        """
        done = table.leased
        blocks = table.blocks
        if not done <= n_blocks <= len(blocks):
            raise InvalidRequest(f"insert_table of {n_blocks} blocks outside [{done}, {len(blocks)}]")
        if lease._tree is not self:
            raise UnknownLease("insert_table got a lease issued by another RadixTree")
        if done and lease._node is None:
            raise InvalidRequest(f"insert_table: the table leases {done} blocks but its lease locks nothing")
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        n = bytes.__len__(t)
        tree_insert.check_fit(self, n, n_blocks - done, done)
        if n == 0:
            return InsertResult([], 0, 0)
        # The table's new blocks in one copy, as the immutable BlockIds a new leaf can keep as it is.
        with memoryview(blocks) as mv:
            new_blocks = BlockIds(mv[done:n_blocks])
        # NOTE: a running sequence publishes each block it fills, and its path grows a node per block:
        # walking it from the root each time would make a generation's inserts quadratic in its
        # length. Its lease ends where the last insert ended, so the walk starts there. A final
        # insert walks from the root, which marks the whole path used as the sequence ends.
        start = None
        if not final and lease._open and lease._epoch == self._epoch and lease._namespace == namespace:
            node = lease._node
            if tree_insert.continues(self, node, t, done):
                start = node
        res = self._insert_packed(t, new_blocks, namespace, None if final else lease, done, True, start)
        n_tokens = n // TOKEN_BYTES
        # Positions cached before this insert (a leaf added now starts on a block boundary).
        known = n_blocks if res.num_new_tokens == 0 else (n_tokens - res.num_new_tokens) // self.block_size
        if known > done:
            tree_insert.settle_known(self, t, table, done, known, namespace, res.duplicate_blocks)
        table.leased_up_to(n_blocks)
        return res

    # ================================================================= leases
    def release(self, lease: Lease) -> None:
        """Release ``lease`` (idempotent). Raises UnknownLease for a lease of another tree."""
        if lease._tree is not self:
            raise UnknownLease("release() of a lease issued by another RadixTree")
        lease.release()

    def _release(self, lease: Lease) -> None:
        """Unlock ``lease``'s path (called by :meth:`Lease.release`, once)."""
        node = lease._node
        lease._node = None
        if node is None or lease._epoch != self._epoch:
            return  # already released, or its nodes went away in flush("drop_all")
        self._leases -= 1
        unlock_path(self, node)

    def _clone_lease(self, lease: Lease) -> Lease:
        if lease._tree is not self:
            raise UnknownLease("clone() of a lease issued by another RadixTree")
        node = lease._node
        if node is None or lease._epoch != self._epoch:
            # Nothing to lock (yet): a live empty lease, which a later insert can lock with.
            return Lease(self, None, self._epoch, lease._namespace)
        lock_path(self, node)
        self._leases += 1
        return Lease(self, node, self._epoch, lease._namespace)

    def _path(self, node: Node) -> tuple[str, list[int]]:
        """The namespace and token path from the root to the end of ``node`` (what listeners get)."""
        return path_of(self, node)

    # =============================================================== eviction
    def evictable_blocks(self) -> int:
        """Blocks that evicting every unlocked, unpinned entry would free (exact, O(1))."""
        return self.pool.num_evictable

    def evict(self, n_blocks: int) -> list[int]:
        """Free at least ``n_blocks`` blocks if possible, least recently used leaves first.

        Returns the blocks that became free (fewer when not enough is evictable). O(log n) per node.
        """
        freed: list[int] = []
        tree_admin.evict_lru(self, n_blocks, freed)
        return freed

    def evict_count(self, n_blocks: int) -> int:
        """Like :meth:`evict` but returns only how many blocks became free.

        For callers that size the free pool and never look at the ids (a scheduler making room): it
        skips building the list, which at block size 1 is a thousand ids per evicted request.
        """
        return tree_admin.evict_lru(self, n_blocks, None)

    def evict_prefix(self, tokens: Key, namespace: str = "") -> int:
        """Drop every unlocked, unpinned cached sequence that starts with ``tokens``.

        An empty ``tokens`` means the whole namespace. Returns the number of blocks dropped.
        """
        root = self._roots.get(namespace)
        if root is None:
            return 0
        before = self._evicted["prefix"]
        for top in tree_admin.subtrees_with_prefix(self, root, as_tokens(tokens)):
            tree_admin.evict_subtree(self, top, "prefix")
        return self._evicted["prefix"] - before

    def flush(self, mode: TreeFlushMode = "evict_unlocked", include_pinned: bool = False) -> int:
        """Drop cached entries; returns the number of blocks the tree released.

        * ``"evict_unlocked"``: evict everything not leased (and not pinned unless ``include_pinned``).
        * ``"refuse_if_leased"``: like ``"evict_unlocked"`` but raise FlushRefused (changing nothing)
          while any lease is held. (Waiting for idle is the engine's job: it retries once its requests
          have drained.)
        * ``"drop_all"``: drop everything, leased and pinned included; outstanding leases become inert
          (releasing them later is a no-op). Blocks still held by tables stay allocated to them.
        """
        if mode not in TREE_FLUSH_MODES:
            raise InvalidRequest(f"flush mode must be one of {TREE_FLUSH_MODES}, got {mode!r}")
        if mode == "refuse_if_leased" and self._leases:
            raise FlushRefused(
                f"flush refused: {self._leases} lease(s) still held; release them or flush('evict_unlocked')"
            )
        before = self._cached_blocks
        if mode == "drop_all":
            tree_admin.drop_all(self)
            return before
        if include_pinned:
            for ns, toks in list(self._pins):
                self.unpin(toks, ns)
        tree_admin.evict_lru(self, self._cached_blocks + 1, None, "flush")
        return before - self._cached_blocks

    # ================================================================== pins
    def pin(self, tokens: Key, namespace: str = "") -> int:
        """Exempt the cached prefix of ``tokens`` from eviction; returns the number of tokens pinned.

        Pins whole cached blocks (a partial trailing block only when it ends a cached leaf). Pinning
        the same tokens again is a no-op. Raises PinBudgetExceeded, changing nothing, when the newly
        pinned blocks would exceed the budget (``pin_budget_fraction`` of the pool).
        """
        return tree_admin.pin(self, as_tokens(tokens), namespace)

    def unpin(self, tokens: Key, namespace: str = "") -> int:
        """Undo :meth:`pin` of exactly these tokens; returns the tokens unpinned. Raises NotPinned."""
        return tree_admin.unpin(self, as_tokens(tokens), namespace)

    # ================================================================= stats
    def replay(self, listener: CacheListener) -> int:
        """Report every cached node to ``listener`` as ``stored``, parents before children, as if it
        had just been inserted (so an observer attached late starts from the tree's content); the
        tree's own listener is not called. -> nodes reported."""
        return tree_admin.replay(self, listener)

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
            evictable_blocks=pool.num_evictable,
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
