"""asyncio client: `AsyncClient`, `AsyncSession` and `AsyncGenerationStream` (grpc.aio underneath).

    async with AsyncClient("127.0.0.1:50051") as client:
        async for event in client.generate("Hello", max_tokens=8):
            ...

Mirrors the blocking `radixd_client.Client` call for call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Unpack

import grpc
import grpc.aio

from radixd_client._pb import (
    cache_admin_pb2,
    cache_admin_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from radixd_client.client import channel_options
from radixd_client.types import (
    HEALTH_CHECK_METHOD,
    Completion,
    Event,
    PromptLike,
    SamplingOptions,
    bearer,
    decode_health_response,
    encode_health_request,
    evict_request,
    flush_mode,
    from_response,
    to_prompt,
    to_sampling,
)


def make_aio_channel(address: str, root_certificates: bytes | None = None) -> grpc.aio.Channel:
    if root_certificates is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc.aio.secure_channel(address, creds, options=channel_options())
    return grpc.aio.insecure_channel(address, options=channel_options())


class AsyncGenerationStream:
    """An async iterator of `Event`s; `cancel()` stops the stream. `completion` collects as it goes."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self.completion = Completion()

    async def __aiter__(self) -> AsyncIterator[Event]:
        async for msg in self._call:
            event = from_response(msg)
            self.completion.add(event)
            yield event

    async def collect(self) -> Completion:
        async for _ in self:
            pass
        return self.completion

    def cancel(self) -> None:
        self._call.cancel()


@dataclass
class AsyncSession:
    client: AsyncClient
    info: session_pb2.Session

    @property
    def id(self) -> str:
        return self.info.session_id

    def send(
        self, prompt: PromptLike, timeout: float | None = None, **sampling: Unpack[SamplingOptions]
    ) -> AsyncGenerationStream:
        return self.client.session_generate(self.id, prompt, timeout=timeout, **sampling)

    async def fork(self, count: int) -> list[AsyncSession]:
        return await self.client.fork(self.id, count)

    async def refresh(self) -> session_pb2.Session:
        self.info = await self.client.get_session(self.id)
        return self.info

    async def close(self, drop_cache: bool = False) -> int:
        return await self.client.close_session(self.id, drop_cache=drop_cache)


class AsyncClient:
    """asyncio twin of `radixd_client.Client` (same arguments and calls, awaitable)."""

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        api_key: str | None = None,
        admin_address: str | None = None,
        admin_token: str | None = None,
        root_certificates: bytes | None = None,
    ) -> None:
        self.address = address
        self.channel = make_aio_channel(address, root_certificates)
        self._md = bearer(api_key)
        self._admin_md = bearer(admin_token)
        self.generation = generation_pb2_grpc.GenerationServiceStub(self.channel)
        self.sessions = session_pb2_grpc.SessionServiceStub(self.channel)
        self.admin_channel = make_aio_channel(admin_address, root_certificates) if admin_address else None
        self._admin = (
            cache_admin_pb2_grpc.CacheAdminServiceStub(self.admin_channel) if self.admin_channel else None
        )

    async def close(self) -> None:
        await self.channel.close()
        if self.admin_channel is not None:
            await self.admin_channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: PromptLike,
        *,
        request_id: str = "",
        priority: int = 0,
        timeout: float | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> AsyncGenerationStream:
        req = generation_pb2.GenerateRequest(
            request_id=request_id, prompt=to_prompt(prompt), sampling=to_sampling(sampling), priority=priority
        )
        return AsyncGenerationStream(self.generation.Generate(req, timeout=timeout, metadata=self._md))

    async def complete(
        self, prompt: PromptLike, timeout: float | None = None, **sampling: Unpack[SamplingOptions]
    ) -> Completion:
        return await self.generate(prompt, timeout=timeout, **sampling).collect()

    async def abort(self, request_id: str) -> None:
        await self.generation.Abort(generation_pb2.AbortRequest(request_id=request_id), metadata=self._md)

    async def tokenize(self, prompt: PromptLike) -> list[int]:
        req = generation_pb2.TokenizeRequest(prompt=to_prompt(prompt))
        resp = await self.generation.Tokenize(req, metadata=self._md)
        return list(resp.token_ids)

    async def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        req = generation_pb2.DetokenizeRequest(token_ids=token_ids, skip_special_tokens=skip_special_tokens)
        text: str = (await self.generation.Detokenize(req, metadata=self._md)).text
        return text

    async def model_info(self) -> generation_pb2.GetModelInfoResponse:
        resp: generation_pb2.GetModelInfoResponse = await self.generation.GetModelInfo(
            generation_pb2.GetModelInfoRequest(), metadata=self._md
        )
        return resp

    async def health(self, service: str = "", timeout: float = 5.0) -> str:
        check = self.channel.unary_unary(HEALTH_CHECK_METHOD)
        data: bytes = await check(encode_health_request(service), timeout=timeout)
        return decode_health_response(data)

    # ---- sessions --------------------------------------------------------------------------------
    async def create_session(self, context: PromptLike | None = None, ttl_s: float = 0.0) -> AsyncSession:
        req = session_pb2.CreateSessionRequest(ttl_s=ttl_s)
        if context is not None:
            req.context.CopyFrom(to_prompt(context))
        resp = await self.sessions.CreateSession(req, metadata=self._md)
        return AsyncSession(self, resp.session)

    def session_generate(
        self,
        session_id: str,
        prompt: PromptLike,
        timeout: float | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> AsyncGenerationStream:
        req = session_pb2.SessionServiceGenerateRequest(
            session_id=session_id, prompt=to_prompt(prompt), sampling=to_sampling(sampling)
        )
        return AsyncGenerationStream(self.sessions.Generate(req, timeout=timeout, metadata=self._md))

    async def fork(self, session_id: str, count: int) -> list[AsyncSession]:
        req = session_pb2.ForkSessionRequest(session_id=session_id, count=count)
        resp = await self.sessions.ForkSession(req, metadata=self._md)
        return [AsyncSession(self, s) for s in resp.children]

    async def get_session(self, session_id: str) -> session_pb2.Session:
        req = session_pb2.GetSessionRequest(session_id=session_id)
        info: session_pb2.Session = (await self.sessions.GetSession(req, metadata=self._md)).session
        return info

    async def list_sessions(self, page_size: int = 0) -> AsyncIterator[session_pb2.Session]:
        token = ""
        while True:
            req = session_pb2.ListSessionsRequest(page_size=page_size, page_token=token)
            resp = await self.sessions.ListSessions(req, metadata=self._md)
            for s in resp.sessions:
                yield s
            token = resp.next_page_token
            if not token:
                return

    async def close_session(self, session_id: str, drop_cache: bool = False) -> int:
        req = session_pb2.CloseSessionRequest(session_id=session_id, drop_cache=drop_cache)
        freed: int = (await self.sessions.CloseSession(req, metadata=self._md)).freed_blocks
        return freed

    # ---- cache admin -----------------------------------------------------------------------------
    @property
    def admin(self) -> cache_admin_pb2_grpc.CacheAdminServiceStub:
        if self._admin is None:
            raise ValueError("this client has no admin_address; pass admin_address= (and admin_token=)")
        return self._admin

    async def evict(
        self,
        *,
        num_blocks: int | None = None,
        prefix: PromptLike | None = None,
        session_id: str | None = None,
        namespace: str = "",
    ) -> int:
        req = evict_request(num_blocks, prefix, session_id, namespace)
        evicted: int = (await self.admin.Evict(req, metadata=self._admin_md)).evicted_blocks
        return evicted

    async def flush(self, mode: str = "evict_unlocked", timeout_s: float = 30.0) -> int:
        req = cache_admin_pb2.FlushRequest(mode=flush_mode(mode), timeout_s=timeout_s)
        resp = await self.admin.Flush(req, timeout=timeout_s + 10.0, metadata=self._admin_md)
        evicted: int = resp.evicted_blocks
        return evicted

    async def pin(self, prefix: PromptLike, namespace: str = "") -> int:
        req = cache_admin_pb2.PinRequest(prefix=to_prompt(prefix), namespace=namespace)
        pinned: int = (await self.admin.Pin(req, metadata=self._admin_md)).pinned_tokens
        return pinned

    async def unpin(self, prefix: PromptLike, namespace: str = "") -> None:
        req = cache_admin_pb2.UnpinRequest(prefix=to_prompt(prefix), namespace=namespace)
        await self.admin.Unpin(req, metadata=self._admin_md)

    async def cache_stats(self) -> cache_admin_pb2.GetCacheStatsResponse:
        resp: cache_admin_pb2.GetCacheStatsResponse = await self.admin.GetCacheStats(
            cache_admin_pb2.GetCacheStatsRequest(), metadata=self._admin_md
        )
        return resp

    async def lookup_prefix(
        self, prompt: PromptLike, namespace: str = ""
    ) -> cache_admin_pb2.LookupPrefixResponse:
        req = cache_admin_pb2.LookupPrefixRequest(prompt=to_prompt(prompt), namespace=namespace)
        resp: cache_admin_pb2.LookupPrefixResponse = await self.admin.LookupPrefix(
            req, metadata=self._admin_md
        )
        return resp

    async def load(self) -> cache_admin_pb2.GetLoadResponse:
        resp: cache_admin_pb2.GetLoadResponse = await self.admin.GetLoad(
            cache_admin_pb2.GetLoadRequest(), metadata=self._admin_md
        )
        return resp

    async def cache_events(
        self, after_sequence: int = 0, timeout: float | None = None
    ) -> AsyncIterator[cache_admin_pb2.SubscribeCacheEventsResponse]:
        req = cache_admin_pb2.SubscribeCacheEventsRequest(after_sequence=after_sequence)
        async for event in self.admin.SubscribeCacheEvents(req, timeout=timeout, metadata=self._admin_md):
            yield event


__all__ = ["AsyncClient", "AsyncGenerationStream", "AsyncSession"]
