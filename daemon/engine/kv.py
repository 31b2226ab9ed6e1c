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
from radixd.daemon.engine.sliding_kv import SlidingKV
from radixd.daemon.engine.types import GenerateRequest
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
    WindowListener,
    append_one_each,
    blocks_for_one_each,
    encode_tokens,
)

log = structlog.get_logger("radixd.engine.kv")


class KVManager:
    """Radix-facing half of the scheduler (engine thread only)."""

    @classmethod
    def create(
        cls, num_blocks: int, block_size: int, config: EngineConfig, window: int = 0, sliding_groups: int = 0
    ) -> KVManager:
        """A pool of `num_blocks` blocks (block 0 null) and its tree, as `config` asks; `sliding_groups` > 0:
        a windowed KV layout whose sliding layers keep `window` tokens in that many pages per position."""
        pool = BlockPool(num_blocks, block_size)
        tree = RadixTree(pool, pin_budget_fraction=config.pin_budget_fraction)
        cache = TreePrefixCache(tree) if config.prefix_caching else NullPrefixCache()
        ends = config.kv_windows == "turns"
        sliding = SlidingKV(pool, window, sliding_groups, keep_ends=ends) if sliding_groups else None
        return cls(pool, tree, cache, sliding)

    def __init__(
        self, pool: BlockPool, tree: RadixTree, cache: PrefixCache, sliding: SlidingKV | None = None
    ) -> None:
        self.pool = pool
        self.tree = tree
        self.cache = cache
        self.sliding = sliding
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

    def peak_blocks(self, prompt_len: int, req: GenerateRequest) -> int:
        """The most blocks a request holds at once when it runs alone: width 1, every token's block;
        wider (n > 1, beams), the prompt once and per output its generated tokens plus one copied partial
        block; with sliding layers, each output's window pages too.

        NOTE: the one definition of whether a request can ever run (`Validator.check_fits`); the
        scheduler keeps a lone sequence within it by computing up to a block boundary at a time when a
        bigger chunk does not fit."""
        max_tokens = req.sampling.max_tokens
        width = max(req.sampling.n, req.beam_width, 1)
        if width > 1:
            blocks = self.blocks_for(prompt_len) + width * (self.blocks_for(max_tokens) + 1)
        else:
            blocks = self.blocks_for(prompt_len + max_tokens)
        if self.sliding is not None:
            blocks += width * self.sliding.peak_pages(prompt_len + max_tokens)
        return blocks

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def evictable_blocks(self) -> int:
        """Blocks that evicting every unlocked, unpinned cache entry would free."""
        kept = self.sliding.store.evictable_pages() if self.sliding is not None else 0
        return self.tree.evictable_blocks() + kept

    def cache_stats(self) -> CacheStats:
        """The radix tree's own statistics (blocks by state, nodes, match hits, evictions)."""
        return self.tree.stats()

    def new_blocks_for_append(self, seq: Sequence, n: int) -> int:
        """Fresh blocks `append(seq, n)` will take (growth + a copy-on-write of a shared last block; the
        sliding layers' pages too)."""
        fresh = self.blocks_for(n) if seq.table is None else seq.table.new_blocks_for(n)
        return fresh + (self.sliding.new_pages_for(seq, n) if self.sliding is not None else 0)

    def blocks_to_admit(self, hit: PrefixHit, n: int) -> int:
        """Fresh blocks a waiting sequence resuming from `hit` takes to compute `n` tokens."""
        fresh = self.blocks_for(hit.num_tokens + n) - len(hit.full_blocks)
        return fresh + (self.sliding.pages_to_start(hit.num_tokens, n) if self.sliding is not None else 0)

    def blocks_to_swap_in(self, n_computed: int, n: int) -> int:
        """Fresh blocks a swapped-out sequence of `n_computed` tokens takes back to compute `n` more (of the
        sliding pages, the window's only)."""
        fresh = self.blocks_for(n_computed + n)
        return fresh + (self.sliding.pages_to_swap_in(n_computed, n) if self.sliding is not None else 0)

    def match(self, tokens: TokenKey | list[int], namespace: str) -> PrefixHit:
        """Longest cached prefix of `tokens`, locked until the hit is released (or moved to a seq); with
        sliding layers, cut back to the deepest kept window within it.

        NOTE: with caching on, the hit always carries a lease (even empty), so a running sequence's
        cached nodes are never evictable."""
        hit = self.cache.match(tokens, namespace)
        if self.sliding is None:
            return hit
        return self.sliding.cut(
            hit, _packed(tokens), namespace, lambda n: self.cache.continues(tokens[:n], namespace)
        )

    @property
    def shares_prefixes(self) -> bool:
        """Whether sequences share cached blocks (prefix caching is on)."""
        return self.cache.shares_prefixes

    def cached_len(self, tokens: TokenKey | list[int], namespace: str) -> int:
        """How many leading tokens are cached (no lock, no LRU or hit-statistics change); with sliding
        layers, how many a request could resume from."""
        n = self.cache.peek(tokens, namespace) if tokens else 0
        return self.sliding.usable(namespace, _packed(tokens), n) if self.sliding is not None else n

    def following(self, tokens: TokenKey, namespace: str, n: int) -> list[int]:
        """Up to `n` tokens cached right after `tokens` (a draft; read-only, nothing locked or counted)."""
        return self.tree.following(tokens, namespace, n)

    # ---- pressure --------------------------------------------------------------------------------
    def ensure_free(self, n_blocks: int) -> bool:
        """Make `n_blocks` free by evicting unlocked cache (LRU); False, evicting nothing, if it can't."""
        short = n_blocks - self.pool.num_free
        if short <= 0:
            return True
        sliding = self.sliding
        if sliding is not None:
            # Windows the tree no longer backs first: they cost no resumable prefix.
            sliding.drop_dead(self._alive)
            short = n_blocks - self.pool.num_free
            if short <= 0:
                return True
        if self.evictable_blocks() < short:
            return False
        self.evicted_blocks += self.cache.evict_count(short)
        if sliding is not None:
            # The tree evicts whole conversations' tails, least recently used first: their windows go
            # with them; then, if still short, the least recently used windows of live prefixes.
            sliding.drop_dead(self._alive)
            short = n_blocks - self.pool.num_free
            if short > 0:
                sliding.store.evict(short)
        return self.pool.num_free >= n_blocks

    def _alive(self, namespace: str, packed: bytes, n_tokens: int) -> bool:
        """Whether the tree still holds the first `n_tokens` of `packed` (a window there is resumable)."""
        return self.cache.peek(TokenKey(packed), namespace) >= n_tokens

    # ---- cache-event listeners -------------------------------------------------------------------
    def add_listener(self, listener: CacheListener, replay: bool = False) -> None:
        """Tell `listener` of every tree change from now on (and, with sliding layers, of every kept window's
        if it is a `WindowListener`); `replay` first reports the tree as `stored`, then the windows as
        `kept` (a window's tokens are always in the tree)."""
        if listener in self._listeners:
            return  # added once: a second add would double its events
        if replay:
            self.tree.replay(listener)
            if self.sliding is not None and isinstance(listener, WindowListener):
                self.sliding.store.replay(listener)
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
        if self.sliding is not None:
            ws = [x for x in ls if isinstance(x, WindowListener)]
            self.sliding.store.listener = None if not ws else ws[0] if len(ws) == 1 else FanOut(*ws)

    # ---- administration --------------------------------------------------------------------------
    def evict(self, n_blocks: int) -> int:
        """Evict up to `n_blocks` unlocked cached blocks (LRU); -> blocks freed."""
        freed = self.tree.evict_count(n_blocks)
        if self.sliding is not None:
            freed += self.sliding.drop_dead(self._alive)
        self.evicted_blocks += freed
        return freed

    def evict_prefix(self, tokens: list[int], namespace: str, *, count_evicted: bool = True) -> int:
        """Evict the unlocked cached blocks under `tokens`; -> blocks freed (`count_evicted`: admin's)."""
        freed = int(self.tree.evict_prefix(tokens, namespace=namespace))
        if self.sliding is not None:
            alive = self._alive
            freed += self.sliding.store.drop_where(
                lambda ns, key, w: not alive(ns, key, w.num_tokens), reason="prefix"
            )
        if count_evicted:
            self.evicted_blocks += freed
        return freed

    def evict_unlocked(self) -> int:
        """Evict every unlocked, unpinned cached block; -> blocks freed."""
        freed = self.tree.flush()
        if self.sliding is not None:
            freed += self.sliding.store.flush()
        self.evicted_blocks += freed
        return freed

    def pin(self, tokens: list[int], namespace: str) -> int:
        """Exempt the cached prefix `tokens` from eviction; -> tokens pinned (0: nothing cached). With
        sliding layers, the window kept at its end (if any) is pinned with it."""
        n = self.tree.pin(tokens, namespace=namespace)
        if self.sliding is not None and n:
            self.sliding.store.hold(namespace, _packed(tokens[:n]))
        return n

    def unpin(self, tokens: list[int], namespace: str) -> None:
        self.tree.unpin(tokens, namespace=namespace)
        if self.sliding is not None:
            self.sliding.store.unhold(namespace, _packed(tokens))

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
        if self.sliding is not None:
            self.sliding.attach(seq, hit)

    def append(self, seq: Sequence, n: int) -> None:
        """Allocate slots for the next `n` tokens of `seq` (blocks already free); may evict a little more
        to get a contiguous run, which the CPU attention reads faster."""
        if seq.table is None:
            seq.table = BlockTable(self.pool)
        self.evicted_blocks += self.cache.evict_for_run(seq.table.new_blocks_for(n))
        self._copies.extend(seq.table.append(n))
        if self.sliding is not None:
            self._copies.extend(self.sliding.append(seq, n))

    def append_decodes(self, seqs: list[Sequence]) -> bool:
        """`append(seq, 1)` for each of `seqs` in one batch, all-or-nothing (False changes nothing)."""
        tables: list[BlockTable] = []
        fresh: list[Sequence] = []
        for s in seqs:
            if s.table is None:
                s.table = BlockTable(self.pool)
                fresh.append(s)
            tables.append(s.table)
        sliding = self.sliding
        if sliding is not None:
            # The sliding pages first, all-or-nothing with the blocks: one ensure_free for both.
            need = blocks_for_one_each(tables) + sum(sliding.new_pages_for(s, 1) for s in seqs)
            if not self.ensure_free(need):
                for s in fresh:
                    s.table = None
                return False
        try:
            self._copies.extend(append_one_each(tables, self.ensure_free))
        except OutOfBlocks:
            for s in fresh:
                s.table = None
            return False
        if sliding is not None:
            for s in seqs:
                self._copies.extend(sliding.append(s, 1))
        return True

    def truncate(self, seq: Sequence, n_tokens: int) -> None:
        """Drop `seq`'s slots past its first `n_tokens` (a rejected draft's)."""
        if seq.table is not None:
            seq.table.truncate(n_tokens)
        if self.sliding is not None:
            self.sliding.truncate(seq, n_tokens)

    def take_copies(self) -> list[tuple[int, int, int]]:
        """The copy-on-write copies queued since the last take, in order (and forget them)."""
        ops, self._copies = self._copies, []
        return ops

    def insert_full_blocks(self, seq: Sequence) -> None:
        """Publish `seq`'s newly completed full blocks so waiting requests can share them (and, with
        sliding layers, release the pages that left its window, keeping one at a branch point it crossed).

        NOTE: only full blocks while it runs: a shared partial block would force a copy-on-write."""
        table = seq.table
        n_full = seq.num_computed // self.block_size
        # Called per sequence per step; a new full block appears once every block_size tokens.
        if table is not None and n_full > table.leased:
            self._insert(seq, n_full, n_full * self.block_size, final=False)
        if self.sliding is not None:
            # NOTE: also the point where a sequence's sliding pages that left its window are released.
            self.sliding.slide(seq)

    def insert_all(self, seq: Sequence, resumes: bool = False) -> None:
        """Insert every computed token of `seq` (partial block included); the caller releases it next.
        `resumes`: `seq` was preempted and will be recomputed from what is cached here."""
        if seq.table is not None and seq.num_computed:
            self._insert(seq, self.blocks_for(seq.num_computed), seq.num_computed, final=True)
            if self.sliding is not None:
                self.sliding.keep_end(seq, resumes)

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
        if self.sliding is not None:
            self.sliding.fork(parent, children)

    def drop_lease(self, lease: Lease | None) -> None:
        """Release a lease a sequence or session held (idempotent; None is nothing to release)."""
        if lease is not None:
            lease.release()

    def resume(self, seq: Sequence, n_tokens: int) -> None:
        """Fresh blocks for `seq`'s first `n_tokens` (whose KV comes back from the host): every block,
        and the sliding pages of the window ending there only."""
        seq.num_computed = 0
        if seq.table is None:
            seq.table = BlockTable(self.pool)
        self._copies.extend(seq.table.append(n_tokens))
        if self.sliding is not None:
            self.sliding.resume(seq, n_tokens)
        seq.num_computed = n_tokens

    def kv_blocks(self, seq: Sequence) -> list[tuple[int, int]]:
        """(block, tokens it holds) of every block and sliding page `seq`'s computed KV occupies, in a
        fixed order (`resume` gives back the same shape for the same token count)."""
        n, B = seq.num_computed, self.block_size
        out = (
            [(b, min(B, n - i * B)) for i, b in enumerate(seq.table.blocks[: self.blocks_for(n)])]
            if seq.table
            else []
        )
        if self.sliding is not None and seq.window is not None:
            out += [(p, min(B, n - i * B)) for p, i in seq.window.held_pages() if i * B < n]
        return out

    def pinned_blocks(self) -> int:
        """Blocks pinned prefixes hold (`pin`): no eviction frees them, an unpin does."""
        return self.tree.num_pinned_blocks

    def blocks_held(self, seq: Sequence) -> int:
        """Blocks and sliding pages `seq`'s tables hold (shared ones included)."""
        n = len(seq.table.blocks) if seq.table is not None else 0
        return n + (len(seq.window.held_pages()) if seq.window is not None else 0)

    def keep_window_for(self, producer: Sequence, waiting: Sequence) -> None:
        """With sliding layers: `producer` keeps the window where `waiting`, held for the prefix they
        share, will resume (no-op otherwise)."""
        if self.sliding is not None:
            self.sliding.keep_for(producer, waiting)

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
        if self.sliding is not None:
            self.sliding.release(seq)
        seq.num_computed = 0
        seq.inserted_blocks = 0
        return self.pool.num_free - before


def _packed(tokens: TokenKey | list[int]) -> bytes:
    return tokens.packed if type(tokens) is TokenKey else encode_tokens(tokens).packed  # type: ignore[arg-type]
