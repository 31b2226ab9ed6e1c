"""Values returned by the radix tree: leases, match and insert results, cache statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixd.radix.blockids import BlockIds

if TYPE_CHECKING:
    from radixd.radix.node import Node
    from radixd.radix.tree import RadixTree


class Lease:
    """Locks a matched path against eviction until :meth:`release` (idempotent).

    Releasing a lease whose nodes were dropped by ``flush("drop_all")`` is a harmless no-op. The lease of
    an empty match locks nothing yet, but it is live: ``insert(lease=...)`` locks the inserted path
    with it, exactly as it moves a lease that locked a matched path.
    """

    __slots__ = ("_epoch", "_namespace", "_node", "_open", "_tree")

    def __init__(self, tree: RadixTree, node: Node | None, epoch: int, namespace: str) -> None:
        self._tree = tree
        self._node = node  # the end of the locked path (None: nothing locked yet)
        self._namespace = namespace  # the namespace of that path
        self._epoch = epoch
        self._open = True

    @property
    def released(self) -> bool:
        """True once released."""
        return not self._open

    @property
    def locks_path(self) -> bool:
        """Whether the lease holds a path of cached nodes now (False for an empty match's lease until
        an insert gives it one, and after release)."""
        return self._node is not None

    def release(self) -> None:
        if self._open:
            self._open = False
            if self._node is not None:
                self._tree._release(self)

    def clone(self) -> Lease:
        """Another lease on the same path (e.g. one per forked sequence); released independently."""
        return self._tree._clone_lease(self)

    def __repr__(self) -> str:
        return f"Lease(released={self.released}, locks_path={self.locks_path})"


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
    """Result of :meth:`RadixTree.insert`.

    ``duplicate_blocks``: the caller's blocks the tree did not adopt because it already caches the same
    tokens in other blocks (the caller may release them; it still holds its references).
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
