"""FreeExtents: free blocks as maximal runs, merged on free, handed out newest run first."""

from __future__ import annotations

import random

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
