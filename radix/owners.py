"""Owners: the registry of cache entries that own blocks, and the exact count of evictable blocks.

An owner's small id sits in the high half of its blocks' state words (radix/words.py).
"""

from __future__ import annotations

from typing import Protocol


class BlockOwner(Protocol):
    """A cache entry (a tree node) that owns blocks: ``n_solo`` (its blocks with refcount 1), ``hold``
    (lease + pin count; 0: evictable) and ``oid`` (its registry id, 0: none)."""

    n_solo: int
    hold: int
    oid: int


class Owners:
    """Owner ids -> owners, with ids reused; and ``evictable``, the sum of ``n_solo`` over unheld owners."""

    # NOTE: invariants: an owner is registered exactly while it owns blocks; every id in `by_id` is < the
    # number of live owners + 1, so ids fit the 31 bits of a state word above OWNER_SHIFT.

    __slots__ = ("_free_ids", "_next_id", "by_id", "evictable")

    def __init__(self) -> None:
        self.by_id: dict[int, BlockOwner] = {}
        self.evictable = 0
        self._free_ids: list[int] = []
        self._next_id = 1

    def __len__(self) -> int:
        return len(self.by_id)

    def register(self, owner: BlockOwner) -> int:
        """Give ``owner`` an id (a dropped owner's, when there is one) and return it."""
        if self._free_ids:
            oid = self._free_ids.pop()
        else:
            oid = self._next_id
            self._next_id = oid + 1
        self.by_id[oid] = owner
        owner.oid = oid
        return oid

    def unregister(self, owner: BlockOwner) -> None:
        if self.by_id.pop(owner.oid, None) is not None:
            self._free_ids.append(owner.oid)
        owner.oid = 0

    def get(self, oid: int) -> BlockOwner | None:
        return self.by_id.get(oid)
