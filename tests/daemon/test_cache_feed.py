"""Cache-event listeners exist only while someone subscribes, and a gap forces a resync; in the
windowed KV layout, radixd's stream alone tells a router which prefixes are resumable.

The engine is stood in for by its KV manager behind `execute` (the listener commands are all a feed
sends); the tree is real, and so is the cache-event log (radixd's stream and the vLLM KV-event logs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import Counter
from typing import Any

import grpc
import pytest
from radixd_client._pb import cache_admin_pb2
from test_kv_events import BS, SYSTEM, RouterModel, cache, expected_blocks, turn, windowed_core

from radixd.daemon.engine.commands import AddCacheListener, Command, RemoveCacheListener
from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.loaders import LoadedModel
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


class StreamRouter:
    """A router's map built from radixd's stream alone, as its proto comment says: per prefix, the
    full_attention nodes covering it and the sliding_window windows ending exactly there."""

    def __init__(self) -> None:
        self.nodes: Counter[tuple[int, ...]] = Counter()
        self.windows: Counter[tuple[int, ...]] = Counter()
        self.reasons: list[tuple[str, str]] = []  # (kv_group, reason) of every removal

    def apply(self, event: cache_admin_pb2.SubscribeCacheEventsResponse) -> None:
        sign = 1 if event.kind == cache_admin_pb2.CACHE_EVENT_KIND_STORED else -1
        path = tuple(event.token_ids)
        if sign < 0:
            self.reasons.append((event.kv_group, event.reason))
        if event.kv_group == "full_attention":
            for end in range(event.start + 1, len(path) + 1):
                self.nodes[path[:end]] += sign
        else:
            assert event.kv_group == "sliding_window" and event.start % BS == 0 and event.num_blocks > 0
            self.windows[path] += sign
        assert min(self.nodes.values(), default=0) >= 0 and min(self.windows.values(), default=0) >= 0

    def resumable(self, prompt: list[int]) -> int:
        """The longest prefix of `prompt` a request resumes from: nodes cover it and a window ends there."""
        return max(
            (
                n
                for n in range(1, len(prompt) + 1)
                if self.nodes[tuple(prompt[:n])] and self.windows[tuple(prompt[:n])]
            ),
            default=0,
        )


def test_a_router_reading_radixds_stream_finds_exactly_the_resumable_prefixes(
    tiny_gemma3: LoadedModel,
) -> None:
    """The windowed layout: two conversations of two turns sharing a system prompt, an eviction and a
    flush; after each, the prefixes a router rebuilds from the stream alone are those LookupPrefix
    (`KVManager.cached_len`) reports resumable, for every prefix of every prompt sent."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        core = windowed_core(tiny_gemma3)
        kv = core.kv
        hub = CacheEvents(BS, window=kv.sliding.window if kv.sliding is not None else 0)
        hub.feed = CacheFeed(KvEngine(kv), hub, loop)  # type: ignore[arg-type]
        stream = hub.subscribe(0)
        pending = asyncio.ensure_future(stream.__anext__())
        while hub.num_subscribers == 0:
            await asyncio.sleep(0)
        router = StreamRouter()
        prompts: list[list[int]] = []
        seen = 0

        async def check() -> None:
            """Read the stream up to the newest event, then compare every prefix of every prompt."""
            nonlocal pending, seen
            await asyncio.sleep(0)  # the feed's posts from the engine thread (this one) land
            while seen < hub.sequence:
                event = await asyncio.wait_for(pending, 5)
                router.apply(event)
                seen = event.sequence
                pending = asyncio.ensure_future(stream.__anext__())
            for prompt in prompts:
                for n in range(len(prompt) + 1):
                    assert router.resumable(prompt[:n]) == kv.cached_len(prompt[:n], ""), (prompt, n)

        histories = [[*SYSTEM, 10 + c, 11, 12] for c in range(2)]
        for t in range(2):
            for c, history in enumerate(histories):
                prompts.append(list(history))
                history += turn(core, f"c{c}t{t}", history)
                await check()
                history += [20 + t, 21, 22]
        prompts.extend(histories)  # the next turns' prompts
        assert all(router.resumable(p) > len(SYSTEM) for p in histories)  # turn 3 would resume
        assert ("sliding_window", "superseded") in router.reasons  # turn 1's windows went
        assert set(router.windows.values()) <= {0, 1} and sum(router.windows.values()) >= 2

        kv.evict_prefix(histories[0][: len(SYSTEM) + 1], "")  # conversation 0: nodes and window go
        await check()
        assert ("sliding_window", "prefix") in router.reasons
        assert router.resumable(histories[0]) < len(SYSTEM) + 1 <= router.resumable(histories[1])
        core.admin.flush("evict_unlocked")
        await check()
        assert +router.nodes == Counter() and +router.windows == Counter()
        assert ("sliding_window", "flush") in router.reasons and ("full_attention", "flush") in router.reasons
        pending.cancel()
        await stream.aclose()
        assert not kv.listening

    asyncio.run(main())
