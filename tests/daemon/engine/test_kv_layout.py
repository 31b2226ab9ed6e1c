"""KVManager keeps a sequence's blocks in runs (no model): the CPU attention reads a run as one stream."""

from __future__ import annotations

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.sequence import RequestState, Sequence
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.radix import BlockTable

BS = 4


def _seq(tokens: list[int]) -> Sequence:
    req = GenerateRequest("r", tokens, SamplingParams())
    r = RequestState(req=req, sink=lambda _o: None, prompt=list(tokens), arrival=0.0)
    s = Sequence(1, r, 0, list(tokens), None)
    r.seqs.append(s)
    return s


def _cache_one_block_entries(kv: KVManager, n: int) -> None:
    """n cached entries of one block each (ids 1..n), as finished requests leave them."""
    for i in range(1, n + 1):
        table = BlockTable(kv.pool)
        table.append(BS)
        lease = kv.tree.match((), "").lease
        kv.tree.insert_table([i] * BS, table, 1, "", lease, final=True)
        table.release()
        lease.release()


def test_a_prompt_in_a_full_pool_of_scraps_gets_one_run() -> None:
    kv = KVManager.create(11, BS, EngineConfig())
    _cache_one_block_entries(kv, 10)
    for i in range(2, 11, 2):  # the odd entries are the cold end: evicting them alone frees scraps
        kv.tree.match([i] * BS, "").lease.release()
    seq = _seq(list(range(100, 108)))  # two blocks
    assert kv.ensure_free(2) and kv.pool.longest_free_run() == 1  # 1 and 3: enough, but apart
    kv.append(seq, 8)
    assert seq.table is not None
    first, second = seq.table.blocks
    assert second == first + 1, list(seq.table.blocks)
    assert kv.evicted_blocks == 2 + 4  # ensure_free's two, then 5, 7, 9 and 2 (which joins 1 and 3)
    seq.table.release()


def test_no_eviction_when_a_run_is_free_or_caching_is_off() -> None:
    kv = KVManager.create(11, BS, EngineConfig())
    _cache_one_block_entries(kv, 4)  # ids 1..4; 5..10 free
    seq = _seq(list(range(100, 112)))
    kv.append(seq, 12)
    assert kv.evicted_blocks == 0 and kv.tree.num_cached_blocks == 4
    off = KVManager.create(11, BS, EngineConfig(prefix_caching=False))
    other = _seq(list(range(100, 112)))
    off.append(other, 12)
    assert off.evicted_blocks == 0 and other.table is not None and len(other.table.blocks) == 3
