"""Scheduling policy units (no model): orderings, victim choice, prefix comparison, copy waves."""

from __future__ import annotations

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.policy import (
    common_prefix_len,
    pick_victim,
    running_order,
    running_rank,
    shares_pending_prefix,
    waiting_order,
)
from radixd.daemon.engine.sequence import RequestState, Sequence
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.runner import copy_waves
from radixd.daemon.executor.sampling import SamplingParams


def _seq(
    sid: int, arrival: float, priority: int = 0, tokens: list[int] | None = None, ns: str = ""
) -> Sequence:
    toks = tokens if tokens is not None else [1, 2, 3]
    req = GenerateRequest(f"r{sid}", toks, SamplingParams(), namespace=ns, priority=priority)
    r = RequestState(req=req, sink=lambda _o: None, prompt=list(toks), arrival=arrival)
    s = Sequence(sid, r, 0, list(toks), None)
    r.seqs.append(s)
    return s


def test_victim_is_lowest_priority_then_newest_and_bounded() -> None:
    old, new, vip = _seq(1, 1.0), _seq(2, 2.0), _seq(3, 3.0, priority=5)
    assert pick_victim([old, new, vip], max_preemptions=3) is new
    new.preemptions = 3
    assert pick_victim([old, new, vip], max_preemptions=3) is old
    old.preemptions = 3
    assert pick_victim([old, new, vip], max_preemptions=3) is vip
    vip.preemptions = 3
    assert pick_victim([old, new, vip], max_preemptions=3) is None


def test_orders() -> None:
    a, b, c = _seq(1, 1.0), _seq(2, 2.0, priority=1), _seq(3, 3.0)
    assert waiting_order([c, a, b], "fcfs") == [b, a, c]
    lens = {1: 0, 2: 0, 3: 40}
    assert waiting_order([a, b, c], "lpm", lambda s: lens[s.seq_id]) == [b, c, a]
    decode = _seq(4, 4.0, tokens=[1, 2, 3, 4])
    decode.num_computed = 3  # one token due: decodes go first, then prefills by age
    ranked = sorted([decode, c, a], key=running_rank)
    assert ranked == [a, c, decode]  # by age (and priority first)
    assert running_order(ranked, [s.remaining for s in ranked]) == [decode, a, c]
    assert sorted([a, b], key=running_rank) == [b, a]


def test_common_prefix_and_pending_prefix() -> None:
    x = list(range(100))
    y = list(range(70)) + [999] * 30
    assert common_prefix_len(x, y, 16) == 70
    assert common_prefix_len(x, x[:5], 16) == 5
    producer = _seq(1, 1.0, tokens=x)
    waiting = _seq(2, 2.0, tokens=y)
    assert shares_pending_prefix(waiting, 0, [producer], 16) is producer  # 64 tokens to wait for
    assert shares_pending_prefix(waiting, 64, [producer], 16) is None  # already cached
    producer.num_computed = 64
    assert shares_pending_prefix(waiting, 0, [producer], 16) is None  # computed (and inserted)
    producer.num_computed = 0
    other_ns = _seq(3, 3.0, tokens=y, ns="tenant-b")
    assert shares_pending_prefix(other_ns, 0, [producer], 16) is None  # namespaces never share


def test_copy_waves_never_read_a_block_written_in_the_same_wave() -> None:
    ops = [(1, 2, 5), (3, 4, 16), (2, 5, 5), (6, 7, 1)]
    assert copy_waves(ops) == [[(1, 2, 5), (3, 4, 16)], [(2, 5, 5), (6, 7, 1)]]
    assert copy_waves([]) == []
    # Write-after-read: (3 -> 1) must not run alongside (1 -> 2), which reads block 1.
    assert copy_waves([(1, 2, 5), (3, 1, 16)]) == [[(1, 2, 5)], [(3, 1, 16)]]


def test_a_refused_decode_batch_changes_nothing() -> None:
    """`KVManager.append_decodes` is all-or-nothing: on a pool too short (nothing evictable either),
    it refuses, holds no block and leaves a sequence that had no table without one."""
    kv = KVManager.create(num_blocks=4, block_size=4, config=EngineConfig())  # 3 usable blocks
    full, bare = _seq(1, 1.0, tokens=[1, 2, 3, 4, 5]), _seq(2, 2.0, tokens=[7])
    kv.append(full, 4)  # one full block: its fifth token needs a fresh one
    held = kv.pool.allocate(kv.pool.num_free - 1)  # one free block left, two needed
    full.num_computed = 4
    assert not kv.append_decodes([full, bare])
    assert bare.table is None and full.table is not None and full.table.num_tokens == 4
    assert kv.pool.num_free == 1
    kv.pool.decref_all(held)
    assert kv.append_decodes([full, bare])
    assert full.table.num_tokens == 5 and bare.table is not None and bare.table.num_tokens == 1
