"""Cache-event listeners exist only while someone subscribes, and a gap forces a resync.

The engine is stood in for by its KV manager behind `execute` (the listener commands are all a feed
sends); the tree is real, and so is the cache-event log (radixd's stream and the vLLM KV-event logs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import grpc
import pytest
from test_kv_events import BS, RouterModel, cache, expected_blocks

from radixd.daemon.engine.commands import AddCacheListener, Command, RemoveCacheListener
from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.server.common.cache_feed import CacheFeed
from radixd.daemon.server.common.errors import RpcFailure
from radixd.daemon.server.common.events import CacheEvents


class KvEngine:
    """`Engine.execute` for the listener commands, applied at once to `kv`."""

    def __init__(self, kv: KVManager) -> None:
        self.kv = kv
        self.commands: list[str] = []

    def execute(self, cmd: Command[Any]) -> concurrent.futures.Future[Any]:
        self.commands.append(type(cmd).__name__)
        if isinstance(cmd, AddCacheListener):
            self.kv.add_listener(cmd.listener, cmd.replay)
        elif isinstance(cmd, RemoveCacheListener):
            self.kv.remove_listener(cmd.listener)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(None)
        return fut


def kv_manager() -> KVManager:
    return KVManager.create(48, BS, EngineConfig())


def test_no_listener_until_the_first_subscriber_and_none_after_the_last() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        kv = kv_manager()
        engine = KvEngine(kv)
        logs = CacheEvents(BS, schedule=loop.call_soon)
        feed = CacheFeed(engine, logs, loop)  # type: ignore[arg-type]
        cache(kv.tree, list(range(10)))  # cached before anyone listens: translated by nobody
        assert not kv.listening and kv.tree.listener is None
        async with feed.subscribed():
            async with feed.subscribed():  # a second subscriber installs nothing more
                assert kv.listening and feed.subscribers == 2
            assert kv.listening
            # The install replayed what was cached, so a snapshot now describes it.
            model = RouterModel()
            for batch in logs.kv("").snapshot():
                model.apply(batch)
            assert model.blocks == expected_blocks(kv.tree)
            cursor = logs.kv("").sequence + 1
        assert not kv.listening and kv.tree.listener is None
        assert engine.commands == ["AddCacheListener", "RemoveCacheListener"]
        cache(kv.tree, [7] * 12)  # unobserved
        async with feed.subscribed():
            log = logs.kv("")
            assert log.replay(cursor) is None  # the gap: a resume gets a snapshot, not a stale replay
            model = RouterModel()
            for batch in log.snapshot():
                model.apply(batch)
            assert model.blocks == expected_blocks(kv.tree)

    asyncio.run(main())


def test_the_admin_hub_listens_only_while_subscribed_and_refuses_a_resume_across_a_gap() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        kv = kv_manager()
        hub = CacheEvents(BS)
        hub.feed = CacheFeed(KvEngine(kv), hub, loop)  # type: ignore[arg-type]
        cache(kv.tree, list(range(8)))
        assert not kv.listening and hub.sequence == 0  # nobody subscribed: nothing translated

        stream = hub.subscribe(0)
        first = asyncio.ensure_future(stream.__anext__())
        while hub.num_subscribers == 0:
            await asyncio.sleep(0)
        assert kv.listening
        cache(kv.tree, list(range(8, 16)))
        event = await asyncio.wait_for(first, 5)
        assert list(event.token_ids) == list(range(8, 16)) and event.sequence == 1
        await stream.aclose()
        assert not kv.listening
        cache(kv.tree, list(range(16, 24)))  # unobserved
        resumed = hub.subscribe(event.sequence)
        with pytest.raises(RpcFailure) as err:
            await asyncio.wait_for(resumed.__anext__(), 5)
        assert err.value.code == grpc.StatusCode.OUT_OF_RANGE and "resync" in err.value.message
        await resumed.aclose()
        assert not kv.listening

    asyncio.run(main())


def test_a_subscriber_cancelled_while_the_listener_installs_leaves_none_behind() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        kv = kv_manager()
        unanswered: list[concurrent.futures.Future[Any]] = []

        class SlowEngine(KvEngine):
            """Applies the install at once but answers it only when the test says so."""

            def execute(self, cmd: Command[Any]) -> concurrent.futures.Future[Any]:
                if isinstance(cmd, AddCacheListener) and not unanswered:
                    self.kv.add_listener(cmd.listener, cmd.replay)
                    unanswered.append(concurrent.futures.Future())
                    return unanswered[0]
                return super().execute(cmd)

        feed = CacheFeed(SlowEngine(kv), CacheEvents(BS), loop)  # type: ignore[arg-type]
        subscriber = asyncio.ensure_future(feed.acquire())
        while not unanswered:
            await asyncio.sleep(0)
        subscriber.cancel()
        with pytest.raises(asyncio.CancelledError):
            await subscriber
        assert kv.listening  # installed, though its subscriber is gone ...
        unanswered[0].set_result(None)
        for _ in range(100):
            if not kv.listening:
                break
            await asyncio.sleep(0)
        assert not kv.listening and feed.subscribers == 0  # ... and removed once the install answered

    asyncio.run(main())


def test_a_listener_is_added_once() -> None:
    kv = kv_manager()
    cache(kv.tree, list(range(8)))
    logs = CacheEvents(BS)
    kv.add_listener(logs, replay=True)
    kv.add_listener(logs, replay=True)  # no second replay, no doubled events
    assert kv.tree.listener is logs and len(logs.kv("").blocks) == 2
    kv.remove_listener(logs)
    assert not kv.listening


def test_both_streams_share_one_listener_installed_once() -> None:
    """radixd's stream and a vLLM subscriber read one log, fed by one listener: the second subscriber
    installs nothing, and the install's replay already gave the KV log what was cached."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        kv = kv_manager()
        engine = KvEngine(kv)
        events = CacheEvents(BS, schedule=loop.call_soon)
        events.feed = CacheFeed(engine, events, loop)  # type: ignore[arg-type]
        cache(kv.tree, list(range(8)))
        admin = events.subscribe(0)
        first = asyncio.ensure_future(admin.__anext__())
        while events.num_subscribers == 0:
            await asyncio.sleep(0)
        model = RouterModel()
        for batch in events.kv("").snapshot():
            model.apply(batch)
        assert model.blocks == expected_blocks(kv.tree)
        async with events.subscribed():  # a vLLM subscriber
            cache(kv.tree, list(range(8, 16)))
            event = await asyncio.wait_for(first, 5)
            assert list(event.token_ids) == list(range(8, 16)) and event.sequence == 1
            assert engine.commands == ["AddCacheListener"]
        await admin.aclose()
        assert engine.commands == ["AddCacheListener", "RemoveCacheListener"] and not kv.listening

    asyncio.run(main())
