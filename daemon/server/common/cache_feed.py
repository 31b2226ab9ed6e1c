"""`CacheFeed`: the daemon's one cache listener, installed in the engine only while someone subscribes;
it posts each tree change, and each kept window's (a windowed KV layout), from the engine thread to its
sink on the loop (install replays the cache).
NOTE: a command's future resolves after the listener posted its changes, so the sink sees exactly the
changes between `attached` and `detached`; `detached` must make later subscribers resynchronize."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from radixd.daemon.engine.commands import AddCacheListener, RemoveCacheListener
from radixd.daemon.process.log import get_logger
from radixd.radix import CacheListener, WindowListener

if TYPE_CHECKING:
    from radixd.daemon.engine.engine import Engine

log = get_logger("radixd.server.cache_feed")


class Sink(CacheListener, WindowListener, Protocol):
    """The feed's receiver on the loop: tree and window changes, then `attached` / `detached`."""

    def attached(self) -> None: ...

    def detached(self) -> None: ...


class CacheFeed:
    """Installs itself as the tree's listener for the first subscriber, removes itself after the last."""

    def __init__(self, engine: Engine, sink: Sink, loop: asyncio.AbstractEventLoop) -> None:
        self._engine, self._sink, self._loop = engine, sink, loop
        self._subscribers = 0
        self._lock = asyncio.Lock()
        self._undoing: set[asyncio.Task[None]] = set()

    # ---- the tree's listener (engine thread) ----
    def _post(self, apply: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self._loop.call_soon_threadsafe(apply, *args)

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        self._post(self._sink.stored, namespace, tokens, start, num_blocks)

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        self._post(self._sink.removed, namespace, tokens, start, num_blocks, reason)

    def kept(self, namespace: str, tokens: list[int], start: int, num_pages: int) -> None:
        self._post(self._sink.kept, namespace, tokens, start, num_pages)

    def dropped(self, namespace: str, tokens: list[int], start: int, num_pages: int, reason: str) -> None:
        self._post(self._sink.dropped, namespace, tokens, start, num_pages, reason)

    # ---- subscribers (event loop) ----
    @property
    def subscribers(self) -> int:
        return self._subscribers

    async def acquire(self) -> None:
        """One more subscriber; the first installs the listener (raises, counting nobody, if refused)."""
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
                try:
                    await asyncio.wrap_future(self._engine.execute(AddCacheListener(self, replay=True)))
                except BaseException:
                    self._sink.detached()  # whatever a failed install (a partial replay) fed is void
                    raise
                self._sink.attached()
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
                await asyncio.wrap_future(self._engine.execute(RemoveCacheListener(self)))
            except Exception as exc:  # stopping or stopped: no more changes will come anyway
                log.info("cache_feed.remove_failed", error=str(exc))
            self._sink.detached()

    @contextlib.asynccontextmanager
    async def subscribed(self) -> AsyncIterator[None]:
        """The listener is installed inside this block."""
        await self.acquire()
        try:
            yield
        finally:
            # NOTE: shielded, so a subscriber cancelled while leaving still uninstalls the listener.
            await asyncio.shield(self.release())
