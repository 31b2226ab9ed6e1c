"""FreeExtents: free blocks as maximal runs, merged on free, handed out newest run first."""

from __future__ import annotations

import random
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from radixd.radix import BlockPool
from radixd.radix.extents import FreeExtents


def _blocks(runs: list[tuple[int, int]]) -> list[int]:
    return [b for a, k in runs for b in range(a, a + k)]


def test_put_merges_with_both_neighbours() -> None:
    ext = FreeExtents()
    ext.put(10, 5)
    ext.put(20, 5)
    ext.put(15, 5)  # fills the gap: one run 10..25
    assert ext.runs() == [(10, 15)] and ext.count == 15


def test_take_splits_the_newest_run_and_keeps_the_rest_on_top() -> None:
    ext = FreeExtents()
    ext.put(1, 100)
    ext.put(200, 3)
    assert ext.take(5) == [(200, 3), (1, 2)]
    assert ext.take(4) == [(3, 4)]  # continues where the last allocation stopped
    assert ext.count == 94 and not ext.contains(6) and ext.contains(7)


def test_random_frees_always_coalesce_back_to_one_run() -> None:
    rng = random.Random(7)
    pool = BlockPool(513, 1)
    held = pool.allocate(512)
    assert pool.num_free == 0
    rng.shuffle(held)
    for b in held:
        pool.decref(b)
    assert pool.free_extents() == [(1, 512)]
    assert sorted(pool.allocate(512)) == list(range(1, 513))


def test_allocations_under_churn_stay_few_runs() -> None:
    rng = random.Random(3)
    pool = BlockPool(4097, 1)
    live: list[list[int]] = []
    for _ in range(300):
        if pool.num_free >= 600 and (not live or rng.random() < 0.6):
            live.append(pool.allocate(rng.randint(100, 600)))
        else:
            pool.decref_all(live.pop(rng.randrange(len(live))))
        runs = pool.free_extents()
        # Maximal runs: no two free runs touch.
        ends = {a + k for a, k in runs}
        assert not any(a in ends for a, _ in runs)
        assert sum(k for _, k in runs) == pool.num_free == len(set(_blocks(runs)))


def test_take_at_takes_only_from_the_run_that_starts_there() -> None:
    ext = FreeExtents()
    ext.put(10, 5)
    assert not ext.take_at(12, 1)  # inside a run, not at its start
    assert not ext.take_at(10, 6)  # longer than the run
    assert ext.take_at(10, 2) and ext.runs() == [(12, 3)] and ext.count == 3
    assert ext.take_at(12, 3) and ext.runs() == [] and ext.count == 0
    assert ext.problem(20) is None


def test_take_room_starts_where_the_longest_newest_run_leaves_room_after() -> None:
    ext = FreeExtents()
    ext.put(1, 10)
    ext.put(50, 3)
    assert ext.take_room() == 5  # [1, 11): 4 blocks before it, 5 after
    assert sorted(ext.runs()) == [(1, 4), (6, 5), (50, 3)] and ext.count == 12
    assert ext.take_at(6, 1)  # the table grows into the room after its block
    one, two = FreeExtents(), FreeExtents()
    one.put(7, 1)
    two.put(7, 2)
    assert one.take_room() == 7 and one.count == 0
    assert two.take_room() == 7 and two.runs() == [(8, 1)]  # the room after, not before
    assert FreeExtents().take_room() == 0
    assert ext.problem(60) is None and one.problem(10) is None and two.problem(10) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8)), min_size=1, max_size=60))
def test_growing_tables_keep_the_pool_consistent(ops: list[tuple[int, int]]) -> None:
    """Tables grown one block at a time side by side, others allocated whole and freed: every block is
    held once or free once, the free runs stay maximal, and each growth that found the block after its
    table's last one free took it."""
    pool = BlockPool(65, 1)
    tables: list[array[int]] = [array("i") for _ in range(3)]
    whole: list[list[int]] = []
    for op, n in ops:
        if op < 3:
            t = tables[op]
            if pool.num_free == 0:
                continue
            after = t[-1] if t else 0
            follows = 0 < after < 64 and pool.refcount(after + 1) == 0
            pool.allocate_into(t, 1, after)
            assert not follows or t[-1] == after + 1
        elif n <= pool.num_free and n % 2:  # op 3: odd n allocates n blocks whole, even n frees the oldest
            whole.append(pool.allocate(n))
        elif whole:
            pool.decref_all(whole.pop(0))
        held = [b for t in tables for b in t] + [b for w in whole for b in w]
        assert len(held) == len(set(held)) and pool.num_free == 64 - len(held)
        assert pool.free_extents_problem() is None
        assert not any(pool.refcount(b) == 0 for b in held)
