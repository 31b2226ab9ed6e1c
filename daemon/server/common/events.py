"""The daemon's cache-event logs: the radix tree's changes, numbered for both cache-event streams.

`CacheFeed` posts every change, evictions included, to the loop; `CacheEvents` feeds each namespace's
`NamespaceKvLog` (vLLM's `SubscribeKvEvents`) and, while it has readers, radixd's node log. In the
windowed KV layout the kept windows' changes come too, as the "sliding_window" group's events.
NOTE: a log that stops recording leaves a gap in its numbers, so an older resume resyncs."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import grpc
from radixd_client._pb import cache_admin_pb2

from radixd.daemon.server.common.auth import tenant_of
from radixd.daemon.server.common.errors import RpcFailure
from radixd.daemon.server.common.event_log import EventLog
from radixd.daemon.server.common.kv_events import NamespaceKvLog, Schedule

if TYPE_CHECKING:
    from radixd.daemon.server.common.cache_feed import CacheFeed

Event = cache_admin_pb2.SubscribeCacheEventsResponse
STORED, REMOVED = cache_admin_pb2.CACHE_EVENT_KIND_STORED, cache_admin_pb2.CACHE_EVENT_KIND_REMOVED
RESYNC = "resync with LookupPrefix and subscribe with after_sequence=0"


def numbered(sequence: int, event: Event) -> Event:
    """The retained `event` (shared by every reader) with its sequence number, as one reader gets it."""
    out = Event(sequence=sequence)
    out.MergeFrom(event)
    return out


FULL_ATTENTION, SLIDING_WINDOW = "full_attention", "sliding_window"
"""radixd's stream's `kv_group`: a tree node's event, a kept window's."""


class CacheEvents:
    """Every namespace's KV log and radixd's change log (the `CacheFeed`'s sink); `window` > 0: the
    engine runs the windowed KV layout with that sliding window (tokens)."""

    def __init__(
        self,
        block_size: int,
        schedule: Schedule | None = None,
        retain: int = 4096,
        buffer: int = 1024,
        window: int = 0,
    ) -> None:
        self.changes: EventLog[Event] = EventLog(
            "events", lambda _: "after_sequence set to the last sequence you saw", retain, buffer
        )
        self._kv: dict[str, NamespaceKvLog] = {}
        self._kv_args = (block_size, schedule, retain, buffer, window)
        # Sequences restart at 1 with every daemon start; the id tells a restart from a gap.
        self.start_id = f"{int(time.time())}-{secrets.token_hex(4)}"
        self.feed: CacheFeed | None = None

    @property
    def sequence(self) -> int:
        """The newest sequence number of radixd's stream."""
        return self.changes.sequence

    @property
    def num_subscribers(self) -> int:
        """Streams currently registered for radixd's new events."""
        return self.changes.num_subscribers

    def kv(self, namespace: str) -> NamespaceKvLog:
        """The KV log of `namespace` (created on first use).

        NOTE: a subscriber reads only its own namespace, so tenants never see each other's prefixes."""
        log = self._kv.get(namespace)
        if log is None:
            log = self._kv[namespace] = NamespaceKvLog(namespace, *self._kv_args)
        return log

    def subscribed(self) -> AbstractAsyncContextManager[None]:
        """The tree's changes reach this log inside this block."""
        return self.feed.subscribed() if self.feed is not None else contextlib.nullcontext()

    # ---- the tree's and the kept windows' changes (event loop) ----
    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        self._record(STORED, namespace, tokens, start, num_blocks, "", FULL_ATTENTION)
        self.kv(namespace).stored(tokens, start)

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        self._record(REMOVED, namespace, tokens, start, num_blocks, reason, FULL_ATTENTION)
        self.kv(namespace).removed(tokens, start)

    def kept(self, namespace: str, tokens: list[int], start: int, num_pages: int) -> None:
        self._record(STORED, namespace, tokens, start, num_pages, "", SLIDING_WINDOW)
        self.kv(namespace).kept(tokens, start)

    def dropped(self, namespace: str, tokens: list[int], start: int, num_pages: int, reason: str) -> None:
        self._record(REMOVED, namespace, tokens, start, num_pages, reason, SLIDING_WINDOW)
        self.kv(namespace).dropped(tokens, start)

    def _record(
        self,
        kind: cache_admin_pb2.CacheEventKind,
        namespace: str,
        tokens: list[int],
        start: int,
        num_blocks: int,
        reason: str,
        group: str,
    ) -> None:
        # Radixd's stream records only while it has readers (events carry whole token paths).
        if self.changes.num_subscribers:
            self.changes.append(
                Event(
                    timestamp=time.time(),
                    kind=kind,
                    namespace=tenant_of(namespace),
                    token_ids=tokens,
                    start=start,
                    num_blocks=num_blocks,
                    reason=reason,
                    kv_group=group,
                )
            )

    def attached(self) -> None:
        """The listener's install replayed the cached content: publish it (before any snapshot)."""
        for log in self._kv.values():
            log.publish()

    def detached(self) -> None:
        """The listener is gone: every KV log forgets its state (see `NamespaceKvLog.unobserved`)."""
        for log in self._kv.values():
            log.unobserved()

    # ---- radixd's stream ----
    async def subscribe(self, after: int) -> AsyncIterator[Event]:
        """Replay retained events after `after` (0 = none), then stream new ones."""
        log = self.changes
        async with self.subscribed():
            try:
                with log.subscribed() as reader:
                    kept = log.since(after) if after else []
                    if kept is None:
                        raise RpcFailure(grpc.StatusCode.OUT_OF_RANGE, self._refusal(after))
                    last = after or log.sequence
                    for last, event in kept:
                        yield numbered(last, event)
                    while (item := await reader.next(last)) is not None:
                        last = item[0]
                        yield numbered(*item)
            finally:
                if not log.num_subscribers:
                    log.gap()

    def _refusal(self, after: int) -> str:
        seq, oldest = self.changes.sequence, self.changes.recent[0][0] if self.changes.recent else None
        if after > seq:
            return (
                f"after_sequence {after} is beyond the newest event ({seq}) of this daemon (start id"
                f" {self.start_id}): it restarted since you subscribed, so your map is stale; {RESYNC}"
            )
        return (
            f"events after {after} are no longer retained (oldest is {oldest or seq + 1}, newest {seq},"
            f" daemon start id {self.start_id}); {RESYNC}"
        )
