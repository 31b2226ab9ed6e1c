"""Hand a step's outputs to the event loop in one call, when the engine thread stops needing the GIL.

The engine calls `flush` before its forward pass and before it idles, so the loop's per-output Python
work runs while the engine sits in GIL-releasing torch ops instead of competing with its bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixd.daemon.engine.types import RequestOutput

Put = Callable[["RequestOutput"], None]


class OutputHandover:
    """Outputs posted by the engine thread, delivered to their streams on `loop` in batches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()  # posts come from the engine thread; a flush may race a late one
        self._pending: list[tuple[Put, RequestOutput]] = []
        self.batches = 0  # handed over (a count for tests and benchmarks)

    def post(self, put: Put, out: RequestOutput) -> None:
        """Engine thread: queue `out` for `put` (a stream's queue) until the next `flush`."""
        with self._lock:
            self._pending.append((put, out))

    def flush(self) -> None:
        """Engine thread: hand what was posted to the loop in one call (dropped once the loop is gone)."""
        with self._lock:
            if not self._pending:
                return
            batch, self._pending = self._pending, []
        self.batches += 1
        # A closed loop (shutdown) raises RuntimeError: nobody is left to read these streams then.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(_deliver, batch)


def _deliver(batch: list[tuple[Put, RequestOutput]]) -> None:
    for put, out in batch:
        put(out)
