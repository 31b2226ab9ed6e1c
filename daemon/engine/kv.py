"""KV bookkeeping for the scheduler: the only engine module that calls the radix pool, tree and tables.

Match on admission, append slots (copy-on-write), insert computed tokens, release, evict; copies are
queued for the runner once per step. An insert donates the table's references on blocks past the
lease's (`cached`) to the tree. NOTE: a table holds no reference on its leased blocks: the lease alone
keeps them alive, and the tree never evicts a leased node."""

from __future__ import annotations

import structlog

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.prefix_cache import NullPrefixCache, PrefixCache, PrefixHit, TreePrefixCache
from radixd.daemon.engine.sequence import Sequence
from radixd.radix import (
    BlockPool,
    BlockTable,
    CacheListener,
    CacheStats,
    FanOut,
    Lease,
    OutOfBlocks,
    RadixTree,
    TokenKey,
    append_one_each,
)

log = structlog.get_logger("radixd.engine.kv")


class KVManager:
    """Radix-facing half of the scheduler (engine thread only)."""

    @classmethod
    def create(cls, num_blocks: int, block_size: int, config: EngineConfig) -> KVManager:
        """A pool of `num_blocks` blocks (block 0 null) and its tree, as `config` asks."""
        pool = BlockPool(num_blocks, block_size)
        tree = RadixTree(pool, pin_budget_fraction=config.pin_budget_fraction)
        return cls(pool, tree, TreePrefixCache(tree) if config.prefix_caching else NullPrefixCache())

    def __init__(self, pool: BlockPool, tree: RadixTree, cache: PrefixCache) -> None:
        self.pool = pool
        self.tree = tree
        self.cache = cache
        self.block_size = pool.block_size
        self._copies: list[tuple[int, int, int]] = []
        self._listeners: list[CacheListener] = []
        self.evicted_blocks = 0

    # ---- queries ---------------------------------------------------------------------------------
    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    @property
    def num_blocks(self) -> int:
        """The pool's size, null block 0 included."""
        return self.pool.num_blocks

    def usable_blocks(self) -> int:
        """Blocks a request may use: the pool less its null block 0."""
        return self.pool.num_blocks - 1

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def evictable_blocks(self) -> int:
        """Blocks that evicting every unlocked, unpinned cache entry would free."""
        return self.tree.evictable_blocks()

    def cache_stats(self) -> CacheStats:
        """The radix tree's own statistics (blocks by state, nodes, match hits, evictions)."""
        return self.tree.stats()

    def new_blocks_for_append(self, seq: Sequence, n: int) -> int:
        """Fresh blocks `append(seq, n)` will take (growth + a copy-on-write of a shared last block)."""
        return self.blocks_for(n) if seq.table is None else seq.table.new_blocks_for(n)

    def match(self, tokens: TokenKey | list[int], namespace: str) -> PrefixHit:
        """Longest cached prefix of `tokens`, locked until the hit is released (or moved to a seq).

        NOTE: with caching on, the hit always carries a lease (even empty), so a running sequence's
        cached nodes are never evictable."""
        return self.cache.match(tokens, namespace)

    @property
    def shares_prefixes(self) -> bool:
        """Whether sequences share cached blocks (prefix caching is on)."""
        return self.cache.shares_prefixes

    def cached_len(self, tokens: TokenKey | list[int], namespace: str) -> int:
        """How many leading tokens are cached (no lock, no LRU or hit-statistics change)."""
        return self.cache.peek(tokens, namespace) if tokens else 0

    def following(self, tokens: TokenKey, namespace: str, n: int) -> list[int]:
        """Up to `n` tokens cached right after `tokens` (a draft; read-only, nothing locked or counted)."""
        return self.tree.following(tokens, namespace, n)

    # ---- pressure --------------------------------------------------------------------------------
    def ensure_free(self, n_blocks: int) -> bool:
        """Make `n_blocks` free by evicting unlocked cache (LRU); False, evicting nothing, if it can't."""
        short = n_blocks - self.pool.num_free
        if short <= 0:
            return True
        if self.cache.evictable_blocks() < short:
            return False
        self.evicted_blocks += self.cache.evict_count(short)
        return self.pool.num_free >= n_blocks

    # ---- cache-event listeners -------------------------------------------------------------------
    def add_listener(self, listener: CacheListener, replay: bool = False) -> None:
        """Tell `listener` of every tree change from now on; `replay` first reports the tree as `stored`."""
        if listener in self._listeners:
            return  # added once: a second add would double its events
        if replay:
            self.tree.replay(listener)
        self._listeners.append(listener)
        self._install()

    def remove_listener(self, listener: CacheListener) -> None:
        """Stop telling `listener` (a listener not added is ignored)."""
        if listener in self._listeners:
            self._listeners.remove(listener)
        self._install()

    @property
    def listening(self) -> bool:
        """Whether the tree reports its changes to anyone."""
        return self.tree.listener is not None

    def _install(self) -> None:
        ls = self._listeners
        self.tree.listener = None if not ls else ls[0] if len(ls) == 1 else FanOut(*ls)

    # ---- administration --------------------------------------------------------------------------
    def evict(self, n_blocks: int) -> int:
        """Evict up to `n_blocks` unlocked cached blocks (LRU); -> blocks freed."""
        freed = self.tree.evict_count(n_blocks)
        self.evicted_blocks += freed
        return freed

    def evict_prefix(self, tokens: list[int], namespace: str, *, count_evicted: bool = True) -> int:
        """Evict the unlocked cached blocks under `tokens`; -> blocks freed (`count_evicted`: admin's)."""
        freed = int(self.tree.evict_prefix(tokens, namespace=namespace))
        if count_evicted:
            self.evicted_blocks += freed
        return freed

    def evict_unlocked(self) -> int:
        """Evict every unlocked, unpinned cached block; -> blocks freed."""
        freed = self.tree.flush()
        self.evicted_blocks += freed
        return freed

    def pin(self, tokens: list[int], namespace: str) -> int:
        """Exempt the cached prefix `tokens` from eviction; -> tokens pinned (0: nothing cached)."""
        return self.tree.pin(tokens, namespace=namespace)

    def unpin(self, tokens: list[int], namespace: str) -> None:
        self.tree.unpin(tokens, namespace=namespace)

    # ---- sequence operations ---------------------------------------------------------------------
    def attach(self, seq: Sequence, hit: PrefixHit) -> None:
        """Give `seq` a table starting from the hit's blocks (leased full blocks, a copied partial one)."""
        table = BlockTable(self.pool)
        if hit.full_blocks:
            table.lease_prefix(hit.full_blocks)
        if hit.partial_src is not None and hit.partial_tokens > 0:
            self._copies.append(table.copy_partial(hit.partial_src, hit.partial_tokens))
        seq.table = table
        seq.lease = hit.lease
        hit.lease = None
        seq.num_computed = hit.num_tokens
        seq.inserted_blocks = table.leased

    def append(self, seq: Sequence, n: int) -> None:
        """Allocate slots for the next `n` tokens of `seq` (blocks already free); may evict a little more
        to get a contiguous run, which the CPU attention reads faster."""
        if seq.table is None:
            seq.table = BlockTable(self.pool)
        self.evicted_blocks += self.cache.evict_for_run(seq.table.new_blocks_for(n))
        self._copies.extend(seq.table.append(n))

    def append_decodes(self, seqs: list[Sequence]) -> bool:
        """`append(seq, 1)` for each of `seqs` in one batch, all-or-nothing (False changes nothing)."""
        tables: list[BlockTable] = []
        fresh: list[Sequence] = []
        for s in seqs:
            if s.table is None:
                s.table = BlockTable(self.pool)
                fresh.append(s)
            tables.append(s.table)
        try:
            self._copies.extend(append_one_each(tables, self.ensure_free))
        except OutOfBlocks:
            for s in fresh:
                s.table = None
            return False
        return True

    def truncate(self, seq: Sequence, n_tokens: int) -> None:
        """Drop `seq`'s slots past its first `n_tokens` (a rejected draft's)."""
        if seq.table is not None:
            seq.table.truncate(n_tokens)

    def take_copies(self) -> list[tuple[int, int, int]]:
        """The copy-on-write copies queued since the last take, in order (and forget them)."""
        ops, self._copies = self._copies, []
        return ops

    def insert_full_blocks(self, seq: Sequence) -> None:
        """Publish `seq`'s newly completed full blocks so waiting requests can share them.

        NOTE: only full blocks while it runs: a shared partial block would force a copy-on-write."""
        table = seq.table
        n_full = seq.num_computed // self.block_size
        # Called per sequence per step; a new full block appears once every block_size tokens.
        if table is not None and n_full > table.leased:
            self._insert(seq, n_full, n_full * self.block_size, final=False)

    def insert_all(self, seq: Sequence) -> None:
        """Insert every computed token of `seq` (partial block included); the caller releases it next."""
        if seq.table is not None and seq.num_computed:
            self._insert(seq, self.blocks_for(seq.num_computed), seq.num_computed, final=True)

    def _insert(self, seq: Sequence, n_blocks: int, n_tokens: int, final: bool) -> None:
        """Insert `seq.tokens[:n_tokens]`, moving the lease onto the path unless `final`; no lease: no-op."""
        table, lease = seq.table, seq.lease
        # A final insert runs even with no new block: its walk from the root marks the whole path used.
        if table is None or lease is None or n_blocks < table.leased:
            return
        if n_blocks == table.leased and not final:
            return
        self.cache.insert_table(seq.key(n_tokens), table, n_blocks, seq.request.req.namespace, lease, final)
        seq.inserted_blocks = n_tokens // self.block_size

    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """Give each child a copy-on-write fork of `parent`'s table and its own clone of the lease."""
        tables = parent.table.fork(len(children)) if parent.table is not None else [None] * len(children)
        for child, table in zip(children, tables, strict=True):
            child.table = table
            child.lease = parent.lease.clone() if parent.lease is not None else None
            child.num_computed = parent.num_computed
            child.inserted_blocks = parent.inserted_blocks

    def drop_lease(self, lease: Lease | None) -> None:
        """Release a lease a sequence or session held (idempotent; None is nothing to release)."""
        if lease is not None:
            lease.release()

    def lease_new_path(self, seq: Sequence) -> None:
        """Give a swapped-in sequence a live lease, so its inserts lock what they cache."""
        if seq.lease is None:
            seq.lease = self.cache.new_lease(seq.request.req.namespace)

    def release(self, seq: Sequence) -> int:
        """Drop `seq`'s table and lease; -> blocks that became free."""
        before = self.pool.num_free
        if seq.table is not None:
            seq.table.release()
            seq.table = None
        if seq.lease is not None:
            seq.lease.release()
            seq.lease = None
        seq.num_computed = 0
        seq.inserted_blocks = 0
        return self.pool.num_free - before
