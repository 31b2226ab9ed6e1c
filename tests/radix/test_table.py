"""BlockTable: slots, sharing, partial copies, copy-on-write, fork, release."""

from __future__ import annotations

from array import array
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixd.radix import (
    BlockPool,
    BlockTable,
    InvalidRequest,
    OutOfBlocks,
    append_one_each,
    blocks_for_one_each,
)


@pytest.fixture
def pool() -> BlockPool:
    return BlockPool(17, 4)


def test_append_slots_allocates_on_demand(pool: BlockPool) -> None:
    t = BlockTable(pool)
    slots, copies = t.append_slots(6)
    assert len(t.blocks) == 2 and copies == []
    b0, b1 = t.blocks
    assert slots == [b0 * 4, b0 * 4 + 1, b0 * 4 + 2, b0 * 4 + 3, b1 * 4, b1 * 4 + 1]
    assert t.append_slots(2).slots == [b1 * 4 + 2, b1 * 4 + 3] and len(t.blocks) == 2
    assert t.slot(5) == b1 * 4 + 1
    with pytest.raises(InvalidRequest, match="outside"):
        t.slot(8)


def test_fork_is_metadata_only_and_append_copies_on_write(pool: BlockPool) -> None:
    parent = BlockTable(pool)
    parent.append_slots(6)
    free = pool.num_free
    (child,) = parent.fork(1)
    assert pool.num_free == free and child.blocks == parent.blocks
    assert all(pool.refcount(b) == 2 for b in parent.blocks)
    shared_last = parent.blocks[-1]
    slots, copies = child.append_slots(1)
    new_last = child.blocks[-1]
    assert copies == [(shared_last, new_last, 2)] and new_last != shared_last
    assert slots == [new_last * 4 + 2]
    assert pool.refcount(shared_last) == 1 and parent.blocks[-1] == shared_last
    assert parent.append_slots(1).copies == []  # the parent owns its block alone again


def test_copy_on_write_with_growth_keeps_the_block_order(pool: BlockPool) -> None:
    parent = BlockTable(pool)
    parent.append_slots(6)  # 2 blocks, the last one half full
    (child,) = parent.fork(1)
    head, shared_last = child.blocks
    slots, copies = child.append_slots(7)  # fills the copied block, then two more
    assert len(child.blocks) == 4 and child.blocks[0] == head
    copy_dst = child.blocks[1]
    assert copies == [(shared_last, copy_dst, 2)] and shared_last not in child.blocks
    assert slots[:2] == [copy_dst * 4 + 2, copy_dst * 4 + 3]
    assert slots[2:] == [child.blocks[2] * 4 + i for i in range(4)] + [child.blocks[3] * 4]
    assert all(pool.refcount(b) == 1 for b in child.blocks[1:]) and pool.refcount(head) == 2
    assert child.release() == 3 and parent.release() == 2
    assert pool.num_free == pool.num_usable


def test_no_copy_when_the_shared_last_block_is_full(pool: BlockPool) -> None:
    parent = BlockTable(pool)
    parent.append_slots(8)
    (child,) = parent.fork(1)
    _slots, copies = child.append_slots(1)
    assert copies == [] and child.blocks[:2] == parent.blocks


def test_share_prefix_and_copy_partial(pool: BlockPool) -> None:
    src = BlockTable(pool)
    src.append_slots(7)
    t = BlockTable(pool)
    t.share_prefix(src.blocks[:1], 4)
    assert pool.refcount(src.blocks[0]) == 2
    op = t.copy_partial(src.blocks[1], 3)
    assert op[0] == src.blocks[1] and op[2] == 3 and t.num_tokens == 7
    assert t.append_slots(1).copies == []  # the copy is private: no CoW
    with pytest.raises(InvalidRequest, match="cannot hold exactly 9 tokens"):
        BlockTable(pool).share_prefix(src.blocks, 9)
    u = BlockTable(pool)
    u.append_slots(3)
    with pytest.raises(InvalidRequest, match="block boundary"):
        u.copy_partial(src.blocks[1], 1)
    with pytest.raises(InvalidRequest, match=r"copies 1\.\.3 tokens"):
        t.copy_partial(src.blocks[1], 4)


def test_shared_partial_block_is_copied_on_first_append(pool: BlockPool) -> None:
    src = BlockTable(pool)
    src.append_slots(6)
    t = BlockTable(pool)
    t.share_prefix(src.blocks, 6)  # shares the partial block itself
    _slots, copies = t.append_slots(1)
    assert copies == [(src.blocks[1], t.blocks[1], 2)]


def test_append_is_all_or_nothing(pool: BlockPool) -> None:
    t = BlockTable(pool)
    t.append_slots(2)
    (child,) = t.fork(1)
    pool.allocate(pool.num_free)
    before = (list(child.blocks), child.num_tokens)
    with pytest.raises(OutOfBlocks, match="requested 1, only 0 free"):
        child.append_slots(1)  # needs one block for the copy-on-write
    assert (child.blocks.tolist(), child.num_tokens) == before


def test_release_is_idempotent(pool: BlockPool) -> None:
    t = BlockTable(pool)
    t.append_slots(9)
    (child,) = t.fork(1)
    assert t.release() == 0  # the fork still holds every block
    assert t.release() == 0 and len(t.blocks) == 0
    assert child.release() == 3 and pool.num_free == pool.num_usable
    with pytest.raises(InvalidRequest, match="k >= 0"):
        child.fork(-1)


def test_lease_prefix_takes_no_reference_and_release_leaves_the_leased_blocks(pool: BlockPool) -> None:
    owner = BlockTable(pool)
    owner.append(8)  # stands for the tree's two cached blocks
    t = BlockTable(pool)
    t.lease_prefix(owner.blocks)
    assert t.leased == 2 and t.num_tokens == 8 and [pool.refcount(b) for b in t.blocks] == [1, 1]
    t.append(1)  # a fresh third block, the table's own
    (child,) = t.fork(1)
    assert child.leased == 2 and pool.refcount(t.blocks[2]) == 2
    assert [pool.refcount(b) for b in owner.blocks] == [1, 1]  # forks add nothing to leased blocks
    child.release()
    assert t.release() == 1 and t.leased == 0
    assert [pool.refcount(b) for b in owner.blocks] == [1, 1]
    with pytest.raises(InvalidRequest, match="empty table"):
        owner.lease_prefix(owner.blocks)


def test_leased_up_to_stays_within_the_table(pool: BlockPool) -> None:
    t = BlockTable(pool)
    t.append(8)
    t.leased_up_to(1)
    with pytest.raises(InvalidRequest, match="outside"):
        t.leased_up_to(0)
    with pytest.raises(InvalidRequest, match="outside"):
        t.leased_up_to(3)


def test_new_blocks_for_is_what_append_takes(pool: BlockPool) -> None:
    t = BlockTable(pool)
    assert t.new_blocks_for(0) == 0 and t.new_blocks_for(5) == 2
    t.append(5)
    (child,) = t.fork(1)  # the partly filled last block is shared now
    assert child.new_blocks_for(0) == 0  # nothing written: no copy
    for n in (1, 3, 4, 9):
        assert child.new_blocks_for(n) == 1 + (-(-(5 + n) // 4) - 2)
    free = pool.num_free
    want = child.new_blocks_for(4)
    child.append(4)
    assert free - pool.num_free == want


def _decode_batch(pool: BlockPool, plan: list[tuple[int, int]]) -> list[BlockTable]:
    """Tables built by one recipe: (tokens, forks) per table; forked children share every block."""
    tables: list[BlockTable] = []
    for n_tokens, forks in plan:
        t = BlockTable(pool)
        t.append(n_tokens)
        tables.append(t)
        tables.extend(t.fork(forks))
    return tables


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2)), min_size=1, max_size=6))
def test_append_one_each_is_append_1_on_every_table(plan: list[tuple[int, int]]) -> None:
    # Two pools built the same way: one decode step batched, the other one table at a time.
    batched, single = BlockPool(80, 4), BlockPool(80, 4)
    a, b = _decode_batch(batched, plan), _decode_batch(single, plan)
    assert blocks_for_one_each(a) == sum(t.new_blocks_for(1) for t in b)
    copies = append_one_each(a)
    assert copies == [op for t in b for op in t.append(1)]
    assert [(t.num_tokens, list(t.blocks)) for t in a] == [(t.num_tokens, list(t.blocks)) for t in b]
    assert batched.refcounts() == single.refcounts() and batched.num_free == single.num_free


def test_append_one_each_is_all_or_nothing(pool: BlockPool) -> None:
    tables = [BlockTable(pool) for _ in range(4)]
    for t in tables:
        t.append(4)  # full: each table's next token needs a fresh block
    pool.allocate(pool.num_free - 3)
    before = [(t.num_tokens, list(t.blocks)) for t in tables]
    assert blocks_for_one_each(tables) == 4
    with pytest.raises(OutOfBlocks):
        append_one_each(tables)
    assert [(t.num_tokens, list(t.blocks)) for t in tables] == before and pool.num_free == 3


def test_append_one_each_asks_for_room_only_when_short(pool: BlockPool) -> None:
    """`make_room(need)` (the engine's eviction) runs only when the pool is short; when it frees
    enough the batch goes through, when it does not (or lies) nothing changes."""
    tables = [BlockTable(pool) for _ in range(4)]
    for t in tables:
        t.append(4)  # full: each table's next token needs a fresh block
    held = pool.allocate(pool.num_free - 3)
    asked: list[int] = []

    def no_room(need: int) -> bool:
        asked.append(need)
        return True  # claims room, frees nothing

    before = [(t.num_tokens, list(t.blocks)) for t in tables]
    with pytest.raises(OutOfBlocks):
        append_one_each(tables, no_room)
    assert asked == [4] and [(t.num_tokens, list(t.blocks)) for t in tables] == before

    def free_one(need: int) -> bool:
        asked.append(need)
        pool.decref(held.pop())
        return pool.num_free >= need

    append_one_each(tables, free_one)
    assert asked == [4, 4] and [t.num_tokens for t in tables] == [5] * 4 and pool.num_free == 0
    append_one_each(tables, no_room)  # every last block has room now: nothing is asked
    assert asked == [4, 4] and [t.num_tokens for t in tables] == [6] * 4


def test_append_one_each_refuses_tables_of_two_pools(pool: BlockPool) -> None:
    other = BlockTable(BlockPool(9, 4))
    mine = BlockTable(pool)
    with pytest.raises(InvalidRequest, match="one pool"):
        append_one_each([mine, other])


def test_solo_reads_refcounts_and_checks_ids(pool: BlockPool) -> None:
    a, b = pool.allocate(2)
    pool.incref(b)
    assert pool.solo(array("i", [a, b, 0])) == [True, False, False]
    assert pool.solo(array("i")) == []
    with pytest.raises(InvalidRequest, match="out of range"):
        pool.solo(array("i", [a, 17]))
    with pytest.raises(InvalidRequest, match="out of range"):
        pool.solo(array("i", [-1]))


def test_tables_growing_side_by_side_each_stay_in_few_runs() -> None:
    """A decode step's tables take a block each in turn: each grows into the room after its own
    blocks instead of every table holding every other block."""
    pool = BlockPool(65, 4)
    a, b = BlockTable(pool), BlockTable(pool)
    for _ in range(60):
        append_one_each([a, b])
    for t in (a, b):
        ids = list(t.blocks)
        assert len(ids) == 15
        assert sum(1 for x, y in pairwise(ids) if y != x + 1) <= 1, ids


def test_copy_partial_and_the_prompt_after_it_follow_the_leased_prefix(pool: BlockPool) -> None:
    prefix = pool.allocate(2)  # blocks a tree would hold: the table leases them
    gap = pool.allocate(2)
    src = pool.allocate(1)[0]  # the partially matched block, elsewhere
    pool.decref_all(gap)  # churn: the blocks after the prefix are free again
    t = BlockTable(pool)
    t.lease_prefix(prefix)
    t.copy_partial(src, 2)
    t.append(6)
    assert list(t.blocks) == [prefix[0], prefix[1], prefix[1] + 1, prefix[1] + 2]
