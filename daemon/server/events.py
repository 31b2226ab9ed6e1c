"""Cache events for routers: stored / removed / cleared, with increasing sequence numbers.

NOTE: the radix tree is the only source of events. `TreeEventBridge` is the tree's listener: it runs on
the engine thread inside the tree's operations, so it only posts each change to the event loop, where
`CacheEventHub` numbers it, keeps the recent ones for replay and fans it out. Every change is
reported while someone subscribes, LRU evictions under memory pressure included, so a subscriber's
map stays exact. The listener is installed only then (the hub's `feed`, see cache_feed.py): when the
last subscriber leaves, the hub spends one sequence number on the unobserved stretch and drops what it
retained, so a later resume from an older sequence is told to resynchronize instead of missing
changes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
from radixd_client._pb import cache_admin_pb2

from radixd.daemon.server.auth import tenant_of
from radixd.daemon.server.cache_feed import CacheFeed
from radixd.daemon.server.errors import RpcFailure

Event = cache_admin_pb2.SubscribeCacheEventsResponse


class CacheEventHub:
    """Keeps the last `retain` events for replay and fans new ones out to bounded subscriber queues.

    `feed`: installs the tree listener feeding this hub while anyone subscribes (None: the owner
    keeps one installed, as unit tests do).
    """

    def __init__(self, block_size: int, retain: int = 4096, subscriber_buffer: int = 1024) -> None:
        self.block_size = block_size
        self._seq = 0
        self._recent: collections.deque[Event] = collections.deque(maxlen=retain)
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._buffer = subscriber_buffer
        # Sequences restart at 1 with every daemon start; the id tells a restart from a gap.
        self.start_id = f"{int(time.time())}-{secrets.token_hex(4)}"
        self.feed: CacheFeed | None = None

    @property
    def sequence(self) -> int:
        return self._seq

    @property
    def num_subscribers(self) -> int:
        """Streams currently registered for new events."""
        return len(self._subscribers)

    def _publish(
        self, kind: int, namespace: str, tokens: list[int], blocks: int, start: int = 0, reason: str = ""
    ) -> None:
        self._seq += 1
        event = Event(
            sequence=self._seq,
            kind=kind,  # type: ignore[arg-type]
            namespace=tenant_of(namespace),
            num_blocks=blocks,
            token_ids=tokens,
            timestamp=time.time(),
            start=start,
            reason=reason,
        )
        self._recent.append(event)
        for q in list(self._subscribers):
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                # A subscriber that cannot keep up is cut off (it resubscribes with after_sequence).
                self._subscribers.discard(q)
                q.get_nowait()
                q.put_nowait(None)

    def stored(self, namespace: str, tokens: list[int], start: int, blocks: int) -> None:
        self._publish(cache_admin_pb2.CACHE_EVENT_KIND_STORED, namespace, tokens, blocks, start)

    def removed(self, namespace: str, tokens: list[int], start: int, blocks: int, reason: str) -> None:
        self._publish(cache_admin_pb2.CACHE_EVENT_KIND_REMOVED, namespace, tokens, blocks, start, reason)

    def cleared(self) -> None:
        self._publish(cache_admin_pb2.CACHE_EVENT_KIND_CLEARED, "", [], 0)

    def unobserved(self) -> None:
        """The listener is gone (the feed's last subscriber left): changes from now on go unreported,
        so nothing retained can bring a resuming subscriber up to date any more. One sequence number
        marks the gap: a resume from before it is refused (resync), new subscribers start after it."""
        self._recent.clear()
        self._seq += 1

    async def subscribe(self, after_sequence: int) -> AsyncIterator[Event]:
        """Replay retained events after `after_sequence` (0 = none), then stream new ones."""
        feed = self.feed.subscribed() if self.feed is not None else contextlib.nullcontext()
        async with feed, contextlib.aclosing(self._stream(after_sequence)) as events:
            async for event in events:
                yield event

    async def _stream(self, after_sequence: int) -> AsyncGenerator[Event, None]:
        q: asyncio.Queue[Event | None] = asyncio.Queue(self._buffer)
        self._subscribers.add(q)
        try:
            if after_sequence > self._seq:
                raise RpcFailure(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"after_sequence {after_sequence} is beyond the newest event ({self._seq}) of this"
                    f" daemon (start id {self.start_id}): it restarted since you subscribed, so your map is"
                    " stale; resync with LookupPrefix and subscribe with after_sequence=0",
                )
            if after_sequence:
                oldest = self._recent[0].sequence if self._recent else self._seq + 1
                if after_sequence + 1 < oldest:
                    raise RpcFailure(
                        grpc.StatusCode.OUT_OF_RANGE,
                        f"events after {after_sequence} are no longer retained (oldest is {oldest}, newest"
                        f" {self._seq}, daemon start id {self.start_id}); resync with LookupPrefix and"
                        " subscribe with after_sequence=0",
                    )
            last = after_sequence if after_sequence else self._seq
            for event in list(self._recent):
                if event.sequence > last:
                    last = event.sequence
                    yield event
            while True:
                item = await q.get()
                if item is None:
                    raise RpcFailure(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the subscriber fell more than {self._buffer} events behind; resubscribe with"
                        " after_sequence set to the last sequence you saw",
                    )
                if item.sequence > last:
                    last = item.sequence
                    yield item
        finally:
            self._subscribers.discard(q)


class TreeEventBridge:
    """The radix tree's listener (``radixd.radix.CacheListener``): hands each change to the loop."""

    def __init__(self, hub: CacheEventHub, loop: asyncio.AbstractEventLoop) -> None:
        self._hub = hub
        self._loop = loop

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        self._loop.call_soon_threadsafe(self._hub.stored, namespace, tokens, start, num_blocks)

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        self._loop.call_soon_threadsafe(self._hub.removed, namespace, tokens, start, num_blocks, reason)

    def cleared(self) -> None:
        self._loop.call_soon_threadsafe(self._hub.cleared)
