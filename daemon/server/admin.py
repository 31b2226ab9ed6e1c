"""CacheAdminService: eviction, flush, pinning, stats, load, prefix lookup and cache events.

Every call needs the admin token; it may act on any tenant ("" = default).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from radixd_client._pb import cache_admin_pb2, cache_admin_pb2_grpc, common_pb2

from radixd.daemon.engine.commands import (
    Evict,
    EvictPrefix,
    EvictSession,
    GetStats,
    LookupPrefix,
    Pin,
    Unpin,
)
from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.engine.types import FlushMode
from radixd.daemon.server.common.auth import admin_namespace
from radixd.daemon.server.common.bounds import MAX_FLUSH_TIMEOUT_S, check_id, check_range, check_seconds
from radixd.daemon.server.common.convert import prompt_tokens
from radixd.daemon.server.common.errors import RpcFailure, bad_request
from radixd.daemon.server.common.handler import rpc
from radixd.daemon.server.common.state import ServerState
from radixd.daemon.server.sessions import on_engine

# The wire's FlushMode -> the engine's mode of the same name (tests/clients checks the client agrees).
_FLUSH: dict[int, FlushMode] = {
    cache_admin_pb2.FLUSH_MODE_EVICT_UNLOCKED: "evict_unlocked",
    cache_admin_pb2.FLUSH_MODE_REFUSE_IF_BUSY: "refuse_if_busy",
    cache_admin_pb2.FLUSH_MODE_WAIT_FOR_IDLE: "wait_for_idle",
}
DEFAULT_FLUSH_WAIT_S = 30.0


def cache_stats_response(s: EngineStats) -> cache_admin_pb2.GetCacheStatsResponse:
    """GetCacheStats for the engine's stats (hits and misses per admitted request, not per lookup)."""
    return cache_admin_pb2.GetCacheStatsResponse(
        block_size=s.block_size,
        total_blocks=s.total_blocks,
        free_blocks=s.free_blocks,
        evictable_blocks=s.evictable_blocks,
        cached_blocks=s.evictable_blocks,
        in_use_blocks=s.in_use_blocks,
        pinned_blocks=s.pinned_blocks,
        nodes=s.cache_nodes,
        hit_tokens=s.hit_tokens,
        miss_tokens=s.miss_tokens,
        evictions=dict(s.evictions),
        preemptions=s.preemptions,
        kv_layout=s.kv_layout,
        tree_blocks=s.cached_blocks,
        window_pages=s.window_pages,
        kept_windows=s.kept_windows,
        kv_bytes_per_block=s.kv_bytes_per_block,
        window_tombstones=s.window_tombstones,
        kv_windows=s.kv_windows,
    )


def load_response(s: EngineStats, draining: bool) -> cache_admin_pb2.GetLoadResponse:
    """GetLoad for the engine's stats (its "requests" are the engine's sequences)."""
    return cache_admin_pb2.GetLoadResponse(
        running_requests=s.running_seqs,
        waiting_requests=s.waiting_seqs,
        swapped_requests=s.swapped_seqs,
        max_queue=s.max_waiting,
        free_blocks=s.free_blocks,
        total_blocks=s.total_blocks,
        sessions=s.sessions,
        draining=draining,
        drafted_tokens=s.drafted_tokens,
        accepted_draft_tokens=s.accepted_draft_tokens,
    )


class CacheAdminServicer(cache_admin_pb2_grpc.CacheAdminServiceServicer):
    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def _tokens(self, prompt: common_pb2.Prompt, what: str) -> list[int]:
        if prompt.WhichOneof("kind") is None:
            raise bad_request(f"{what} is empty: set text, token_ids or chat")
        return await prompt_tokens(self.state, prompt, what)

    def _namespace(self, context: Any, namespace: str) -> str:
        """Refuse a caller without admin rights; -> the namespace the request names, bounded."""
        self.state.check_admin(context)
        return admin_namespace(check_id("namespace", namespace))

    async def _prefix(
        self, context: Any, namespace: str, prompt: common_pb2.Prompt, what: str
    ) -> tuple[list[int], str]:
        """`_namespace`, then the prompt's tokens: what Pin, Unpin and LookupPrefix act on."""
        ns = self._namespace(context, namespace)
        return await self._tokens(prompt, what), ns

    @rpc("Evict")
    async def Evict(
        self, request: cache_admin_pb2.EvictRequest, context: Any
    ) -> cache_admin_pb2.EvictResponse:
        state = self.state
        ns = self._namespace(context, request.namespace)
        target = request.WhichOneof("target")
        if target == "num_blocks":
            total = state.limits.total_blocks
            n = check_range("num_blocks", request.num_blocks, 0, total, "; Flush empties the whole cache")
            freed = await on_engine(state, Evict(n))
        elif target == "prefix":
            tokens = await self._tokens(request.prefix, "prefix")
            freed = await on_engine(state, EvictPrefix(tokens, ns))
        elif target == "session_id":
            sid = check_id("session_id", request.session_id)
            freed = await on_engine(state, EvictSession(sid))
        else:
            raise bad_request("evict needs a target: num_blocks, prefix or session_id")
        return cache_admin_pb2.EvictResponse(evicted_blocks=freed)

    @rpc("Flush")
    async def Flush(
        self, request: cache_admin_pb2.FlushRequest, context: Any
    ) -> cache_admin_pb2.FlushResponse:
        state = self.state
        state.check_admin(context)
        mode = _FLUSH.get(request.mode)
        if mode is None:
            raise bad_request(
                "flush mode is unspecified: choose EVICT_UNLOCKED, REFUSE_IF_BUSY or WAIT_FOR_IDLE"
            )
        timeout = (
            check_seconds("timeout_s", request.timeout_s, MAX_FLUSH_TIMEOUT_S, f"{DEFAULT_FLUSH_WAIT_S:g} s")
            or DEFAULT_FLUSH_WAIT_S
        )
        freed = await asyncio.wrap_future(state.engine.flush(mode, timeout))
        return cache_admin_pb2.FlushResponse(evicted_blocks=freed)

    @rpc("Pin")
    async def Pin(self, request: cache_admin_pb2.PinRequest, context: Any) -> cache_admin_pb2.PinResponse:
        tokens, ns = await self._prefix(context, request.namespace, request.prefix, "prefix")
        pinned = await on_engine(self.state, Pin(tokens, ns))
        if pinned == 0:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                "no whole cached block of this prefix to pin; generate with it first, then pin",
            )
        return cache_admin_pb2.PinResponse(pinned_tokens=pinned)

    @rpc("Unpin")
    async def Unpin(
        self, request: cache_admin_pb2.UnpinRequest, context: Any
    ) -> cache_admin_pb2.UnpinResponse:
        tokens, ns = await self._prefix(context, request.namespace, request.prefix, "prefix")
        await on_engine(self.state, Unpin(tokens, ns))
        return cache_admin_pb2.UnpinResponse()

    @rpc("GetCacheStats")
    async def GetCacheStats(
        self, request: cache_admin_pb2.GetCacheStatsRequest, context: Any
    ) -> cache_admin_pb2.GetCacheStatsResponse:
        self.state.check_admin(context)
        return cache_stats_response(await on_engine(self.state, GetStats()))

    @rpc("LookupPrefix")
    async def LookupPrefix(
        self, request: cache_admin_pb2.LookupPrefixRequest, context: Any
    ) -> cache_admin_pb2.LookupPrefixResponse:
        tokens, ns = await self._prefix(context, request.namespace, request.prompt, "prompt")
        cached = await on_engine(self.state, LookupPrefix(tokens, ns))
        return cache_admin_pb2.LookupPrefixResponse(prompt_tokens=len(tokens), cached_tokens=cached)

    @rpc("GetLoad")
    async def GetLoad(
        self, request: cache_admin_pb2.GetLoadRequest, context: Any
    ) -> cache_admin_pb2.GetLoadResponse:
        state = self.state
        state.check_admin(context)
        return load_response(await on_engine(state, GetStats()), state.draining)

    @rpc("SubscribeCacheEvents")
    async def SubscribeCacheEvents(
        self, request: cache_admin_pb2.SubscribeCacheEventsRequest, context: Any
    ) -> None:
        self.state.check_admin(context)
        async for event in self.state.events.subscribe(request.after_sequence):
            await context.write(event)
