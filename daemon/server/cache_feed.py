"""`CacheFeed`: a cache-event listener installed in the engine only while someone subscribes.

Translating tree changes into events (token paths, block chains, cross-thread posts) costs on every
tree change, so a feed adds its listener to the engine (`AddCacheListener`) when its first
subscriber arrives and removes it (`RemoveCacheListener`) when the last one leaves; with nobody
subscribed a tree change costs one test of the tree's `listener`.

NOTE: ordering. The listener posts each change to the event loop (`call_soon_threadsafe`) from the
engine thread, and the engine resolves the command's future after that, so by the time `acquire` /
`release` resume every change reported before the install / removal has been applied on the loop.
`on_attach` / `on_detach` therefore run on a consistent view: the changes the feed saw are exactly
those between the two commands. What changed while nobody listened is never reported: the owner's
`on_detach` must make a later subscriber resynchronize (a gap in its sequence numbers).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from radixd.daemon.engine.commands import AddCacheListener, RemoveCacheListener
from radixd.daemon.log import get_logger
from radixd.radix import CacheListener

if TYPE_CHECKING:
    from radixd.daemon.engine.engine import Engine

log = get_logger("radixd.server.cache_feed")


class CacheFeed:
    """Counts subscribers; installs `listener` for the first and removes it after the last.

    `replay`: the engine first reports the cached content as `stored` events (for an observer that
    keeps the whole cached set, such as the vLLM KV-event logs). `on_attach` runs after the install
    (and the replay) has been applied on the loop, `on_detach` after the removal.
    """

    def __init__(
        self,
        engine: Engine,
        listener: CacheListener,
        *,
        replay: bool = False,
        on_attach: Callable[[], None] = lambda: None,
        on_detach: Callable[[], None] = lambda: None,
    ) -> None:
        self._engine = engine
        self._listener = listener
        self._replay = replay
        self._on_attach = on_attach
        self._on_detach = on_detach
        self._subscribers = 0
        self._lock = asyncio.Lock()
        self._undoing: set[asyncio.Task[None]] = set()

    @property
    def subscribers(self) -> int:
        return self._subscribers

    async def acquire(self) -> None:
        """One more subscriber; the first installs the listener (raises when the engine refuses, e.g.
        `EngineStopped`, and then counts nobody)."""
        step = asyncio.ensure_future(self._acquire())
        try:
            await asyncio.shield(step)
        except asyncio.CancelledError:
            # NOTE: the install may still complete after this caller gave up: undo it then, so no
            # listener outlives its subscribers.
            step.add_done_callback(self._release_if_acquired)
            raise

    async def _acquire(self) -> None:
        async with self._lock:
            if self._subscribers == 0:
                cmd = AddCacheListener(self._listener, self._replay)
                try:
                    await asyncio.wrap_future(self._engine.execute(cmd))
                except BaseException:
                    self._on_detach()  # whatever a failed install (a partial replay) fed the owner is void
                    raise
                self._on_attach()
            self._subscribers += 1

    def _release_if_acquired(self, step: asyncio.Future[None]) -> None:
        if not step.cancelled() and step.exception() is None:
            task = asyncio.ensure_future(self.release())
            self._undoing.add(task)
            task.add_done_callback(self._undoing.discard)

    async def release(self) -> None:
        """One subscriber less; the last removes the listener."""
        async with self._lock:
            self._subscribers -= 1
            if self._subscribers > 0:
                return
            try:
                await asyncio.wrap_future(self._engine.execute(RemoveCacheListener(self._listener)))
            except Exception as exc:  # stopping or stopped: no more changes will come anyway
                log.info("cache_feed.remove_failed", error=str(exc))
            self._on_detach()

    @contextlib.asynccontextmanager
    async def subscribed(self) -> AsyncIterator[None]:
        """The listener is installed inside this block."""
        await self.acquire()
        try:
            yield
        finally:
            # NOTE: shielded, so a subscriber cancelled while leaving still uninstalls the listener.
            await asyncio.shield(self.release())
