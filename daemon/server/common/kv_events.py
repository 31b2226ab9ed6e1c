"""The radix tree's node events as the vLLM worker protocol's KV events (full blocks, per namespace).

Block ids are a keyed BLAKE2b of (namespace, parent id, tokens): stable across replicas and restarts.
NOTE: only full blocks counted from token 0 are published; a block is announced when the count of tree
nodes covering its end goes 0 -> 1 and removed when it returns to 0.
A windowed KV layout publishes two groups, as vLLM's hybrid models do: the tree's blocks as group 0
("full_attention") and the kept windows' as group 1 ("sliding_window": the full blocks of each window's
span, with group 0's ids), counted per group: a block stays in group 1 while any kept window covers it.
The full layout's events carry no group, as before."""

from __future__ import annotations

import array
import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated.common_pb2 import KvEventBatch as Batch

from radixd.daemon.server.common.event_log import EventLog

# One batch as the log keeps it: when it was published, and its events (numbered by the log).
KvEntry = tuple[float, list[common_pb2.KvCacheEvent]]
Schedule = Callable[[Callable[[], None]], object]
# Blocks per snapshot chunk: keeps one KvEventBatch far below gRPC's default 4 MiB message limit.
SNAPSHOT_CHUNK_BLOCKS = 1024


def block_hash(namespace: str, parent: int | None, tokens: Iterable[int]) -> int:
    """The stable signed 64-bit id of a full block (the protocol's `int64 block_hash`)."""
    h = hashlib.blake2b(digest_size=8, person=b"radixd-kv-v1")
    h.update(namespace.encode())
    h.update(b"\x00" if parent is None else b"\x01" + parent.to_bytes(8, "little", signed=True))
    h.update(array.array("I", tokens).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def chain(namespace: str, tokens: list[int], block_size: int, n_blocks: int) -> list[int]:
    """Ids of the first `n_blocks` full blocks of `tokens`."""
    ids: list[int] = []
    parent: int | None = None
    for b in range(n_blocks):
        parent = block_hash(namespace, parent, tokens[b * block_size : (b + 1) * block_size])
        ids.append(parent)
    return ids


def to_batch(item: tuple[int, KvEntry]) -> Batch:
    """A numbered log entry as its own KvEventBatch message."""
    sequence, (timestamp, events) = item
    return Batch(sequence_number=sequence, timestamp=timestamp, events=events)


FULL, SLIDING = 0, 1
"""The groups of the windowed layout: the tree's blocks, the kept windows' blocks."""
GROUP_KINDS = ("full_attention", "sliding_window")


def stored_event(
    blocks: list[common_pb2.KvBlock], parent: int | None, group: int | None = None, window: int = 0
) -> common_pb2.KvCacheEvent:
    """Device-tier `blocks`, each the child of the one before (the first of `parent`); `group` (None:
    the full layout, no group) and the sliding window of group `SLIDING`."""
    stored = common_pb2.KvBlocksStored(blocks=blocks, tier=common_pb2.KV_CACHE_TIER_DEVICE)
    if parent is not None:
        stored.parent_block_hash = parent
    if group is not None:
        stored.group_idx = group
        stored.kv_cache_spec_kind = GROUP_KINDS[group]
        if group == SLIDING:
            stored.kv_cache_spec_sliding_window = window
    return common_pb2.KvCacheEvent(stored=stored)


def removed_event(block_ids: list[int], group: int | None = None) -> common_pb2.KvCacheEvent:
    removed = common_pb2.KvBlocksRemoved(block_hashes=block_ids)
    if group is not None:
        removed.group_idx = group
    return common_pb2.KvCacheEvent(removed=removed)


@dataclass(slots=True)
class LiveBlock:
    block_id: int
    parent: int | None
    tokens: tuple[int, ...]
    depth: int
    count: int = 0


class NamespaceKvLog:
    """One namespace's live full blocks and its log; one loop tick's changes publish as one batch.
    `window` > 0: the windowed layout (two groups), with the sliding layers' window in tokens."""

    def __init__(
        self,
        namespace: str,
        block_size: int,
        schedule: Schedule | None,
        retain: int,
        buffer: int,
        window: int = 0,
    ) -> None:
        self.namespace, self.block_size, self._schedule = namespace, block_size, schedule
        self.window = window
        self.blocks: dict[int, LiveBlock] = {}  # group 0: the tree's
        self.window_blocks: dict[int, LiveBlock] = {}  # group 1: the kept windows' (windowed layout)
        self.batches: EventLog[KvEntry] = EventLog(
            "batches", lambda last: f"start_sequence_number={last + 1}", retain, buffer
        )
        self._pending: list[common_pb2.KvCacheEvent] = []
        self._scheduled = False

    @property
    def sequence(self) -> int:
        return self.batches.sequence

    # ---- tree events (event loop) ----
    def _span(self, tokens: list[int], start: int) -> tuple[range, list[int]]:
        """The blocks whose end lies in the node covering `tokens[start:]`, and the chain's ids."""
        first, end = start // self.block_size, len(tokens) // self.block_size
        return range(first, end), chain(self.namespace, tokens, self.block_size, end) if end > first else []

    def stored(self, tokens: list[int], start: int) -> None:
        """A node covering `tokens[start:]` joined the tree."""
        self._announce(tokens, start, FULL)

    def removed(self, tokens: list[int], start: int) -> None:
        """The node covering `tokens[start:]` left the tree."""
        self._withdraw(tokens, start, FULL)

    def kept(self, tokens: list[int], start: int) -> None:
        """A window holding the sliding layers' keys of `tokens[start:]` was kept."""
        self._announce(tokens, start, SLIDING)

    def dropped(self, tokens: list[int], start: int) -> None:
        """The window ending after `tokens`, from `start`, was dropped."""
        self._withdraw(tokens, start, SLIDING)

    def _group(self, group: int) -> int | None:
        """The group as published: none in the full layout."""
        return group if self.window else None

    def _announce(self, tokens: list[int], start: int, group: int) -> None:
        bs = self.block_size
        live_blocks = self.window_blocks if group == SLIDING else self.blocks
        span, ids = self._span(tokens, start)
        run: list[common_pb2.KvBlock] = []
        run_parent: int | None = None
        for b in span:
            parent = ids[b - 1] if b else None
            live = live_blocks.get(ids[b])
            if live is None:
                live = LiveBlock(ids[b], parent, tuple(tokens[b * bs : (b + 1) * bs]), b)
                live_blocks[ids[b]] = live
            live.count += 1
            if live.count == 1:
                if not run:
                    run_parent = parent
                run.append(self._kv_block(live))
            elif run:
                self._add(stored_event(run, run_parent, self._group(group), self.window))
                run = []
        if run:
            self._add(stored_event(run, run_parent, self._group(group), self.window))

    def _withdraw(self, tokens: list[int], start: int, group: int) -> None:
        live_blocks = self.window_blocks if group == SLIDING else self.blocks
        span, ids = self._span(tokens, start)
        gone: list[int] = []
        for b in reversed(span):  # children before parents
            live = live_blocks.get(ids[b])
            if live is None:
                continue  # never announced by this log: nothing to withdraw
            live.count -= 1
            if live.count <= 0:
                del live_blocks[ids[b]]
                gone.append(ids[b])
        if gone:
            self._add(removed_event(gone, self._group(group)))

    # ---- publishing ----
    def _kv_block(self, live: LiveBlock) -> common_pb2.KvBlock:
        return common_pb2.KvBlock(block_hash=live.block_id, token_ids=live.tokens, block_size=self.block_size)

    def _add(self, event: common_pb2.KvCacheEvent) -> None:
        self._pending.append(event)
        if self._schedule is None:
            self.publish()
        elif not self._scheduled:
            self._scheduled = True
            self._schedule(self.publish)

    def publish(self) -> None:
        """Number the pending events as one batch, retain it and hand it to every subscriber."""
        self._scheduled = False
        if self._pending:
            self.batches.append((time.time(), self._pending))
            self._pending = []

    def unobserved(self) -> None:
        """The tree listener is gone: forget state and leave a gap, so an older resume gets a snapshot."""
        self.blocks.clear()
        self.window_blocks.clear()
        self._pending = []
        self.batches.gap()

    # ---- catching a subscriber up ----
    def replay(self, start: int) -> list[Batch] | None:
        """Retained batches numbered >= `start`, or None when a snapshot is due (history gone, restart)."""
        kept = self.batches.since(start - 1) if start > 0 else None
        return None if kept is None else [to_batch(item) for item in kept]

    def snapshot(self) -> list[Batch]:
        """The live blocks as snapshot chunks up to the current sequence (empty before the first batch)."""
        if self.sequence == 0:
            return []
        # Parents before children, group 0 before group 1.
        ordered = [
            (group, live)
            for group, blocks in ((FULL, self.blocks), (SLIDING, self.window_blocks))
            for live in sorted(blocks.values(), key=lambda b: b.depth)
        ]
        per = SNAPSHOT_CHUNK_BLOCKS
        count = min(max(1, -(-len(ordered) // per)), self.sequence)
        per = max(per, -(-len(ordered) // count))
        batches: list[Batch] = []
        now = time.time()
        for i in range(count):
            events = [common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared())] if i == 0 else []
            for group, live in ordered[i * per : (i + 1) * per]:
                events.append(
                    stored_event([self._kv_block(live)], live.parent, self._group(group), self.window)
                )
            chunk = common_pb2.KvSnapshotChunk(index=i, count=count, blocks=len(ordered), unknown_before=0)
            seq = self.sequence - count + 1 + i
            batches.append(Batch(sequence_number=seq, timestamp=now, events=events, snapshot=chunk))
        return batches
