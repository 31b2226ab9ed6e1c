"""Move one request's outputs from the engine thread onto a bounded per-stream queue on the loop.

NOTE: the engine never blocks on a client: a slow reader's overflow aborts the request (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from radixd.daemon.server.common.errors import RpcFailure
from radixd.daemon.server.common.handover import OutputHandover

if TYPE_CHECKING:
    from radixd.daemon.engine.types import RequestOutput


class OutputBridge:
    """A bounded queue of one request's outputs, fed from the engine thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        maxsize: int,
        on_overflow: Callable[[], None],
        handover: OutputHandover | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError(f"stream buffer size must be >= 1, got {maxsize}")
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue(maxsize)
        self._on_overflow = on_overflow
        self._handover = handover
        self.overflowed = False
        self.maxsize = maxsize

    def sink(self, out: RequestOutput) -> None:
        """Engine thread: schedule `out` onto the loop (dropped once the loop is gone)."""
        if self._handover is not None:
            self._handover.post(self._put, out)
            return
        # A closed loop (shutdown) raises RuntimeError: nobody is left to read this stream then.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._put, out)

    def _put(self, out: RequestOutput) -> None:
        if self.overflowed:
            return
        try:
            self._queue.put_nowait(out)
        except asyncio.QueueFull:
            self.overflowed = True
            self._on_overflow()

    async def get(self) -> RequestOutput:
        """The next output; raises RESOURCE_EXHAUSTED once an overflow was drained."""
        if self.overflowed and self._queue.empty():
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the client read the stream too slowly ({self.maxsize} outputs buffered); the request was"
                " aborted. Read the stream continuously or ask for fewer tokens",
            )
        return await self._queue.get()
