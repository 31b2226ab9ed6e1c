"""KV-event translation: a real radix tree's node events -> full chained blocks, as a router sees them.

A `RouterModel` applies the batches the way smg's cache-aware index does (stored blocks keyed by id
with their parent, removals by id, `cleared` wipes everything), and after every tree operation it
must hold exactly the full blocks of every cached path, with the ids `block_hash` chains. In the
windowed KV layout (an engine over a tiny Gemma 3) it keeps two groups: the tree's blocks (group 0)
and the kept windows' (group 1), each exactly what the cache holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.factory import build_core
from radixd.daemon.engine.sliding_kv import SlidingKV
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.server.common.errors import RpcFailure
from radixd.daemon.server.common.event_log import Reader
from radixd.daemon.server.common.events import CacheEvents
from radixd.daemon.server.common.kv_events import KvEntry, NamespaceKvLog, block_hash, chain, to_batch
from radixd.radix import BlockPool, BlockTable, RadixTree, WindowStore, token_ids
from radixd.radix.verify import iter_nodes

BS = 4


Blocks = dict[int, tuple[int | None, tuple[int, ...]]]


class RouterModel:
    """What a subscriber knows: per group, block id -> (parent id, tokens); checks parents come first
    (group 0: a window's blocks need not extend from blocks of its own group). `window` > 0: every event
    must name its group and kind (the windowed layout), else none may. With a `reader`, reading
    `blocks` first applies every batch the log handed it since."""

    def __init__(self, reader: Reader[KvEntry] | None = None, window: int = 0) -> None:
        self._groups: dict[int, Blocks] = {0: {}, 1: {}}
        self.last = 0
        self.reader = reader
        self.window = window

    @property
    def blocks(self) -> Blocks:
        """Group 0: the tree's blocks (the full layout's only group)."""
        return self.group(0)

    @property
    def window_blocks(self) -> Blocks:
        """Group 1: the kept windows' blocks."""
        return self.group(1)

    def group(self, index: int) -> Blocks:
        while self.reader is not None and not self.reader.queue.empty():
            item = self.reader.queue.get_nowait()
            assert item is not None, "the reader was cut off"
            self.apply(to_batch(item))
        return self._groups[index]

    def _group_of(self, event: common_pb2.KvBlocksStored | common_pb2.KvBlocksRemoved) -> int:
        if not self.window:
            assert not event.HasField("group_idx"), "the full layout names no group"
            return 0
        assert event.HasField("group_idx") and event.group_idx in (0, 1)
        if isinstance(event, common_pb2.KvBlocksStored):
            kind = ("full_attention", "sliding_window")[event.group_idx]
            assert event.kv_cache_spec_kind == kind
            assert event.kv_cache_spec_sliding_window == (self.window if event.group_idx else 0)
        return event.group_idx

    def apply(self, batch: common_pb2.KvEventBatch) -> None:
        assert batch.sequence_number > self.last or batch.HasField("snapshot")
        self.last = batch.sequence_number
        for event in batch.events:
            kind = event.WhichOneof("data")
            if kind == "cleared":
                for blocks in self._groups.values():
                    blocks.clear()
            elif kind == "removed":
                blocks = self._groups[self._group_of(event.removed)]
                for block_id in event.removed.block_hashes:
                    assert block_id in blocks, "removal of a block never announced"
                    del blocks[block_id]
            else:
                stored = event.stored
                group = self._group_of(stored)
                blocks = self._groups[group]
                parent = stored.parent_block_hash if stored.HasField("parent_block_hash") else None
                for block in stored.blocks:
                    assert len(block.token_ids) == BS == block.block_size
                    if group == 0:
                        assert parent is None or parent in blocks, "child announced before its parent"
                    blocks[block.block_hash] = (parent, tuple(block.token_ids))
                    parent = block.block_hash


def span_blocks(out: Blocks, namespace: str, path: list[int], first: int) -> None:
    """Add the full blocks of `path` from block `first` on, with the ids `chain` gives them."""
    ids = chain(namespace, path, BS, len(path) // BS)
    for b in range(first, len(ids)):
        out[ids[b]] = (ids[b - 1] if b else None, tuple(path[b * BS : (b + 1) * BS]))


def expected_blocks(tree: RadixTree, namespace: str = "") -> Blocks:
    """The full blocks of every cached path of `namespace`, computed from the tree itself."""
    out: Blocks = {}
    for node in iter_nodes(tree):
        ns, path = tree.store.path_of(node)
        if ns == namespace:
            span_blocks(out, ns, path, 0)
    return out


def expected_window_blocks(store: WindowStore, namespace: str = "") -> Blocks:
    """The full blocks of every kept window's span in `namespace`, computed from the store itself."""
    out: Blocks = {}
    for (ns, packed), w in store:
        if ns == namespace:
            span_blocks(out, ns, token_ids(packed), w.lo)
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


# ---- the windowed KV layout: an engine over a tiny Gemma 3 (sliding and full layers) ----
SYSTEM = [5 + (i * 7) % 50 for i in range(40)]  # a shared "system prompt" (40 tokens: 10 blocks)


def windowed_core(model: LoadedModel, num_blocks: int = 256) -> EngineCore:
    core = build_core(model, EngineConfig(kv_layout="windowed"), num_blocks=num_blocks, block_size=BS)
    assert core.kv.sliding is not None
    return core


def turn(core: EngineCore, rid: str, prompt: list[int], max_tokens: int = 6) -> list[int]:
    """One greedy turn, run to its end; -> the tokens it generated."""
    got: list[int] = []
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    core.requests.add(GenerateRequest(rid, prompt, params), lambda out: got.extend(out.new_token_ids))
    core.run_until_idle()
    return got


@contextlib.contextmanager
def followed_windowed_core(
    model: LoadedModel,
) -> Iterator[tuple[EngineCore, SlidingKV, NamespaceKvLog, RouterModel]]:
    """A windowed core whose default namespace's KV log a `RouterModel` follows from the start."""
    core = windowed_core(model)
    sliding = core.kv.sliding
    assert sliding is not None
    logs = CacheEvents(BS, window=sliding.window)
    log = logs.kv("")
    with log.batches.subscribed() as reader:
        router = RouterModel(reader, sliding.window)
        core.kv.add_listener(logs, replay=True)
        yield core, sliding, log, router


def window_counts(store: WindowStore, namespace: str = "") -> Counter[int]:
    """How many kept windows cover each full block (group 1's live count)."""
    counts: Counter[int] = Counter()
    for (ns, packed), w in store:
        if ns == namespace:
            path = token_ids(packed)
            counts.update(chain(ns, path, BS, len(path) // BS)[w.lo :])
    return counts


def test_the_windowed_layout_publishes_the_tree_as_group_0_and_the_kept_windows_as_group_1(
    tiny_gemma3: LoadedModel,
) -> None:
    """A two-turn conversation: the tree's blocks in group 0, each kept window's in group 1; turn 1's
    window, superseded by turn 2's, is withdrawn from group 1 alone; a snapshot and a late listener's
    replay give the live state; a flush removes everything from both groups."""
    with followed_windowed_core(tiny_gemma3) as (core, sliding, log, model):
        kv = core.kv

        def exact() -> None:
            assert model.blocks == expected_blocks(kv.tree)
            assert model.window_blocks == expected_window_blocks(sliding.store)
            assert {i: b.count for i, b in log.window_blocks.items()} == window_counts(sliding.store)

        history = [*SYSTEM, 10, 11, 12]
        history += turn(core, "t1", history)
        exact()
        first_windows = {key for key, _w in sliding.store}
        first_blocks = set(model.window_blocks)
        assert first_windows and first_blocks and model.blocks
        seen = log.sequence

        history += [20, 21, 22]
        turn(core, "t2", history)
        exact()
        assert core.scheduler.counters.hit_tokens > 0  # turn 2 resumed from turn 1's window ...
        assert not first_windows & {key for key, _w in sliding.store}  # ... which went
        gone = first_blocks - set(model.window_blocks)
        withdrawn = [
            e.removed
            for b in log.replay(seen + 1) or []
            for e in b.events
            if e.WhichOneof("data") == "removed"
        ]
        assert gone and {h for r in withdrawn if r.group_idx == 1 for h in r.block_hashes} == gone

        fresh = RouterModel(window=sliding.window)
        for batch in log.snapshot():
            fresh.apply(batch)
        assert fresh.blocks == model.blocks and fresh.window_blocks == model.window_blocks
        late = CacheEvents(BS, window=sliding.window)
        kv.add_listener(late, replay=True)
        for group in ("blocks", "window_blocks"):
            live, replayed = getattr(log, group), getattr(late.kv(""), group)
            assert {i: b.count for i, b in replayed.items()} == {i: b.count for i, b in live.items()}
        kv.remove_listener(late)

        seen = log.sequence
        core.admin.flush("evict_unlocked")
        assert model.blocks == {} and model.window_blocks == {} and len(sliding.store) == 0
        flushed = [e.removed for b in log.replay(seen + 1) or [] for e in b.events]
        assert {r.group_idx for r in flushed} == {0, 1}


def test_a_block_stays_in_group_1_while_any_kept_window_covers_it(tiny_gemma3: LoadedModel) -> None:
    """Two requests that end alike keep windows over one shared block: it is counted twice, and stays
    announced when one of the windows goes."""
    with followed_windowed_core(tiny_gemma3) as (core, sliding, log, model):
        kv = core.kv
        a, b = [*SYSTEM, 1], [*SYSTEM, 2]
        turn(core, "a", a)
        turn(core, "b", b)  # ends where `a` ends: both windows cover the system prompt's last block
        shared = chain("", SYSTEM, BS, len(SYSTEM) // BS)[-1]
        counts = window_counts(sliding.store)
        assert counts[shared] >= 2 and log.window_blocks[shared].count == counts[shared]
        kv.evict_prefix(a, "")  # `a`'s continuation and its window go
        assert len(window_counts(sliding.store)) < len(counts)
        assert shared in model.window_blocks and model.window_blocks == expected_window_blocks(sliding.store)
        assert {i: b.count for i, b in log.window_blocks.items()} == window_counts(sliding.store)
