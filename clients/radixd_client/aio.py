"""asyncio client: `AsyncClient`, `AsyncSession` and `AsyncGenerationStream`, the blocking client's
twins call for call (grpc.aio underneath, the same request core).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Unpack

import grpc
import grpc.aio

from radixd_client import core
from radixd_client._pb import cache_admin_pb2, cache_admin_pb2_grpc, generation_pb2, session_pb2
from radixd_client.options import ConnectOptions, EvictTarget, GenerateOptions, Timeout, checked
from radixd_client.types import Completion, Event, PromptLike, SamplingOptions


def make_aio_channel(address: str, root_certificates: bytes | None = None) -> grpc.aio.Channel:
    """`radixd_client.client.make_channel` for grpc.aio."""
    if root_certificates is None:
        return grpc.aio.insecure_channel(address, options=core.channel_options())
    creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    return grpc.aio.secure_channel(address, creds, options=core.channel_options())


class AsyncGenerationStream:
    """An async iterator of `Event`s; `cancel()` stops the stream. `completion` collects as it goes."""

    def __init__(self, call: Any) -> None:
        self._events = core.EventReader(call)
        self.completion = self._events.completion

    def cancel(self) -> None:
        self._events.call.cancel()

    async def __aiter__(self) -> AsyncIterator[Event]:
        async for msg in self._events.call:
            yield self._events.read(msg)

    async def collect(self) -> Completion:
        async for _ in self:
            pass
        return self.completion


@dataclass
class AsyncSession:
    """asyncio twin of `radixd_client.Session`."""

    client: AsyncClient
    info: session_pb2.Session

    def send(
        self, prompt: PromptLike, timeout: Timeout = None, **sampling: Unpack[SamplingOptions]
    ) -> AsyncGenerationStream:
        return self.client.session_generate(self.id, prompt, timeout=timeout, **sampling)

    @property
    def id(self) -> str:
        return self.info.session_id

    async def fork(self, count: int) -> list[AsyncSession]:
        return await self.client.fork(self.id, count)

    async def refresh(self) -> session_pb2.Session:
        self.info = await self.client.get_session(self.id)
        return self.info

    async def close(self, drop_cache: bool = False) -> int:
        return await self.client.close_session(self.id, drop_cache=drop_cache)


class AsyncClient:
    """asyncio twin of `radixd_client.Client` (same arguments and calls, awaitable)."""

    def __init__(self, address: str = core.DEFAULT_ADDRESS, **options: Unpack[ConnectOptions]) -> None:
        root = checked(options, ConnectOptions).get("root_certificates")
        admin_address = options.get("admin_address")
        self.address = address
        self.channel = make_aio_channel(address, root)
        self.admin_channel = None if not admin_address else make_aio_channel(admin_address, root)
        self._calls = core.Calls(self.channel, self.admin_channel, options)
        self.generation, self.sessions = self._calls.generation, self._calls.sessions

    async def close(self) -> None:
        await self.channel.close()
        if self.admin_channel is not None:
            await self.admin_channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- generation ------------------------------------------------------------------------------
    def generate(self, prompt: PromptLike, **options: Unpack[GenerateOptions]) -> AsyncGenerationStream:
        return AsyncGenerationStream(self._calls.generate(prompt, options))

    async def complete(
        self, prompt: PromptLike, timeout: Timeout = None, **sampling: Unpack[SamplingOptions]
    ) -> Completion:
        return await self.generate(prompt, timeout=timeout, **sampling).collect()

    async def abort(self, request_id: str) -> None:
        await self._calls.abort(request_id).run_async()

    async def tokenize(self, prompt: PromptLike) -> list[int]:
        return await self._calls.tokenize(prompt).run_async()

    async def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return await self._calls.detokenize(token_ids, skip_special_tokens).run_async()

    async def model_info(self) -> generation_pb2.GetModelInfoResponse:
        return await self._calls.model_info().run_async()

    async def health(self, service: str = "", timeout: float = 5.0) -> str:
        return await self._calls.health(service, timeout).run_async()

    # ---- sessions --------------------------------------------------------------------------------
    async def create_session(self, context: PromptLike | None = None, ttl_s: float = 0.0) -> AsyncSession:
        return AsyncSession(self, await self._calls.create_session(context, ttl_s).run_async())

    def session_generate(
        self, session_id: str, prompt: PromptLike, timeout: Timeout = None, **options: Unpack[SamplingOptions]
    ) -> AsyncGenerationStream:
        return AsyncGenerationStream(self._calls.session_generate(session_id, prompt, timeout, options))

    async def fork(self, session_id: str, count: int) -> list[AsyncSession]:
        return [AsyncSession(self, s) for s in await self._calls.fork(session_id, count).run_async()]

    async def get_session(self, session_id: str) -> session_pb2.Session:
        return await self._calls.get_session(session_id).run_async()

    async def list_sessions(self, page_size: int = 0) -> AsyncIterator[session_pb2.Session]:
        token: str | None = ""
        while token is not None:
            page, token = await self._calls.list_sessions(page_size, token).run_async()
            for s in page:
                yield s

    async def close_session(self, session_id: str, drop_cache: bool = False) -> int:
        return await self._calls.close_session(session_id, drop_cache).run_async()

    # ---- cache admin -----------------------------------------------------------------------------
    @property
    def admin(self) -> cache_admin_pb2_grpc.CacheAdminServiceStub:
        return self._calls.admin

    async def evict(self, **target: Unpack[EvictTarget]) -> int:
        return await self._calls.evict(target).run_async()

    async def flush(self, mode: str = "evict_unlocked", timeout_s: float = 30.0) -> int:
        return await self._calls.flush(mode, timeout_s).run_async()

    async def pin(self, prefix: PromptLike, namespace: str = "") -> int:
        return await self._calls.pin(prefix, namespace).run_async()

    async def unpin(self, prefix: PromptLike, namespace: str = "") -> None:
        await self._calls.unpin(prefix, namespace).run_async()

    async def cache_stats(self) -> cache_admin_pb2.GetCacheStatsResponse:
        return await self._calls.cache_stats().run_async()

    async def lookup_prefix(
        self, prompt: PromptLike, namespace: str = ""
    ) -> cache_admin_pb2.LookupPrefixResponse:
        return await self._calls.lookup_prefix(prompt, namespace).run_async()

    async def load(self) -> cache_admin_pb2.GetLoadResponse:
        return await self._calls.load().run_async()

    async def cache_events(
        self, after_sequence: int = 0, timeout: Timeout = None
    ) -> AsyncIterator[cache_admin_pb2.SubscribeCacheEventsResponse]:
        async for event in self._calls.cache_events(after_sequence, timeout):
            yield event


__all__ = ["AsyncClient", "AsyncGenerationStream", "AsyncSession"]
