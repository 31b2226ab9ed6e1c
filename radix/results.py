"""Values returned by the radix tree: match and insert results, cache statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from radixd.radix.blockids import BlockIds
from radixd.radix.lease import Lease


@dataclass(slots=True)
class PrefixMatch:
    """Result of :meth:`RadixTree.match`: the cached full blocks (``block_ids``, ``num_tokens`` tokens),
    the partly matching next block and its matched tokens (to copy), and the ``lease`` to release."""

    block_ids: BlockIds
    num_tokens: int
    partial_block: int | None
    partial_tokens: int
    lease: Lease

    @property
    def blocks(self) -> list[int]:
        """The matched full blocks as a new list (a scheduler keeping packed tables uses ``block_ids``)."""
        return self.block_ids.tolist()

    @property
    def cached_tokens(self) -> int:
        """Tokens whose KV the cache supplies: full blocks plus the partial block's matched tokens."""
        return self.num_tokens + self.partial_tokens


@dataclass(slots=True)
class InsertResult:
    """Result of :meth:`RadixTree.insert_table`: the table's blocks released as duplicates of cached ones,
    the tokens cached before the insert and the tokens it added."""

    duplicate_blocks: list[int]
    num_cached_tokens: int
    num_new_tokens: int


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of pool and cache state: free + evictable + in_use == usable blocks (``cached_blocks``
    and ``pinned_blocks`` overlap those classes)."""

    block_size: int
    usable_blocks: int
    free_blocks: int
    evictable_blocks: int
    in_use_blocks: int
    cached_blocks: int
    pinned_blocks: int
    pin_budget_blocks: int
    nodes: int
    leases: int
    hit_tokens: int
    miss_tokens: int
    evicted_blocks: Mapping[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        total = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / total if total else 0.0
