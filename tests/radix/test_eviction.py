"""Eviction: LRU order, cascade, leases, evict_prefix, flush, pins and the pin budget."""

from __future__ import annotations

import pytest
from radix_kit import cache

from radixd.radix import (
    BlockPool,
    BlockTable,
    NotPinned,
    PinBudgetExceeded,
    RadixTree,
)
from radixd.radix.verify import check_consistency

A = [1, 1, 1, 1, 1, 1, 1, 1]
B = [2, 2, 2, 2, 2, 2, 2, 2]
C = [3, 3, 3, 3, 3, 3, 3, 3]


@pytest.fixture
def tree() -> RadixTree:
    return RadixTree(BlockPool(41, 4))  # 40 usable blocks; pin budget 10


def test_lru_order_follows_last_use(tree: RadixTree) -> None:
    a, b, c = cache(tree, A), cache(tree, B), cache(tree, C)
    tree.match(A).lease.release()  # A is now the most recently used
    assert sorted(tree.evict(1)) == sorted(b)  # B is the oldest leaf: both its blocks go
    assert sorted(tree.evict(2)) == sorted(c)
    assert sorted(tree.evict(2)) == sorted(a)
    assert tree.evict(5) == []
    check_consistency(tree)


def test_eviction_cascades_to_parents_that_become_leaves(tree: RadixTree) -> None:
    cache(tree, [7, 7, 7, 7, 1, 1, 1, 1])
    cache(tree, [7, 7, 7, 7, 2, 2, 2, 2])
    assert tree.num_nodes == 3 and tree.evictable_blocks() == 3
    freed = tree.evict(3)
    assert len(freed) == 3 and tree.num_nodes == 0  # both leaves, then their shared parent
    assert tree.stats().evicted_blocks["lru"] == 3
    check_consistency(tree)


def test_leased_paths_are_never_evicted(tree: RadixTree) -> None:
    a = cache(tree, A)
    cache(tree, B)
    m = tree.match(A)
    freed = tree.evict(100)
    assert set(freed).isdisjoint(a) and tree.peek(A) == 8
    m.lease.release()
    assert sorted(tree.evict(100)) == sorted(a)


def test_evict_returns_only_blocks_that_became_free(tree: RadixTree) -> None:
    pool = tree.pool
    cache(tree, A)
    m = tree.match(A)
    table = BlockTable(pool)
    table.share_prefix(m.blocks, m.num_tokens)
    m.lease.release()  # the table still holds them and holds no lease
    assert tree.evictable_blocks() == 0  # nothing would be freed by evicting
    assert tree.evict(2) == [] and tree.num_nodes == 0  # dropped from the cache, still in use
    assert table.release() == 2
    check_consistency(tree, [])


def test_evict_prefix_drops_extending_entries_only(tree: RadixTree) -> None:
    cache(tree, [5, 5, 5, 5, 1, 1, 1, 1])
    cache(tree, [5, 5, 5, 5, 2, 2, 2, 2])
    c = cache(tree, C)
    m = tree.match([5, 5, 5, 5, 2, 2, 2, 2])  # this one is in use
    assert tree.evict_prefix([5, 5, 5, 5, 1]) == 1
    assert tree.evict_prefix([5, 5]) == 0  # the rest of that subtree is leased
    m.lease.release()
    assert tree.evict_prefix([5, 5]) == 2
    assert tree.peek(C) == 8 and tree.match(C).blocks == c
    check_consistency(tree)


def test_flush_evicts_what_no_lease_holds(tree: RadixTree) -> None:
    cache(tree, A)
    cache(tree, B)
    m = tree.match(A)
    assert tree.flush() == 2 and tree.peek(A) == 8 and tree.num_cached_blocks == 2
    m.lease.release()
    assert tree.flush() == 2
    assert tree.pool.num_free == tree.pool.num_usable


def test_a_flush_leaves_outstanding_holders_their_blocks(tree: RadixTree) -> None:
    pool = tree.pool
    cache(tree, A)
    m = tree.match(A)
    table = BlockTable(pool)
    table.share_prefix(m.blocks, m.num_tokens)
    assert tree.flush() == 0 and tree.num_nodes == 1 and tree.num_leases == 1  # leased
    m.lease.release()
    m.lease.release()  # idempotent
    assert tree.flush() == 2  # the tree let go of them ...
    assert tree.num_nodes == 0 and tree.num_leases == 0
    check_consistency(tree, [table])  # ... and the table still holds them
    assert table.release() == 2 and pool.num_free == pool.num_usable
    cache(tree, A)  # the tree keeps working after a flush
    assert tree.peek(A) == 8


def test_pin_protects_until_unpin(tree: RadixTree) -> None:
    a = cache(tree, A)
    assert tree.pin(A) == 8 and tree.num_pinned_blocks == 2
    assert tree.pin(A) == 8 and tree.num_pinned_blocks == 2  # idempotent
    assert tree.evict(10) == [] and tree.flush() == 0
    assert tree.unpin(A) == 8
    assert sorted(tree.evict(10)) == sorted(a)
    with pytest.raises(NotPinned, match="no pin for these 8 tokens"):
        tree.unpin(A)


def test_pin_of_a_prefix_splits_at_a_block_boundary(tree: RadixTree) -> None:
    cache(tree, [4] * 16)
    assert tree.pin([4] * 9) == 8  # whole blocks only: 2 of the 4
    assert tree.num_pinned_blocks == 2
    assert len(tree.evict(10)) == 2 and tree.peek([4] * 16) == 8
    check_consistency(tree)


def test_pin_budget_is_enforced_without_side_effects(tree: RadixTree) -> None:
    assert tree.pin_budget_blocks == 10
    big = [9] * 32  # 8 blocks
    cache(tree, big)
    cache(tree, [8] * 16)  # 4 blocks
    tree.pin(big)
    with pytest.raises(PinBudgetExceeded, match="pinning 4 more blocks would exceed the pin budget: 8 of 10"):
        tree.pin([8] * 16)
    assert tree.num_pinned_blocks == 8
    tree.pin(big[:8])  # already inside the pinned path: costs nothing
    assert tree.num_pinned_blocks == 8
    assert tree.flush() == 4  # all but the pinned path
    tree.unpin(big[:8])
    tree.unpin(big)
    assert tree.flush() == 8 and tree.num_pinned_blocks == 0
    check_consistency(tree)


def test_evictable_count_is_exact(tree: RadixTree) -> None:
    pool = tree.pool
    cache(tree, A)
    m = tree.match(A)
    table = BlockTable(pool)
    table.share_prefix(m.blocks, m.num_tokens)
    m.lease.release()
    assert tree.evictable_blocks() == 0  # a table still reads them
    table.release()
    assert tree.evictable_blocks() == 2
    s = tree.stats()
    assert (s.free_blocks, s.evictable_blocks, s.in_use_blocks) == (38, 2, 0)


def test_evict_count_frees_like_evict_and_counts_only_freed_blocks(tree: RadixTree) -> None:
    pool = tree.pool
    cache(tree, A)
    b = cache(tree, B)
    table = BlockTable(pool)
    m = tree.match(B)
    table.share_prefix(m.blocks, m.num_tokens)  # B's blocks stay held by a table once evicted
    m.lease.release()
    free = pool.num_free
    assert tree.evict_count(1) == 2  # A goes first (oldest): its 2 blocks become free
    assert tree.evict_count(1) == 0  # B's node goes, but the table still holds its blocks
    assert tree.num_cached_blocks == 0 and pool.num_free == free + 2
    assert table.release() == len(b) and pool.num_free == pool.num_usable
    check_consistency(tree)


def test_evict_for_run_joins_scraps_from_the_cold_end_within_its_budget() -> None:
    tree = RadixTree(BlockPool(11, 4))
    pool = tree.pool
    entries = [cache(tree, [i] * 4) for i in range(1, 11)]  # one block each, ids 1..10, pool full
    assert [e[0] for e in entries] == list(range(1, 11)) and pool.num_free == 0
    for i in range(2, 11, 2):  # the even ids are used again: the odd ones are the cold end
        tree.match([i] * 4).lease.release()
    assert tree.evict_for_run(2, budget=4) == 4  # 1, 3, 5, 7: scraps, no two neighbours
    assert pool.longest_free_run() == 1
    assert tree.evict_for_run(2) == 2  # 9, then 2, which joins 1 and 3
    assert pool.longest_free_run() == 3 and pool.num_free == 6
    assert tree.evict_for_run(3) == 0  # a run is already free: nothing more goes
    assert tree.peek([4] * 4) == 4 and tree.peek([2] * 4) == 0
    check_consistency(tree)
