"""Packed block ids: the BlockIds sequence, run detection, packed allocation and packed inserts (a block
table's packed ids go to the tree as they are)."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from radix_kit import computed, insert_finished

from radixd.radix import BlockPool, BlockTable, InvalidRequest, OutOfBlocks, RadixTree
from radixd.radix.blockids import BlockIds, packed_runs, spells_runs
from radixd.radix.extents import FreeExtents
from radixd.radix.verify import check_consistency


def ids(*xs: int) -> BlockIds:
    return BlockIds(array("i", xs).tobytes())


def test_block_ids_behave_like_a_sequence_of_ints() -> None:
    b = ids(5, 6, 9)
    assert len(b) == 3 and list(b) == [5, 6, 9] and b.tolist() == [5, 6, 9]
    assert (b[0], b[2], b[-1], b[-3]) == (5, 9, 9, 5)
    assert isinstance(b[1:], BlockIds) and b[1:].tolist() == [6, 9] and b[::2].tolist() == [5, 9]
    assert b[5:].tolist() == [] and not BlockIds()
    assert b.array().dtype == np.int32 and b.array().tolist() == [5, 6, 9]
    assert repr(b) == "BlockIds([5, 6, 9])"
    for bad in (3, -4):
        with pytest.raises(IndexError):
            b[bad]


def test_packed_runs() -> None:
    idb = np.arange(100, dtype=np.int32).tobytes()
    assert packed_runs(ids(), idb) == []
    assert packed_runs(ids(7), idb) == [(7, 1)]
    assert packed_runs(ids(3, 4, 5), idb) == [(3, 3)]
    assert packed_runs(ids(3, 4, 9, 10, 11, 2), idb) == [(3, 2), (9, 3), (2, 1)]
    assert packed_runs(ids(0, 1), idb) is None  # the null block is never part of a run
    assert packed_runs(ids(98, 99, 100), idb) is None  # past the pool
    assert packed_runs(ids(1, 3, 5), idb, max_runs=2) is None  # too fragmented
    assert packed_runs(ids(5, 4), idb) == [(5, 1), (4, 1)]


def test_spells_runs() -> None:
    idb = np.arange(100, dtype=np.int32).tobytes()
    blocks = ids(10, 11, 50, 51, 52)
    assert spells_runs(blocks, idb, [(10, 2), (50, 3)])
    assert not spells_runs(blocks, idb, [(10, 2), (60, 3)])  # other ids
    assert not spells_runs(blocks, idb, [(10, 2), (50, 2)])  # covers only part of the blocks
    assert not spells_runs(blocks, idb, [(10, 2), (50, 4)])  # longer than the blocks
    assert not spells_runs(ids(98, 99, 100), idb, [(98, 3)])  # past the pool
    assert not spells_runs(ids(0, 1), idb, [(0, 2)])  # the null block


def test_a_split_allocation_is_adopted_by_its_runs() -> None:
    pool = BlockPool(41, 1)
    tree = RadixTree(pool)
    held = pool.allocate(40)
    pool.decref_all(held[:10])  # free runs 1..10 and 21..30 (newest)
    pool.decref_all(held[20:30])
    table = computed(tree, 15)
    assert pool.split_hint(21) == [(21, 10), (1, 5)]
    insert_finished(tree, list(range(15)), table)
    (leaf,) = tree.store.nodes()
    assert leaf.runs == [(21, 10), (1, 5)] and pool.split_hint(21) is None
    check_consistency(tree)


def test_allocate_ids_matches_allocate() -> None:
    pool = BlockPool(9, 1)
    got = pool.allocate_ids(3)
    assert isinstance(got, BlockIds) and got.tolist() == [1, 2, 3]
    assert all(pool.refcount(b) == 1 for b in got) and pool.num_free == 5
    assert pool.allocate_ids(0) == BlockIds()
    with pytest.raises(OutOfBlocks):
        pool.allocate_ids(6)
    with pytest.raises(InvalidRequest):
        pool.allocate_ids(-1)
    assert pool.num_free == 5
    pool.decref_all(got)
    assert pool.num_free == 8


def test_allocate_into_appends_to_a_table_array_over_split_runs() -> None:
    pool = BlockPool(41, 1)
    held = pool.allocate(40)
    pool.decref_all(held[:10])  # free runs 1..10 and 21..30 (newest)
    pool.decref_all(held[20:30])
    ids = array("i", [7])
    pool.allocate_into(ids, 15)
    assert ids.tolist() == [7, *range(21, 31), *range(1, 6)]
    assert all(pool.refcount(b) == 1 for b in ids[1:]) and pool.num_free == 5
    with pytest.raises(OutOfBlocks):
        pool.allocate_into(ids, 6)
    assert len(ids) == 16 and pool.num_free == 5  # nothing taken, nothing appended


def test_allocation_takes_a_run_that_fits_before_splitting() -> None:
    pool = BlockPool(101, 1)
    held = pool.allocate(100)
    pool.decref_all(held[0:30])  # free runs: 1..30, then 61..70 (newest)
    pool.decref_all(held[60:70])
    got = pool.allocate_ids(20)
    assert got.tolist() == list(range(1, 21))  # the newest run is too short: the older one fits
    assert pool.free_extents() == [(61, 10), (21, 10)]  # the remainder is on top
    split = pool.allocate_ids(15)  # no single run holds 15: newest runs first, and remembered
    assert split.tolist() == [*range(21, 31), *range(61, 66)]
    assert pool.split_hint(21) == [(21, 10), (61, 5)]


def test_take_fit_takes_the_shortest_run_that_fits() -> None:
    ext = FreeExtents()
    ext.put(1, 50)
    ext.put(100, 25)
    ext.put(200, 100)  # newest
    assert ext.take_fit(20) == 100  # best fit: the 25-block run, not the newest
    assert ext.take_fit(100) == 200  # an exact fit
    assert ext.take_fit(60) == 0 and ext.count == 55  # nothing holds 60 (the caller splits)
    assert ext.runs() == [(1, 50), (120, 5)]


def test_take_fit_looks_at_a_bounded_number_of_runs() -> None:
    ext = FreeExtents()
    ext.put(1, 50)
    for a in range(100, 120, 2):  # ten one-block runs on top
        ext.put(a, 1)
    assert ext.take_fit(10, scan=5) == 0 and ext.count == 60
    assert ext.take_fit(10, scan=20) == 1 and ext.count == 50


def test_free_runs_merges_runs_that_continue_each_other_and_keeps_their_order() -> None:
    pool = BlockPool(101, 1)
    held = pool.allocate_ids(100)  # refcount 1 each, as the tree holds its blocks alone
    ownership = pool.attach_cache()
    ownership.release_runs([(41, 10), (51, 5), (11, 5), (80, 1), (81, 4)])
    assert pool.free_extents() == [(41, 15), (11, 5), (80, 5)]  # merged in eviction order, not sorted
    assert pool.num_free == 25 and pool.refcount(45) == 0 and pool.refcount(56) == 1
    ownership.release_runs([(16, 25)])  # fills the gap: the free extents merge it with both neighbours
    assert pool.free_extents() == [(80, 5), (11, 45)] and pool.num_free == 50
    assert pool.allocate_ids(45).tolist() == list(range(11, 56))  # the best fit, handed out whole
    assert pool.num_free == 5 and len(held) == 100


@pytest.mark.parametrize("block_size", [1, 4])
def test_packed_insert_and_match(block_size: int) -> None:
    pool = BlockPool(64, block_size)
    tree = RadixTree(pool)
    toks = list(range(8 * block_size))
    table = computed(tree, len(toks))
    new = BlockIds(table.blocks.tobytes())
    res = insert_finished(tree, toks, table)
    assert res.num_new_tokens == len(toks) and res.duplicate_blocks == []
    m = tree.match(toks[: 5 * block_size])
    assert isinstance(m.block_ids, BlockIds) and m.block_ids == new[:5] and m.blocks == new[:5].tolist()
    # A second request computed the same prefix into other blocks: they are duplicates.
    table = computed(tree, 3 * block_size)
    other = table.blocks.tolist()
    res = insert_finished(tree, toks[: 3 * block_size], table)
    assert sorted(res.duplicate_blocks) == other and all(pool.refcount(b) == 0 for b in other)
    # Extending the matched path: the table starts from the matched blocks, the new ones follow.
    table = BlockTable(pool)
    table.lease_prefix(m.block_ids)
    table.append(2 * block_size)
    key = [*toks[: 5 * block_size], *[999] * (2 * block_size)]
    res = tree.insert_table(key, table, 7, "", m.lease, final=True)
    assert res.duplicate_blocks == [] and res.num_new_tokens == 2 * block_size
    table.release()
    m.lease.release()
    check_consistency(tree)
    assert tree.flush() == 10 and pool.num_free == pool.num_usable


def test_packed_insert_rejects_bad_blocks_and_changes_nothing() -> None:
    pool = BlockPool(16, 1)
    tree = RadixTree(pool)
    a = pool.allocate_ids(3)
    lease = tree.match(()).lease
    for key, blocks in (
        ([1, 2, 3, 4], a + a[:1]),  # a block given twice
        ([1, 2], ids(a[0], 9)),  # block 9 is free
        ([1, 2], a),  # wrong count
    ):
        table = BlockTable(pool)  # a table that would hold these ids (the caller's references)
        table.blocks = array("i", bytes(blocks))
        table.num_tokens = table.num_blocks
        with pytest.raises(InvalidRequest):
            tree.insert_table(key, table, table.num_blocks, "", lease, final=True)
        assert table.leased == 0
    assert all(pool.refcount(b) == 1 for b in a) and tree.num_nodes == 0
    check_consistency(tree)
    pool.decref_all(a)
