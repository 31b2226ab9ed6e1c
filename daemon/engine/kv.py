"""KV bookkeeping for the scheduler: the only module that calls the radix pool, tree and tables.

It turns scheduler decisions into radix operations: match a prompt on admission (sharing full blocks,
copying a partially matched block), append slots (with copy-on-write), insert computed tokens into the
tree, release a sequence's table and lease, and free blocks under pressure by evicting unlocked cache.
Copy ops are queued and handed to the runner once per step, before the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from radixd.daemon.engine.sequence import Sequence
from radixd.radix import BlockPool, BlockTable, Lease, RadixTree

log = structlog.get_logger("radixd.engine.kv")


@dataclass
class PrefixHit:
    """What admission may reuse for a prompt: `num_tokens` cached tokens = `full_blocks` shared whole
    plus `partial_tokens` tokens of `partial_src` copied into a fresh block."""

    num_tokens: int
    full_blocks: list[int]
    partial_src: int | None
    partial_tokens: int
    lease: Lease | None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


class KVManager:
    """Radix-facing half of the scheduler (engine thread only)."""

    def __init__(self, pool: BlockPool, tree: RadixTree, caching: bool) -> None:
        self.pool = pool
        self.tree = tree
        self.caching = caching
        self.block_size = pool.block_size
        self._copies: list[tuple[int, int, int]] = []
        self.evicted_blocks = 0

    # ---- queries ---------------------------------------------------------------------------------
    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def new_blocks_for_append(self, seq: Sequence, n: int) -> int:
        """Fresh blocks `append(seq, n)` will take (growth + a copy-on-write of a shared last block)."""
        table = seq.table
        have = len(table.blocks) if table is not None else 0
        used = table.num_tokens if table is not None else 0
        need = max(0, self.blocks_for(used + n) - have)
        if (
            table is not None
            and n > 0
            and used % self.block_size
            and self.pool.refcount(table.blocks[-1]) > 1
        ):
            need += 1
        return need

    def match(self, tokens: list[int], namespace: str) -> PrefixHit:
        """Longest cached prefix of `tokens`, locked until the hit is released (or moved to a seq).

        NOTE: with caching on, the hit always carries a live lease, also for an empty match: the
        sequence's inserts move it onto the path they create, so a running sequence's cached nodes are
        never evictable (evicting them would free nothing, the sequence holds the blocks, and only strip
        the prefix from the cache).
        """
        if not self.caching:
            return PrefixHit(0, [], None, 0, None)
        m = self.tree.match(tokens, namespace=namespace)
        partial_tokens = m.partial_tokens if m.partial_block is not None else 0
        return PrefixHit(
            m.num_tokens + partial_tokens, list(m.blocks), m.partial_block, partial_tokens, m.lease
        )

    def cached_len(self, tokens: list[int], namespace: str) -> int:
        """How many leading tokens are cached (no lock, no LRU or hit-statistics change)."""
        if not self.caching or not tokens:
            return 0
        return self.tree.peek(tokens, namespace=namespace)

    # ---- pressure --------------------------------------------------------------------------------
    def ensure_free(self, n_blocks: int) -> bool:
        """Make `n_blocks` free, evicting unlocked cache (LRU) if needed; False if it cannot.

        NOTE: nothing is evicted unless eviction alone can make the room: a partial eviction would
        throw away cached prefixes and still fail, and the caller's next move (preempting a sequence)
        changes what is evictable anyway.
        """
        short = n_blocks - self.pool.num_free
        if short <= 0:
            return True
        if not self.caching or self.tree.evictable_blocks() < short:
            return False
        self.evicted_blocks += self.tree.evict_count(short)
        return self.pool.num_free >= n_blocks

    # ---- sequence operations ---------------------------------------------------------------------
    def attach(self, seq: Sequence, hit: PrefixHit) -> None:
        """Give `seq` a table holding the hit's blocks (shared full blocks, a copied partial one)."""
        table = BlockTable(self.pool)
        if hit.full_blocks:
            table.share_prefix(hit.full_blocks, len(hit.full_blocks) * self.block_size)
        if hit.partial_src is not None and hit.partial_tokens > 0:
            self._copies.append(table.copy_partial(hit.partial_src, hit.partial_tokens))
        seq.table = table
        seq.lease = hit.lease
        hit.lease = None
        seq.num_computed = hit.num_tokens

    def append(self, seq: Sequence, n: int) -> None:
        """Allocate slots for the next `n` tokens of `seq` (callers ensured the blocks are free)."""
        if seq.table is None:
            seq.table = BlockTable(self.pool)
        self._copies.extend(seq.table.append_slots(n).copies)

    def take_copies(self) -> list[tuple[int, int, int]]:
        ops, self._copies = self._copies, []
        return ops

    def insert_full_blocks(self, seq: Sequence) -> None:
        """Publish `seq`'s newly completed full blocks so waiting requests can share them.

        NOTE: only full blocks are inserted while a sequence runs: a partial block in the tree would
        be shared, and the sequence's next append into it would need a copy-on-write.
        """
        if not self.caching or seq.table is None:
            return
        n_full = seq.num_computed // self.block_size
        if n_full <= seq.inserted_blocks:
            return
        # The lease follows to the inserted path, so these nodes are not evicted while still in use.
        self.tree.insert(
            seq.tokens[: n_full * self.block_size],
            seq.table.blocks[:n_full],
            namespace=seq.request.req.namespace,
            lease=seq.lease,
        )
        seq.inserted_blocks = n_full

    def insert_all(self, seq: Sequence) -> None:
        """Insert every computed token of `seq` (partial last block included) into the tree."""
        if not self.caching or seq.table is None or seq.num_computed == 0:
            return
        n = seq.num_computed
        self.tree.insert(
            seq.tokens[:n],
            seq.table.blocks[: self.blocks_for(n)],
            namespace=seq.request.req.namespace,
            lease=seq.lease,
        )

    def lease_new_path(self, seq: Sequence) -> None:
        """Give a sequence that resumes with blocks of its own (swap-in) a live lease, so its inserts
        lock what they cache, as an admitted sequence's do."""
        if self.caching and seq.lease is None:
            seq.lease = self.tree.match((), seq.request.req.namespace).lease

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
