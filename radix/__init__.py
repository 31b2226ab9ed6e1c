"""Paged KV memory management for radixd: block pool, radix prefix cache, block tables, memory model.

Pure Python (stdlib, numpy); no torch, no grpc. Not thread-safe: the engine thread owns
all of it. Public API (everything below is re-exported here)::

    RadixError                 base of all errors; subclasses:
        InvalidRequest (also a ValueError), OutOfBlocks, DoubleFree, PinBudgetExceeded,
        UnknownLease, NotPinned

    BlockPool(num_blocks, block_size=16)          block 0 = NULL_BLOCK, never handed out
        allocate(n) -> list[int]      refcount 1 each; OutOfBlocks (no change) if short
        allocate_ids(n) -> BlockIds   the same, packed (one slice per run of the free extents)
        allocate_into(ids, n, after=0)  the same, appended to a packed id array (a table's blocks);
                                      the blocks right after `after` when free (a table stays a run)
        incref(b); decref(b) -> bool (True when freed); incref_all(bs); decref_all(bs) -> int
        refcount(b); solo(packed ids) -> list[bool] (refcount == 1, one vectorized read)
        num_free; num_evictable; num_in_use; num_usable; num_blocks; block_size
        holds_run(n) -> bool (n consecutive free ids); longest_free_run() -> int

    Token keys: methods taking ``tokens`` accept a sequence of ints, packed bytes, or
    ``encode_tokens(ids) -> TokenKey`` (a read-only sequence of ids over native int32 bytes,
    ``.packed``). The tree compares packed tokens with memcmp, so matching a long prefix costs almost
    nothing per token; a scheduler can keep each request's TokenKey, which the tree reads without a
    conversion or a copy. token_ids(packed) unpacks.

    Block ids: ``BlockIds`` (native int32 bytes; len(), indexing, iteration count ids; .array() is a
    zero-copy int32 view) is how the tree stores blocks and hands them out without a Python step per
    block.

    RadixTree(pool, pin_budget_fraction=0.25)     one tree per pool
        match(tokens, namespace="") -> PrefixMatch(block_ids, num_tokens, partial_block,
                                                   partial_tokens, lease)   [.blocks, .cached_tokens]
            full cached blocks (packed; .blocks as a list) + the partially matching next block; the
            lease locks the path (an empty match's lease locks the path its insert creates)
        peek(tokens, namespace="") -> int          cached prefix length, no lock / LRU / stats
        insert_table(tokens, table, n_blocks, ns, lease, final=False) -> InsertResult(duplicate_blocks,
            num_cached_tokens, num_new_tokens)     a table's new blocks to the tree (below)
        release(lease); Lease.release() (idempotent); Lease.clone()
        evict(n_blocks) -> list[int] (freed); evict_count(n_blocks) -> int (how many freed)
        evict_for_run(n_blocks, budget=None) -> int   LRU leaves (about `budget` blocks at most,
            RUN_EVICTION_BUDGET * n_blocks by default) until n_blocks consecutive ids are free
        evict_prefix(tokens, namespace="") -> int; flush() -> int (everything no lease or pin holds)
        pin(tokens, namespace="") -> int; unpin(tokens, namespace="") -> int
        evictable_blocks() -> int (exact, O(1)); stats() -> CacheStats
        listener: CacheListener | None (content changes; FanOut(*listeners) feeds several)
        replay(listener) -> int         every node reported as `stored`, parents first
        num_nodes; num_cached_blocks; num_pinned_blocks; num_leases; block_size; pin_budget_blocks

    BlockTable(pool)                blocks: array('i') (packed ids); num_tokens: int; leased: int
        lease_prefix(block_ids) (no reference: the owner's lease keeps them); share_prefix(blocks, n)
        copy_partial(src_block, n_tokens) -> CopyOp
        append(n) -> list[CopyOp]; append_slots(n) -> AppendResult(slots, copies)  (CoW of a shared tail)
        fork(k) -> list[BlockTable]; release() -> int (idempotent); slot(pos)
    append_one_each(tables, make_room=None) -> list[CopyOp]   append(1) on every table of a decode
        step, all-or-nothing; make_room(need) -> bool is asked (once) when the pool is short
        blocks_for_one_each(tables) -> int      the fresh blocks it takes (one vectorized refcount read)
    tree.insert_table(tokens, table, n_blocks, ns, lease, final=False)   the table's blocks after its
        leased ones are donated to the tree, which releases duplicates (the table reads the tree's
        blocks); the lease follows the inserted path unless final (the owner releases both next)
    CopyOp = tuple[int, int, int]                  (src_block, dst_block, n_tokens)

    CacheStats: free / evictable / in_use blocks (sum = usable), cached, pinned, pin budget,
        nodes, leases, hit / miss tokens, evicted_blocks by reason ("lru", "prefix", "flush",
        "superseded"), hit_rate

    KVSpec(num_layers, num_kv_heads, head_dim, dtype_bytes=2, block_size=16)
        bytes_per_token, bytes_per_block, bytes_per_block_per_layer, bytes_for_tokens(n),
        blocks_for_budget(bytes), tokens_for_budget(bytes); presets LLAMA3_8B, LLAMA3_70B, LLAMA2_70B

Debugging: ``radixd.radix.verify.check_consistency(tree, tables)`` checks every invariant (O(n)).
Layout: errors, blockids, extents, pool (blocks, refcounts, and the only code that changes a block's
owner), node, lru (the LRU index and its clock), events; the tree is one class (tree: match, insert,
evict) composed of the owners of its state: store (nodes and counts; the one descent), holds (the locks
of leases and pins), pins (pins and their budget), lease; results; table, memory, verify.

Engine protocol for one request (B = block size; what daemon/engine/kv.py does)::

    key = encode_tokens(prompt)                    # packed once, extended as tokens are accepted
    m = tree.match(key[:-1], ns)                   # lock the cached prefix
    table = BlockTable(pool); table.lease_prefix(m.block_ids)
    copies = [table.copy_partial(m.partial_block, m.partial_tokens)] if m.partial_block else []
    copies += table.append(len(prompt) - table.num_tokens)       # prefill the rest ...
    tree.insert_table(key[: n_full * B], table, n_full, ns, m.lease)  # cache full blocks; lease follows
    ...                                            # decode, inserting each block that fills
    tree.insert_table(key, table, n_all, ns, m.lease, final=True)     # finished: every computed token
    table.release(); m.lease.release()             # the table first: the lease keeps its leased blocks
"""

from radixd.radix.blockids import BlockIds
from radixd.radix.errors import (
    DoubleFree,
    InvalidRequest,
    NotPinned,
    OutOfBlocks,
    PinBudgetExceeded,
    RadixError,
    UnknownLease,
)
from radixd.radix.events import CacheListener, FanOut
from radixd.radix.lease import Lease
from radixd.radix.memory import LLAMA2_70B, LLAMA3_8B, LLAMA3_70B, KVSpec
from radixd.radix.node import TOKEN_BYTES, TokenKey, encode_tokens, token_ids
from radixd.radix.pool import NULL_BLOCK, BlockPool
from radixd.radix.results import CacheStats, InsertResult, PrefixMatch
from radixd.radix.store import EVICT_REASONS
from radixd.radix.table import AppendResult, BlockTable, CopyOp, append_one_each, blocks_for_one_each
from radixd.radix.tree import RUN_EVICTION_BUDGET, RadixTree

__all__ = [
    "EVICT_REASONS",
    "LLAMA2_70B",
    "LLAMA3_8B",
    "LLAMA3_70B",
    "NULL_BLOCK",
    "RUN_EVICTION_BUDGET",
    "TOKEN_BYTES",
    "AppendResult",
    "BlockIds",
    "BlockPool",
    "BlockTable",
    "CacheListener",
    "CacheStats",
    "CopyOp",
    "DoubleFree",
    "FanOut",
    "InsertResult",
    "InvalidRequest",
    "KVSpec",
    "Lease",
    "NotPinned",
    "OutOfBlocks",
    "PinBudgetExceeded",
    "PrefixMatch",
    "RadixError",
    "RadixTree",
    "TokenKey",
    "UnknownLease",
    "append_one_each",
    "blocks_for_one_each",
    "encode_tokens",
    "token_ids",
]
