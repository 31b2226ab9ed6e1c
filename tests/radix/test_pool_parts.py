"""The parts BlockPool is composed of: state words, owners, refcounts, allocator and cache ownership."""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass

import pytest

from radixd.radix import BlockIds, BlockPool, InvalidRequest, RadixError
from radixd.radix.allocator import SPLIT_HINTS
from radixd.radix.owners import Owners
from radixd.radix.words import OWNER_SHIFT, BlockWords


@dataclass
class Entry:
    """A cache entry as the pool sees one (what a tree node provides)."""

    n_solo: int = 0
    hold: int = 0
    oid: int = 0


def test_words_write_whole_runs() -> None:
    words = BlockWords(16)
    words.set_fresh(3, 4)
    assert words.refcounts()[2:8] == [0, 1, 1, 1, 1, 0] and words.fresh([(3, 4)])
    words.fill(4, 2, ((7 << OWNER_SHIFT) | 2).to_bytes(8, sys.byteorder))
    assert not words.fresh([(3, 4)]) and words.fresh([(3, 1), (6, 1)])
    assert words.owner_ids()[3:7] == [0, 7, 7, 0] and words.refcount(5) == 2
    words.clear(3, 7)
    assert words.refcounts() == [0] * 16
    assert words.solo(array("i", [4, 3])) == [False, False]
    with pytest.raises(InvalidRequest, match="out of range"):
        words.solo(array("i", [1, 16]))


def test_owner_ids_are_reused_and_stay_small() -> None:
    owners = Owners()
    entries = [Entry() for _ in range(3)]
    assert [owners.register(e) for e in entries] == [1, 2, 3] and len(owners) == 3
    owners.unregister(entries[1])
    assert entries[1].oid == 0 and owners.get(2) is None
    again = Entry()
    assert owners.register(again) == 2 and owners.get(2) is again
    owners.unregister(entries[1])  # already gone: nothing changes
    assert len(owners) == 3


def test_holds_move_an_owners_solo_blocks_out_of_the_evictable_count() -> None:
    pool = BlockPool(16, 1)
    ownership = pool.attach_cache()
    entry = Entry()
    ids = pool.allocate_ids(4)
    assert ownership.adopt(entry, ids, donate=True) == [(1, 4)]
    assert entry.n_solo == 4 and pool.num_evictable == 4 and ownership.num_owners == 1
    pool.incref(ids[0])  # a table shares one block: it is no longer the cache's alone
    assert entry.n_solo == 3 and pool.num_evictable == 3
    entry.hold = 1
    ownership.held(entry)
    assert pool.num_evictable == 0
    pool.decref(ids[0])  # held: the block becomes solo, but not evictable
    assert entry.n_solo == 4 and pool.num_evictable == 0
    entry.hold = 0
    ownership.unheld(entry)
    assert pool.num_evictable == 4
    assert ownership.disown(entry, ids, [(1, 4)], None, None) == 4
    assert pool.num_free == pool.num_usable and ownership.num_owners == 0 and entry.oid == 0


def test_a_pool_serves_one_cache() -> None:
    pool = BlockPool(8, 1)
    pool.attach_cache()
    with pytest.raises(RadixError, match="one tree per pool"):
        pool.attach_cache()


def test_the_allocator_remembers_its_newest_split_allocations() -> None:
    pool = BlockPool(200, 1)
    held = pool.allocate(199)
    firsts = []
    for i in range(SPLIT_HINTS + 1):  # free pairs of one-block runs, each allocated back split in two
        a, b = held[4 * i], held[4 * i + 2]
        pool.decref_all([a, b])
        got = pool.allocate_ids(2)
        assert sorted(got) == [a, b]
        firsts.append(got[0])
    assert pool.split_hint(firsts[0]) is None  # the oldest was forgotten
    assert all(pool.split_hint(f) is not None for f in firsts[1:])
    ownership = pool.attach_cache()
    last = BlockIds(array("i", [firsts[-1], firsts[-1] - 2]).tobytes())
    assert ownership.runs_of(last) == [(firsts[-1], 1), (firsts[-1] - 2, 1)]
    assert pool.split_hint(firsts[-1]) is None  # adopted once, then forgotten
