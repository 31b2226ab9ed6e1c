"""Values returned by the radix tree: match and insert results, cache statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from radixd.radix.blockids import BlockIds
from radixd.radix.lease import Lease


@dataclass(slots=True)
class PrefixMatch:
    """Result of :meth:`RadixTree.match`.

    ``block_ids`` are the cached *full* blocks of the prefix, packed (a sequence of ints, see
    :class:`BlockIds`; ``num_tokens == len(block_ids) * block_size``); ``blocks`` is the same as a list.
    When the following block also matches partly, ``partial_block`` is that cached block and
    ``partial_tokens`` (1 .. block_size-1) how many of its leading tokens match: copy them
    (``BlockTable.copy_partial``) instead of recomputing. The caller must release ``lease``.
    """

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
    """Result of :meth:`RadixTree.insert_table`.

    ``duplicate_blocks``: the table's blocks the tree did not adopt because it already caches the same
    tokens in other blocks (the tree released them; the table reads the tree's blocks instead).
    ``num_cached_tokens``: tokens already cached before the insert; ``num_new_tokens``: tokens whose
    blocks the tree adopted (one tree reference each).
    """

    duplicate_blocks: list[int]
    num_cached_tokens: int
    num_new_tokens: int


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of pool and cache state.

    free + evictable + in_use == usable blocks. ``pinned_blocks`` (cached blocks under a pin) and
    ``cached_blocks`` (all blocks the tree holds) overlap those classes.
    """

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
