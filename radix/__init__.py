"""Paged KV memory management for radixd: block pool, radix prefix cache, block tables, memory model.

Pure Python (stdlib, numpy); no torch, no grpc. Not thread-safe: the engine thread owns all of it.
Everything public is re-exported here; radix/README.md lists the API, the modules and the engine's
protocol for one request."""

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
from radixd.radix.sliding import SlidingTable, window_start
from radixd.radix.store import EVICT_REASONS
from radixd.radix.table import AppendResult, BlockTable, CopyOp, append_one_each, blocks_for_one_each
from radixd.radix.tree import RUN_EVICTION_BUDGET, RadixTree
from radixd.radix.windows import KeptWindow, WindowStore

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
    "KeptWindow",
    "Lease",
    "NotPinned",
    "OutOfBlocks",
    "PinBudgetExceeded",
    "PrefixMatch",
    "RadixError",
    "RadixTree",
    "SlidingTable",
    "TokenKey",
    "UnknownLease",
    "WindowStore",
    "append_one_each",
    "blocks_for_one_each",
    "encode_tokens",
    "token_ids",
    "window_start",
]
