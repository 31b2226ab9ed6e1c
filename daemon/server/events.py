"""Cache events for routers: stored / removed / cleared, with increasing sequence numbers.

NOTE: what the stream covers. Events are recorded where the server sees the cache change: a finished
request stores its prompt + output (STORED), admin evictions and dropped sessions (REMOVED), flushes
(CLEARED). LRU evictions the engine makes on its own under memory pressure are not observed here yet
(the radix tree offers no listener); routers should treat the map as a hint and resync with
LookupPrefix. All methods run on the event loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator

import grpc
from radixd_client._pb import cache_admin_pb2

from radixd.daemon.server.auth import tenant_of
from radixd.daemon.server.errors import RpcFailure

Event = cache_admin_pb2.SubscribeCacheEventsResponse


class CacheEventHub:
    """Keeps the last `retain` events for replay and fans new ones out to bounded subscriber queues."""

    def __init__(self, block_size: int, retain: int = 4096, subscriber_buffer: int = 1024) -> None:
        self.block_size = block_size
        self._seq = 0
        self._recent: collections.deque[Event] = collections.deque(maxlen=retain)
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._buffer = subscriber_buffer

    @property
    def sequence(self) -> int:
        return self._seq

    def _publish(self, kind: int, namespace: str, tokens: list[int], blocks: int) -> None:
        self._seq += 1
        event = Event(
            sequence=self._seq,
            kind=kind,  # type: ignore[arg-type]
            namespace=tenant_of(namespace),
            num_blocks=blocks,
            token_ids=tokens,
            timestamp=time.time(),
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

    def stored(self, namespace: str, tokens: list[int]) -> None:
        blocks = -(-len(tokens) // self.block_size)
        self._publish(cache_admin_pb2.CACHE_EVENT_KIND_STORED, namespace, tokens, blocks)

    def removed(self, namespace: str, tokens: list[int], blocks: int) -> None:
        self._publish(cache_admin_pb2.CACHE_EVENT_KIND_REMOVED, namespace, tokens, blocks)

    def cleared(self, blocks: int) -> None:
        self._publish(cache_admin_pb2.CACHE_EVENT_KIND_CLEARED, "", [], blocks)

    async def subscribe(self, after_sequence: int) -> AsyncIterator[Event]:
        """Replay retained events after `after_sequence` (0 = none), then stream new ones."""
        q: asyncio.Queue[Event | None] = asyncio.Queue(self._buffer)
        self._subscribers.add(q)
        try:
            if after_sequence:
                oldest = self._recent[0].sequence if self._recent else self._seq + 1
                if after_sequence + 1 < oldest:
                    raise RpcFailure(
                        grpc.StatusCode.OUT_OF_RANGE,
                        f"events after {after_sequence} are no longer retained (oldest is {oldest});"
                        " resync with LookupPrefix and subscribe with after_sequence=0",
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
