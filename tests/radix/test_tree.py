"""RadixTree: matching, insertion, splits, namespaces."""

from __future__ import annotations

from array import array

import pytest
from radix_kit import cache, computed, insert_finished

from radixd.radix import (
    BlockPool,
    BlockTable,
    InvalidRequest,
    PrefixMatch,
    RadixTree,
    UnknownLease,
)
from radixd.radix.node import Node
from radixd.radix.verify import check_consistency, iter_nodes


@pytest.fixture
def tree() -> RadixTree:
    return RadixTree(BlockPool(64, 4))


def test_partial_block_match_reports_block_and_count(tree: RadixTree) -> None:
    blocks = cache(tree, list(range(10)))  # 2 full blocks + a partial one (2 tokens)
    m = tree.match([0, 1, 2, 3, 4, 5, 99])
    assert (m.blocks, m.num_tokens, m.partial_block, m.partial_tokens) == ([blocks[0]], 4, blocks[1], 2)
    assert m.cached_tokens == 6
    m.lease.release()
    m = tree.match([*list(range(10)), 7, 7])  # covers the partial leaf entirely
    assert (m.blocks, m.partial_block, m.partial_tokens) == (blocks[:2], blocks[2], 2)
    m.lease.release()
    check_consistency(tree)


def test_partial_match_against_a_sibling_block(tree: RadixTree) -> None:
    a = cache(tree, [0, 0, 0, 0, 1, 1, 1, 1])
    cache(tree, [0, 0, 0, 0, 2, 2, 2, 2])
    m = tree.match([0, 0, 0, 0, 1, 1, 5])
    assert (m.blocks, m.partial_block, m.partial_tokens) == ([a[0]], a[1], 2)
    m.lease.release()
    m = tree.match([0, 0, 9])  # query shorter than a block: partial of the first block
    assert (m.blocks, m.partial_block, m.partial_tokens) == ([], a[0], 2)
    m.lease.release()


def test_tokens_are_compared_exactly(tree: RadixTree) -> None:
    cache(tree, [1, 2, 3, 4, 5, 6, 7, 8])
    m = tree.match([1, 2, 3, 4, 5, 6, 7, 9])
    assert m.num_tokens == 4 and m.partial_tokens == 3
    m.lease.release()
    assert tree.peek([2, 2, 3, 4]) == 0


def test_split_happens_only_at_block_boundaries(tree: RadixTree) -> None:
    a = cache(tree, [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
    assert tree.num_nodes == 1
    b = cache(tree, [1, 1, 1, 1, 2, 2, 9, 9])  # diverges inside block 1
    assert tree.num_nodes == 3  # shared [block 0] + two leaves; nothing split mid-block
    assert tree.num_cached_blocks == 3 + 1
    m = tree.match([1, 1, 1, 1, 2, 2, 9, 9])
    assert m.blocks == [a[0], b[1]]  # the shared first block is held once
    m.lease.release()
    check_consistency(tree)


def test_insert_reports_duplicates_and_keeps_the_cached_blocks(tree: RadixTree) -> None:
    first = cache(tree, list(range(8)))
    table = computed(tree, 10)
    mine = table.blocks.tolist()
    res = insert_finished(tree, [*list(range(8)), 50, 51], table)
    assert res.duplicate_blocks == mine[:2]
    assert (res.num_cached_tokens, res.num_new_tokens) == (8, 2)
    assert all(tree.pool.refcount(b) == 0 for b in mine[:2])  # the tree released the duplicates
    m = tree.match(list(range(8)))
    assert m.blocks == first
    m.lease.release()


def test_shared_blocks_are_not_duplicates(tree: RadixTree) -> None:
    cache(tree, list(range(8)))
    m = tree.match([*list(range(8)), 9, 9])
    table = BlockTable(tree.pool)
    table.lease_prefix(m.block_ids)
    table.append(2)
    res = tree.insert_table([*list(range(8)), 9, 9], table, 3, "", m.lease)
    assert res.duplicate_blocks == []
    table.release()
    m.lease.release()


def test_covered_partial_tail_is_a_duplicate(tree: RadixTree) -> None:
    blocks = cache(tree, list(range(8)))
    table = computed(tree, 6)
    mine = table.blocks.tolist()
    res = insert_finished(tree, [0, 1, 2, 3, 4, 5], table)  # 1 full + 2 of the cached second block
    assert res.duplicate_blocks == mine and res.num_new_tokens == 0
    assert tree.peek([0, 1, 2, 3, 4, 5]) == 6 and tree.match([0, 1, 2, 3, 4, 5]).blocks == blocks[:1]


def test_partial_leaf_is_superseded_unless_leased(tree: RadixTree) -> None:
    cache(tree, [0, 1, 2, 3, 4, 5])  # [block][2-token partial]
    cache(tree, [0, 1, 2, 3, 4, 5, 6, 7, 8])  # extends the partial block: the old one goes
    assert tree.stats().evicted_blocks["superseded"] == 1
    check_consistency(tree)

    t2 = RadixTree(BlockPool(64, 4))
    cache(t2, [0, 1, 2, 3, 4, 5])
    m = t2.match([0, 1, 2, 3, 4, 5])  # a reader may be copying the partial block: keep it
    cache(t2, [0, 1, 2, 3, 4, 5, 6, 7, 8])
    assert t2.stats().evicted_blocks["superseded"] == 0
    assert t2.peek([0, 1, 2, 3, 4, 5, 6, 7, 8]) == 9
    m.lease.release()
    check_consistency(t2)


def test_insert_validates_blocks_and_changes_nothing_on_error(tree: RadixTree) -> None:
    pool = tree.pool
    lease = tree.match(()).lease
    with pytest.raises(InvalidRequest, match=r"needs ceil\(5/4\) = 2 blocks, got 1"):
        tree.insert_table([1, 2, 3, 4, 5], computed(tree, 4), 1, "", lease)
    good = pool.allocate(1)
    never_allocated = 60
    for blocks, error in (([good[0], never_allocated], "block 60 is free"), ([good[0]] * 2, "given twice")):
        table = BlockTable(pool)  # a table that would hold these ids (the caller's references)
        table.blocks, table.num_tokens = array("i", blocks), 5
        with pytest.raises(InvalidRequest, match=error):
            tree.insert_table([1, 2, 3, 4, 5], table, 2, "", lease)
    assert tree.num_nodes == 0 and pool.refcount(good[0]) == 1
    check_consistency(tree)


def _resumed(tree: RadixTree, m: PrefixMatch, n_tokens: int) -> BlockTable:
    """A table started from the match's leased blocks and grown to `n_tokens` slots (KVManager.attach)."""
    table = BlockTable(tree.pool)
    table.lease_prefix(m.block_ids)
    table.append(n_tokens - table.num_tokens)
    return table


def test_insert_after_cached_blocks_takes_only_the_new_ones(tree: RadixTree) -> None:
    shared = cache(tree, list(range(8)))  # 2 blocks
    m = tree.match(list(range(13)))
    assert m.blocks == shared
    table = _resumed(tree, m, 13)  # tokens 8..12: one full block and a partial one
    new = table.blocks[2:].tolist()
    res = tree.insert_table(list(range(13)), table, 4, "", m.lease, final=True)
    assert res.duplicate_blocks == [] and (res.num_cached_tokens, res.num_new_tokens) == (8, 5)
    table.release()
    m.lease.release()
    again = tree.match(list(range(13)))
    assert again.blocks == [*shared, new[0]] and again.partial_block == new[1]
    again.lease.release()
    check_consistency(tree)


def test_insert_after_cached_blocks_reports_duplicates_and_splits(tree: RadixTree) -> None:
    pool = tree.pool
    cache(tree, list(range(16)))  # one node of 4 blocks
    m = tree.match(list(range(4)))  # one cached block, locked
    # Another request cached tokens 4..11 meanwhile (they are in the node): ours are duplicates there,
    # and the node splits where our tokens leave it.
    table = _resumed(tree, m, 16)
    mine = table.blocks[1:].tolist()
    res = tree.insert_table([*range(12), 99, 98, 97, 96], table, 4, "", m.lease)
    assert res.duplicate_blocks == mine[:2] and res.num_new_tokens == 4
    assert pool.refcount(mine[0]) == 0 and pool.refcount(mine[2]) == 1  # duplicates freed, the rest adopted
    check_consistency(tree, [table])
    table.release()
    m.lease.release()
    check_consistency(tree)


def test_insert_after_cached_blocks_refuses_what_is_not_cached(tree: RadixTree) -> None:
    pool = tree.pool
    cache(tree, list(range(8)))
    m = tree.match(list(range(8)))  # two cached blocks, locked
    before = tree.stats()
    claimed = pool.allocate_ids(1)
    table = BlockTable(pool)
    table.lease_prefix(m.block_ids + claimed)  # claims a third leased block
    table.append(4)
    with pytest.raises(InvalidRequest, match=r"only 2 leading blocks of these tokens are cached"):
        tree.insert_table(list(range(16)), table, 4, "", m.lease)  # the third block was never cached
    table.release()
    pool.decref_all(claimed)
    table = _resumed(tree, m, 12)
    with pytest.raises(InvalidRequest, match=r"only 1 leading blocks"):
        tree.insert_table([0, 1, 2, 3, 9, 9, 9, 9, 5, 5, 5, 5], table, 3, "", m.lease)  # diverges inside
    with pytest.raises(InvalidRequest, match=r"cached=2\) must be within \[0, 1\]"):
        tree.insert_table(list(range(7)), table, 2, "", m.lease)
    with pytest.raises(InvalidRequest, match=r"needs ceil\(16/4\) - 2 = 2 blocks, got 1"):
        tree.insert_table(list(range(16)), table, 3, "", m.lease)
    with pytest.raises(InvalidRequest, match=r"only 0 leading blocks"):
        tree.insert_table(list(range(12)), table, 3, "nobody", m.lease)  # nothing cached there
    assert tree.peek(list(range(8)), "nobody") == 0 and "nobody" not in tree.store.roots
    after = tree.stats()
    assert (after.nodes, after.cached_blocks, table.leased) == (before.nodes, before.cached_blocks, 2)
    check_consistency(tree, [table])
    table.release()
    m.lease.release()


def test_namespaces_never_share(tree: RadixTree) -> None:
    a = cache(tree, list(range(8)), ns="alice")
    assert tree.peek(list(range(8)), "bob") == 0 and tree.peek(list(range(8))) == 0
    b = cache(tree, list(range(8)), ns="bob")
    assert set(a).isdisjoint(b)
    assert tree.evict_prefix([], "alice") == 2
    assert tree.peek(list(range(8)), "bob") == 8
    check_consistency(tree)


def test_match_locks_and_release_is_idempotent(tree: RadixTree) -> None:
    cache(tree, list(range(8)))
    m = tree.match(list(range(8)))
    assert tree.evictable_blocks() == 0 and tree.num_leases == 1
    m.lease.release()
    m.lease.release()
    tree.release(m.lease)
    assert tree.evictable_blocks() == 2 and tree.num_leases == 0
    other = RadixTree(BlockPool(8, 4))
    with pytest.raises(UnknownLease, match="another RadixTree"):
        other.release(m.lease)
    empty = tree.match([42])
    assert empty.blocks == [] and not empty.lease.released and not empty.lease.locks_path
    empty.lease.release()
    assert empty.lease.released and tree.num_leases == 0


@pytest.mark.parametrize(
    ("query", "locked"),
    [([0, 1, 2, 3, 4, 5, 99], 2), ([*range(8), 99], 2), ([0, 1, 99], 1), (list(range(20)), 5)],
    ids=["partial-block", "block-boundary", "first-block", "whole-node"],
)
def test_a_match_locks_only_the_blocks_it_reuses(tree: RadixTree, query: list[int], locked: int) -> None:
    """A match ending inside a long cached node splits it after the blocks it reuses (a partially
    matched block included: its request copies it), so the node's tail stays evictable."""
    blocks = cache(tree, list(range(20)))  # one node of 5 blocks
    m = tree.match(query)
    assert tree.evictable_blocks() == 5 - locked
    assert sorted(tree.evict(5)) == sorted(blocks[locked:])
    check_consistency(tree)
    m.lease.release()
    assert tree.evictable_blocks() == locked
    assert tree.peek(query) == len([t for t in query if t != 99])  # the reused tokens are all still there
    check_consistency(tree)


def test_an_empty_match_lease_locks_the_path_its_insert_creates(tree: RadixTree) -> None:
    """The engine's sequence: nothing cached -> compute -> insert with the match's lease -> pressure."""
    m = tree.match(list(range(8)))
    assert m.blocks == [] and not m.lease.locks_path
    table = _resumed(tree, m, 8)
    tree.insert_table(list(range(8)), table, 2, "", m.lease)
    assert m.lease.locks_path and tree.num_leases == 1
    twin = m.lease.clone()  # a forked sequence's lease locks the same path
    assert tree.evict_count(2) == 0 and tree.peek(list(range(8))) == 8
    m.lease.release()
    assert tree.evict_count(2) == 0, "the clone still locks the path"
    twin.release()
    table.release()  # the sequence ends; only the tree holds the blocks now
    assert tree.evictable_blocks() == 2 and tree.evict_count(2) == 2


def test_insert_moves_the_lease_to_the_inserted_path(tree: RadixTree) -> None:
    cache(tree, list(range(4)))
    m = tree.match([*list(range(4)), 9])
    table = _resumed(tree, m, 8)
    tree.insert_table([*list(range(4)), 9, 9, 9, 9], table, 2, "", m.lease)
    assert tree.evictable_blocks() == 0  # the whole new path is leased
    table.release()
    m.lease.release()
    assert tree.evictable_blocks() == 2
    other = RadixTree(BlockPool(8, 4))
    with pytest.raises(UnknownLease):
        other.insert_table([1], computed(other, 1), 1, "", m.lease)


def test_stats_count_hits_and_misses(tree: RadixTree) -> None:
    cache(tree, list(range(8)))
    tree.match([*list(range(6)), 0, 0]).lease.release()
    s = tree.stats()
    assert (s.hit_tokens, s.miss_tokens) == (6, 2)
    assert s.hit_rate == pytest.approx(0.75)
    assert s.free_blocks + s.evictable_blocks + s.in_use_blocks == s.usable_blocks
    assert tree.peek(list(range(8))) == 8 and tree.stats().hit_tokens == 6  # peek leaves stats alone


def test_one_tree_per_pool_and_bad_fraction() -> None:
    pool = BlockPool(8, 4)
    RadixTree(pool)
    with pytest.raises(Exception, match="already serves a RadixTree"):
        RadixTree(pool)
    with pytest.raises(InvalidRequest, match="pin_budget_fraction"):
        RadixTree(BlockPool(8, 4), pin_budget_fraction=1.5)


def test_insert_table_hands_new_blocks_to_the_tree_and_reads_the_trees_duplicates(tree: RadixTree) -> None:
    """Two requests compute the same prompt at once (both matched nothing): the second insert finds
    the first's blocks cached, frees its own copies, and its table reads the tree's blocks after."""
    pool = tree.pool
    prompt = list(range(10))
    a, b = tree.match(prompt), tree.match(prompt)
    ta, tb = BlockTable(pool), BlockTable(pool)
    for t in (ta, tb):
        t.lease_prefix(tree.match([]).block_ids)  # empty: nothing leased yet
        t.append(len(prompt))
    own_b = list(tb.blocks)
    tree.insert_table(prompt[:8], ta, 2, "", a.lease)
    assert ta.leased == 2 and [pool.refcount(x) for x in ta.blocks] == [1, 1, 1]
    res = tree.insert_table(prompt[:8], tb, 2, "", b.lease)
    assert res.num_new_tokens == 0 and sorted(res.duplicate_blocks) == sorted(own_b[:2])
    assert tb.blocks[:2] == ta.blocks[:2] and tb.blocks[2] == own_b[2]
    assert all(pool.refcount(x) == 0 for x in own_b[:2])
    check_consistency(tree, [ta, tb])
    assert tree.evictable_blocks() == 0  # both leases lock the path
    for t, m in ((ta, a), (tb, b)):
        assert t.release() == 1
        m.lease.release()
    assert tree.evictable_blocks() == 2
    check_consistency(tree)


def test_insert_table_refuses_a_range_outside_the_table_or_an_empty_lease(tree: RadixTree) -> None:
    pool = tree.pool
    cache(tree, list(range(8)))
    m = tree.match(list(range(8)))
    t = BlockTable(pool)
    t.lease_prefix(m.block_ids)
    t.append(4)
    with pytest.raises(InvalidRequest, match="outside"):
        tree.insert_table(list(range(12)), t, 1, "", m.lease)
    with pytest.raises(InvalidRequest, match="outside"):
        tree.insert_table(list(range(16)), t, 4, "", m.lease)
    empty = tree.match([9, 9, 9, 9, 9])
    with pytest.raises(InvalidRequest, match="locks nothing"):
        tree.insert_table(list(range(12)), t, 3, "", empty.lease)
    empty.lease.release()
    # The key must fill exactly the blocks it is cached in, and the lease must be this tree's.
    with pytest.raises(InvalidRequest, match="insert of 13 tokens needs"):
        tree.insert_table(list(range(13)), t, 3, "", m.lease)
    with pytest.raises(InvalidRequest, match="insert of 8 tokens needs"):
        tree.insert_table(list(range(8)), t, 3, "", m.lease)
    other = RadixTree(BlockPool(8, 4))
    with pytest.raises(UnknownLease, match="another RadixTree"):
        tree.insert_table(list(range(12)), t, 3, "", other.match([1]).lease)
    assert t.leased == 2 and tree.peek(list(range(12))) == 8  # refused calls changed nothing
    tree.insert_table(list(range(12)), t, 3, "", m.lease)
    assert tree.peek(list(range(12))) == 12 and t.leased == 3
    check_consistency(tree, [t])
    t.release()
    m.lease.release()


def _published(tree: RadixTree, prompt: list[int], slots: int) -> tuple[PrefixMatch, BlockTable]:
    """A sequence as the engine runs it: matched (nothing cached), `slots` slots in its table, its
    prompt's blocks inserted with its lease, which now ends where the prompt does."""
    m = tree.match(prompt)
    table = BlockTable(tree.pool)
    table.lease_prefix(m.block_ids)
    table.append(slots)
    tree.insert_table(prompt, table, len(prompt) // tree.block_size, "", m.lease)
    return m, table


def _top_node(tree: RadixTree) -> Node:
    """The only node under the root (the first a walk from the root visits)."""
    (top,) = [x for x in iter_nodes(tree) if x.parent is not None and x.parent.parent is None]
    return top


def test_a_decoding_sequence_publishes_each_block_from_its_lease() -> None:
    """Block by block, as a running sequence publishes what it fills: the inserts continue at the
    lease's node (nodes above it are not walked, so a long generation's inserts stay O(1) each),
    the path stays locked and spells the table, and the final insert walks it from the root again
    (marking the whole path used as the sequence ends)."""
    tree = RadixTree(BlockPool(256, 4))
    tokens = list(range(8))
    m, table = _published(tree, tokens, 8)
    first = _top_node(tree)
    tick = first.tick
    for step in range(40 * 4):
        tokens.append(1000 + step)
        table.append(1)
        if len(tokens) % 4 == 0:
            tree.insert_table(tokens, table, len(tokens) // 4, "", m.lease)
            assert table.leased == len(tokens) // 4
    assert first.tick == tick, "a block-by-block insert walked the path from the root"
    assert tree.match(tokens).block_ids.tolist() == table.blocks.tolist()
    tree.evict(10_000)  # the lease keeps all of it
    again = tree.match(tokens)
    assert again.num_tokens == len(tokens)
    again.lease.release()
    check_consistency(tree, [table])
    tokens.append(7)
    table.append(1)
    tree.insert_table(tokens, table, table.num_blocks, "", m.lease, final=True)
    assert first.tick > tick
    table.release()
    m.lease.release()
    check_consistency(tree)


def test_an_insert_that_does_not_continue_its_lease_walks_from_the_root() -> None:
    """The lease's node is only a starting point when the key's leased part ends there and its last
    edge is the same: other earlier tokens, or another namespace, are checked from the root."""
    tree = RadixTree(BlockPool(64, 4))
    tokens = list(range(8))
    m, table = _published(tree, tokens, 12)
    wrong = [9, 9, 9, 9, 9, 9, 9, 9, 8, 9, 10, 11]
    with pytest.raises(InvalidRequest, match="leading blocks"):
        tree.insert_table(wrong, table, 3, "", m.lease)
    with pytest.raises(InvalidRequest, match="leading blocks"):
        tree.insert_table([*tokens, 8, 9, 10, 11], table, 3, "other", m.lease)
    assert table.leased == 2 and tree.peek([*tokens, 8, 9, 10, 11]) == 8  # refused: nothing changed
    tree.insert_table([*tokens, 8, 9, 10, 11], table, 3, "", m.lease)
    assert tree.peek([*tokens, 8, 9, 10, 11]) == 12
    check_consistency(tree, [table])
    table.release()
    m.lease.release()
    check_consistency(tree)


def test_following_reads_what_came_after_a_prefix(tree: RadixTree) -> None:
    """`following`: the tokens after a cached prefix (mid-block, at a node's end, across nodes), the
    most recently used branch where paths part, nothing across namespaces, and no state change."""
    cache(tree, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert tree.following([1, 2, 3], max_tokens=4) == [4, 5, 6, 7]
    assert tree.following([1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=4) == [10]
    assert tree.following([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == []
    assert tree.following([1, 2, 9]) == [] and tree.following([2]) == []
    assert tree.following([1, 2, 3], "tenant-b") == []
    assert tree.following([1, 2, 3], max_tokens=0) == []
    cache(tree, [1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23])  # a newer branch after the second block
    before = tree.stats()
    assert tree.following([1, 2, 3, 4, 5, 6], max_tokens=5) == [7, 8, 20, 21, 22]
    assert tree.stats() == before
    m = tree.match([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # using the old branch makes it the recent one
    m.lease.release()
    assert tree.following([1, 2, 3, 4, 5, 6], max_tokens=5) == [7, 8, 9, 10]
    check_consistency(tree)


def test_truncate_drops_a_rejected_draft(tree: RadixTree) -> None:
    table = computed(tree, 5)  # 2 blocks of 4
    table.append(6)  # a draft of 6 tokens: 3 blocks
    free = tree.pool.num_free
    assert table.truncate(7) == 1 and tree.pool.num_free == free + 1
    assert (table.num_tokens, len(table.blocks)) == (7, 2)
    with pytest.raises(InvalidRequest):
        table.truncate(8)
    table.release()
    assert tree.pool.num_free == tree.pool.num_usable
