"""The radix tree's node events, translated into the vLLM worker protocol's KV events (full blocks).

The tree reports nodes (a token path and where the node's own tokens start); a router such as smg's
`cache_aware` policy wants blocks: exactly `block_size` token ids each, named by a 64-bit id and
chained to their parent block's id. `NamespaceKvLog` keeps, per cache namespace, the full blocks the
tree holds, numbers its batches and retains the recent ones for resume.

Block ids are `block_hash(namespace, parent id, tokens)`: a keyed BLAKE2b of the chain, so the same
prefix in the same namespace always gets the same id, in every replica and across restarts.

NOTE: only full blocks counted from token 0 are published; a leaf's partial trailing block never is
(no router could match it: it only learns full blocks). Pinned blocks are published like any other
cached block, since requests do hit them. A block is live while at least one tree node covers it (a
node covers block b when the block's end lies inside the node), so the log announces a block when its
count goes 0 -> 1 and removes it when it drops back to 0.
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated.common_pb2 import KvEventBatch as Batch

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


@dataclass(slots=True)
class LiveBlock:
    block_id: int
    parent: int | None
    tokens: tuple[int, ...]
    depth: int
    count: int = 0


class NamespaceKvLog:
    """One namespace's live full blocks, its numbered batches and a bounded history for resume.

    Fed on the event loop (`stored`, `removed`, `cleared`); changes made within one loop tick are
    published as one batch when `schedule` runs the publish (immediately when `schedule` is None).
    Subscribers take batches through a callback; one that cannot take a batch is cut off and must
    resubscribe from the last sequence it saw.
    """

    def __init__(
        self,
        namespace: str,
        block_size: int,
        schedule: Schedule | None = None,
        retain: int = 4096,
    ) -> None:
        self.namespace = namespace
        self.block_size = block_size
        self.sequence = 0
        self.blocks: dict[int, LiveBlock] = {}
        self.history: collections.deque[Batch] = collections.deque(maxlen=retain)
        self._queues: dict[object, Callable[[Batch], bool]] = {}
        self._schedule = schedule
        self._pending: list[common_pb2.KvCacheEvent] = []
        self._scheduled = False

    # ---------------------------------------------------------------- tree events (event loop)
    def stored(self, tokens: list[int], start: int) -> None:
        """A node covering `tokens[start:]` joined the tree."""
        bs = self.block_size
        first, end = start // bs, len(tokens) // bs  # blocks whose end lies in the node
        if end <= first:
            return
        ids = chain(self.namespace, tokens, bs, end)
        run: list[common_pb2.KvBlock] = []
        run_parent: int | None = None
        for b in range(first, end):
            parent = ids[b - 1] if b else None
            live = self.blocks.get(ids[b])
            if live is None:
                live = LiveBlock(ids[b], parent, tuple(tokens[b * bs : (b + 1) * bs]), b)
                self.blocks[ids[b]] = live
            live.count += 1
            if live.count == 1:
                if not run:
                    run_parent = parent
                run.append(self._kv_block(live))
            elif run:
                self._add_stored(run, run_parent)
                run = []
        if run:
            self._add_stored(run, run_parent)

    def removed(self, tokens: list[int], start: int) -> None:
        """The node covering `tokens[start:]` left the tree."""
        bs = self.block_size
        first, end = start // bs, len(tokens) // bs
        if end <= first:
            return
        ids = chain(self.namespace, tokens, bs, end)
        gone: list[int] = []
        for b in reversed(range(first, end)):  # children before parents
            live = self.blocks.get(ids[b])
            if live is None:
                continue  # stored before a `cleared` this log already applied
            live.count -= 1
            if live.count <= 0:
                del self.blocks[ids[b]]
                gone.append(ids[b])
        if gone:
            self._add(common_pb2.KvCacheEvent(removed=common_pb2.KvBlocksRemoved(block_hashes=gone)))

    def cleared(self) -> None:
        """Everything was dropped (a forced flush)."""
        self.blocks.clear()
        self._pending = []  # superseded: the cleared event wipes them anyway
        self._add(common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared()))

    # ---------------------------------------------------------------- publishing
    def _kv_block(self, live: LiveBlock) -> common_pb2.KvBlock:
        return common_pb2.KvBlock(block_hash=live.block_id, token_ids=live.tokens, block_size=self.block_size)

    def _add_stored(self, run: list[common_pb2.KvBlock], parent: int | None) -> None:
        stored = common_pb2.KvBlocksStored(blocks=run, tier=common_pb2.KV_CACHE_TIER_DEVICE)
        if parent is not None:
            stored.parent_block_hash = parent
        self._add(common_pb2.KvCacheEvent(stored=stored))

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
        if not self._pending:
            return
        self.sequence += 1
        batch = Batch(sequence_number=self.sequence, timestamp=time.time(), events=self._pending)
        self._pending = []
        self.history.append(batch)
        for key, put in list(self._queues.items()):
            if not put(batch):
                # A subscriber that cannot keep up is cut off; it resumes from its last sequence.
                self._queues.pop(key, None)

    def subscribe(self, key: object, put: Callable[[Batch], bool]) -> None:
        """Deliver every batch published from now on through `put`; one that returns False (the
        subscriber is full) gets nothing more."""
        self._queues[key] = put

    def unsubscribe(self, key: object) -> None:
        self._queues.pop(key, None)

    def unobserved(self) -> None:
        """The tree listener is gone: forget the live blocks and the history (they would go stale)
        and spend one sequence number on the gap, so a resume from before it gets a snapshot."""
        self.blocks.clear()
        self.history.clear()
        self._pending = []
        if self.sequence:
            self.sequence += 1

    @property
    def num_subscribers(self) -> int:
        return len(self._queues)

    # ---------------------------------------------------------------- catching a subscriber up
    def replay(self, start: int) -> list[Batch] | None:
        """Retained batches numbered >= `start`, or None when the history no longer reaches back to it
        (or `start` is beyond the newest batch: this daemon restarted), so a snapshot is due."""
        if start <= 0 or start > self.sequence + 1:
            return None
        oldest = self.history[0].sequence_number if self.history else self.sequence + 1
        if start < oldest:
            return None
        return [b for b in self.history if b.sequence_number >= start]

    def snapshot(self) -> list[Batch]:
        """The live blocks as snapshot chunks numbered up to the current sequence (empty before the first
        batch: there is nothing to resync from)."""
        if self.sequence == 0:
            return []
        ordered = sorted(self.blocks.values(), key=lambda b: b.depth)  # parents before children
        per = SNAPSHOT_CHUNK_BLOCKS
        count = min(max(1, -(-len(ordered) // per)), self.sequence)
        per = max(per, -(-len(ordered) // count))
        batches: list[Batch] = []
        now = time.time()
        for i in range(count):
            events = [common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared())] if i == 0 else []
            for live in ordered[i * per : (i + 1) * per]:
                stored = common_pb2.KvBlocksStored(
                    blocks=[self._kv_block(live)], tier=common_pb2.KV_CACHE_TIER_DEVICE
                )
                if live.parent is not None:
                    stored.parent_block_hash = live.parent
                events.append(common_pb2.KvCacheEvent(stored=stored))
            chunk = common_pb2.KvSnapshotChunk(index=i, count=count, blocks=len(ordered), unknown_before=0)
            seq = self.sequence - count + 1 + i
            batches.append(Batch(sequence_number=seq, timestamp=now, events=events, snapshot=chunk))
        return batches


class KvEventLogs:
    """Every namespace's log; the tree's listener on the event loop (see `KvLogBridge`).

    NOTE: namespaces are kept apart: a subscriber reads the log of the namespace it authenticated as,
    so a router fronting one tenant never learns another tenant's prefixes (the tree never shares
    blocks across namespaces either, so those prefixes could not be hit through it anyway).
    """

    def __init__(self, block_size: int, schedule: Schedule | None = None, retain: int = 4096) -> None:
        self.block_size = block_size
        self._schedule = schedule
        self._retain = retain
        self._logs: dict[str, NamespaceKvLog] = {}

    def log(self, namespace: str) -> NamespaceKvLog:
        """The log of `namespace` (created empty on first use)."""
        log = self._logs.get(namespace)
        if log is None:
            log = NamespaceKvLog(namespace, self.block_size, self._schedule, self._retain)
            self._logs[namespace] = log
        return log

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        self.log(namespace).stored(tokens, start)

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        self.log(namespace).removed(tokens, start)

    def cleared(self) -> None:
        for log in self._logs.values():
            log.cleared()

    def publish_pending(self) -> None:
        """Publish what every log has pending now (after a replay, before a snapshot is taken)."""
        for log in self._logs.values():
            log.publish()

    def unobserved(self) -> None:
        """The tree listener is gone: every log forgets its state (see `NamespaceKvLog.unobserved`)."""
        for log in self._logs.values():
            log.unobserved()


class KvLogBridge:
    """A radix tree listener (engine thread) that hands each change to `KvEventLogs` on the loop."""

    def __init__(self, logs: KvEventLogs, loop: asyncio.AbstractEventLoop) -> None:
        self._logs = logs
        self._loop = loop

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self._loop.call_soon_threadsafe(self._logs.stored, namespace, tokens, start, num_blocks)

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._logs.removed, namespace, tokens, start, num_blocks, reason)

    def cleared(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._logs.cleared)
