"""KV-event translation: a real radix tree's node events -> full chained blocks, as a router sees them.

A `RouterModel` applies the batches the way smg's cache-aware index does (stored blocks keyed by id
with their parent, removals by id, `cleared` wipes everything), and after every tree operation it
must hold exactly the full blocks of every cached path, with the ids `block_hash` chains.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2

from radixd.daemon.server.common.errors import RpcFailure
from radixd.daemon.server.common.event_log import Reader
from radixd.daemon.server.common.events import CacheEvents
from radixd.daemon.server.common.kv_events import KvEntry, NamespaceKvLog, block_hash, chain, to_batch
from radixd.radix import BlockPool, BlockTable, RadixTree
from radixd.radix.verify import iter_nodes

BS = 4


class RouterModel:
    """What a subscriber knows: block id -> (parent id, tokens); checks parents come first. With a
    `reader`, reading `blocks` first applies every batch the log handed it since."""

    def __init__(self, reader: Reader[KvEntry] | None = None) -> None:
        self._blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.last = 0
        self.reader = reader

    @property
    def blocks(self) -> dict[int, tuple[int | None, tuple[int, ...]]]:
        while self.reader is not None and not self.reader.queue.empty():
            item = self.reader.queue.get_nowait()
            assert item is not None, "the reader was cut off"
            self.apply(to_batch(item))
        return self._blocks

    def apply(self, batch: common_pb2.KvEventBatch) -> None:
        assert batch.sequence_number > self.last or batch.HasField("snapshot")
        self.last = batch.sequence_number
        for event in batch.events:
            kind = event.WhichOneof("data")
            if kind == "cleared":
                self._blocks.clear()
            elif kind == "removed":
                for block_id in event.removed.block_hashes:
                    assert block_id in self._blocks, "removal of a block never announced"
                    del self._blocks[block_id]
            else:
                stored = event.stored
                parent = stored.parent_block_hash if stored.HasField("parent_block_hash") else None
                for block in stored.blocks:
                    assert len(block.token_ids) == BS == block.block_size
                    assert parent is None or parent in self._blocks, "child announced before its parent"
                    self._blocks[block.block_hash] = (parent, tuple(block.token_ids))
                    parent = block.block_hash


def expected_blocks(tree: RadixTree, namespace: str = "") -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """The full blocks of every cached path of `namespace`, computed from the tree itself."""
    out: dict[int, tuple[int | None, tuple[int, ...]]] = {}
    for node in iter_nodes(tree):
        ns, path = tree.store.path_of(node)
        if ns != namespace:
            continue
        ids = chain(ns, path, BS, len(path) // BS)
        for b, block_id in enumerate(ids):
            out[block_id] = (ids[b - 1] if b else None, tuple(path[b * BS : (b + 1) * BS]))
    return out


def newest(log: NamespaceKvLog) -> common_pb2.KvEventBatch:
    kept = log.replay(log.sequence)
    assert kept
    return kept[-1]


@pytest.fixture
def wired() -> Iterator[tuple[RadixTree, CacheEvents, RouterModel]]:
    tree = RadixTree(BlockPool(48, BS))
    logs = CacheEvents(BS)  # publishes at once: one batch per tree event
    tree.listener = logs
    with logs.kv("").batches.subscribed() as reader:
        yield tree, logs, RouterModel(reader)


def cache(tree: RadixTree, tokens: list[int], ns: str = "") -> None:
    """Cache `tokens` as a finishing request that matched nothing does (KVManager.insert_all)."""
    table = BlockTable(tree.pool)
    table.append(len(tokens))
    lease = tree.match((), ns).lease
    tree.insert_table(tokens, table, table.num_blocks, ns, lease, final=True)
    table.release()
    lease.release()


def test_random_inserts_evictions_and_flushes_keep_the_router_exact(
    wired: tuple[RadixTree, CacheEvents, RouterModel],
) -> None:
    tree, logs, model = wired
    rng = random.Random(7)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(1, 14))] for _ in range(4)]
    for step in range(400):
        op = rng.random()
        if op < 0.7:
            stem = rng.choice(stems)
            tail = [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
            tokens = (stem + tail)[: rng.randrange(1, 24)]
            if tree.pool.num_free < 8:
                tree.evict(8)
            cache(tree, tokens)
        elif op < 0.9:
            tree.evict(rng.randrange(1, 6))
        else:
            tree.flush()
        assert model.blocks == expected_blocks(tree), f"step {step}"
    assert logs.kv("").sequence > 100


def test_block_ids_are_a_stable_chain_and_partial_blocks_are_never_published(
    wired: tuple[RadixTree, CacheEvents, RouterModel],
) -> None:
    tree, _, model = wired
    tokens = list(range(11))  # two full blocks and a partial one
    cache(tree, tokens)
    first = block_hash("", None, tokens[:4])
    second = block_hash("", first, tokens[4:8])
    assert model.blocks == {first: (None, (0, 1, 2, 3)), second: (first, (4, 5, 6, 7))}
    # the same prefix in another process (a restart, another replica) gets the same ids
    other = CacheEvents(BS)
    other.stored("", tokens, 0, 3)
    stored = newest(other.kv("")).events[0].stored
    assert [b.block_hash for b in stored.blocks] == [first, second]
    # namespaces get different ids for the same tokens
    assert block_hash("t:alice", None, tokens[:4]) != first
    assert -(2**63) <= first < 2**63


def test_a_flush_and_an_eviction_remove_leaf_blocks(
    wired: tuple[RadixTree, CacheEvents, RouterModel],
) -> None:
    tree, logs, model = wired
    cache(tree, list(range(12)))
    cache(tree, [*range(8), 40, 41, 42, 43])
    assert len(model.blocks) == 4
    tree.evict(1)
    last = newest(logs.kv("")).events[0]
    assert last.WhichOneof("data") == "removed" and len(last.removed.block_hashes) == 1
    assert len(model.blocks) == 3
    tree.flush()
    assert newest(logs.kv("")).events[0].WhichOneof("data") == "removed"
    assert model.blocks == {}


def test_tenant_blocks_stay_in_their_namespace_log() -> None:
    tree = RadixTree(BlockPool(32, BS))
    logs = CacheEvents(BS)
    tree.listener = logs
    cache(tree, list(range(8)), "t:alice")
    cache(tree, list(range(100, 108)), "")
    alice, default = logs.kv("t:alice").replay(1) or [], logs.kv("").replay(1) or []
    seen_alice = {b.block_hash for batch in alice for e in batch.events for b in e.stored.blocks}
    seen_default = {b.block_hash for batch in default for e in batch.events for b in e.stored.blocks}
    assert len(seen_alice) == 2 and len(seen_default) == 2
    assert not seen_alice & seen_default
    assert all(
        100 <= t < 108
        for batch in default
        for e in batch.events
        for b in e.stored.blocks
        for t in b.token_ids
    )


def test_snapshot_rebuilds_the_live_set_and_resume_replays_from_the_cursor(
    wired: tuple[RadixTree, CacheEvents, RouterModel],
) -> None:
    tree, logs, model = wired
    for i in range(6):
        cache(tree, [i, *range(20, 31)])
    tree.evict(2)
    log = logs.kv("")
    fresh = RouterModel()
    snapshot = log.snapshot()
    assert snapshot[-1].sequence_number == log.sequence
    assert snapshot[0].events[0].WhichOneof("data") == "cleared"
    for batch in snapshot:
        fresh.apply(batch)
    assert fresh.blocks == model.blocks == expected_blocks(tree)
    replay = log.replay(3)
    assert replay is not None and [b.sequence_number for b in replay] == list(range(3, log.sequence + 1))
    assert log.replay(log.sequence + 1) == []
    assert log.replay(log.sequence + 2) is None  # beyond the newest: the daemon restarted
    assert log.replay(0) is None


def test_history_is_bounded_and_a_cursor_older_than_it_needs_a_snapshot() -> None:
    log = CacheEvents(BS, retain=8).kv("")
    for i in range(20):
        log.stored([i, i, i, i], 0)
    assert len(log.batches.recent) == 8
    assert log.replay(5) is None
    assert log.replay(13) is not None
    assert len(log.snapshot()) == 1 and log.snapshot()[0].snapshot.blocks == 20


def test_events_of_one_loop_tick_form_one_batch() -> None:
    scheduled: list[object] = []
    log = CacheEvents(BS, schedule=scheduled.append).kv("")
    log.stored(list(range(8)), 0)
    log.stored(list(range(12)), 8)
    assert log.sequence == 0 and len(scheduled) == 1
    log.publish()
    assert log.sequence == 1 and len(newest(log).events) == 2


def test_a_replay_into_a_late_listener_gives_it_the_cached_content() -> None:
    """`RadixTree.replay`: an observer attached to a tree that already holds content learns all of it,
    parents before children, and then follows the live changes exactly."""
    tree = RadixTree(BlockPool(48, BS))
    rng = random.Random(7)
    for _ in range(12):
        cache(tree, [rng.randrange(3) for _ in range(rng.randrange(1, 14))], rng.choice(["", "t"]))
    logs = CacheEvents(BS)
    with logs.kv("").batches.subscribed() as reader:
        model = RouterModel(reader)
        assert tree.replay(logs) == tree.num_nodes
        assert model.blocks == expected_blocks(tree)
        tree.listener = logs
        cache(tree, [9, 9, 9, 9, 9, 9, 9, 9, 1])
        tree.evict(3)
        assert model.blocks == expected_blocks(tree)


def test_a_reader_that_falls_behind_is_cut_off_and_told_where_to_resume() -> None:
    """Back-pressure: the tree never waits, so a reader whose queue is full gets nothing more and its
    stream ends with RESOURCE_EXHAUSTED naming the cursor to resume from (still retained)."""

    async def main() -> None:
        log = CacheEvents(BS, buffer=2).kv("")
        with log.batches.subscribed() as slow, log.batches.subscribed() as fast:
            for i in range(3):
                log.stored([i] * BS, 0)
                assert await fast.next(i) is not None
            assert log.batches.num_subscribers == 1  # the slow one is cut off after what it holds ...
            held = [await slow.next(0), await slow.next(1)]
            assert [item[0] for item in held if item] == [1, 2]
            with pytest.raises(RpcFailure) as err:
                await slow.next(2)
            assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "start_sequence_number=3" in err.value.message
            assert [b.sequence_number for b in log.replay(3) or []] == [3]  # ... and resumes losing none

    asyncio.run(main())
