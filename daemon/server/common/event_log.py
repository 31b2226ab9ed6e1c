"""`EventLog`: numbered entries, a window of recent ones for resume, bounded readers (both event streams).

NOTE: the tree never waits for a reader: one `buffer` entries behind is cut off with the cursor to
resume from. `gap` spends a number and forgets the window, so no resume steps over unrecorded changes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import grpc

from radixd.daemon.server.common.errors import RpcFailure

T = TypeVar("T")


class Reader(Generic[T]):
    """One reader's queue of new entries, bounded by `EventLog.append` (then the cut-off marker None)."""

    def __init__(self, log: EventLog[T]) -> None:
        self.log = log
        self.queue: asyncio.Queue[tuple[int, T] | None] = asyncio.Queue()

    async def next(self, last: int, timeout: float | None = None) -> tuple[int, T] | None:
        """The next entry numbered after `last` (None once `timeout` passed without one)."""
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), timeout)
            except TimeoutError:
                return None
            if item is None:
                raise RpcFailure(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the subscriber fell more than {self.log.buffer} {self.log.unit} behind; resubscribe"
                    f" with {self.log.resume_hint(last)}",
                )
            if item[0] > last:
                return item


class EventLog(Generic[T]):
    """Numbers entries from 1, keeps the last `retain`, hands each new one to every reader."""

    def __init__(self, unit: str, resume_hint: Callable[[int], str], retain: int, buffer: int) -> None:
        self.sequence = 0
        self.unit, self.resume_hint, self.buffer = unit, resume_hint, buffer
        self.recent: collections.deque[tuple[int, T]] = collections.deque(maxlen=retain)
        self._readers: set[asyncio.Queue[tuple[int, T] | None]] = set()

    @property
    def num_subscribers(self) -> int:
        """Readers currently taking new entries."""
        return len(self._readers)

    def append(self, entry: T) -> None:
        self.sequence += 1
        item = (self.sequence, entry)
        self.recent.append(item)
        for q in list(self._readers):
            if q.qsize() < self.buffer:
                q.put_nowait(item)
            else:
                self._readers.discard(q)
                q.put_nowait(None)

    def gap(self) -> None:
        """What happens from now on goes unrecorded: a resume from before now is refused."""
        self.recent.clear()
        if self.sequence:
            self.sequence += 1

    def since(self, after: int) -> list[tuple[int, T]] | None:
        """The retained entries after `after`; None when the window can't resume from it."""
        oldest = self.recent[0][0] if self.recent else self.sequence + 1
        if after > self.sequence or after + 1 < oldest:
            return None
        return [item for item in self.recent if item[0] > after]

    @contextlib.contextmanager
    def subscribed(self) -> Iterator[Reader[T]]:
        """A reader of every entry appended inside this block."""
        reader = Reader(self)
        self._readers.add(reader.queue)
        try:
            yield reader
        finally:
            self._readers.discard(reader.queue)
