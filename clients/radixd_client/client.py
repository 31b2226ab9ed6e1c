"""Synchronous client: `Client`, `Session` and `GenerationStream`.

    client = Client("127.0.0.1:50051", admin_address="127.0.0.1:50052", admin_token="...")
    print(client.generate("The capital of France is", max_tokens=8).collect().text)
    session = client.create_session(context="You are terse.")
    for event in session.send("Hello!"):
        ...

Errors are `grpc.RpcError` with the daemon's status code and a message saying what to fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, Unpack, cast

import grpc

from radixd_client._pb import (
    cache_admin_pb2,
    cache_admin_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from radixd_client.types import (
    HEALTH_CHECK_METHOD,
    Completion,
    Event,
    PromptLike,
    SamplingOptions,
    bearer,
    collect,
    decode_health_response,
    encode_health_request,
    evict_request,
    flush_mode,
    from_response,
    to_prompt,
    to_sampling,
)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def channel_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]


def make_channel(address: str, root_certificates: bytes | None = None) -> grpc.Channel:
    """An insecure channel, or a TLS one when `root_certificates` (PEM) are given."""
    if root_certificates is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc.secure_channel(address, creds, options=channel_options())
    return grpc.insecure_channel(address, options=channel_options())


class CacheEventStream(Protocol):
    """A server stream of cache events (the gRPC call object): iterable and cancellable."""

    def __iter__(self) -> Iterator[cache_admin_pb2.SubscribeCacheEventsResponse]: ...

    def __next__(self) -> cache_admin_pb2.SubscribeCacheEventsResponse: ...

    def cancel(self) -> bool: ...


class GenerationStream:
    """An iterator of `Event`s over one server stream; `cancel()` stops it (the daemon frees its KV).

    After iteration, `completion` holds the collected result.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self.completion = Completion()

    def __iter__(self) -> Iterator[Event]:
        for msg in self._call:
            event = from_response(msg)
            self.completion.add(event)
            yield event

    def collect(self) -> Completion:
        """Drain the stream and return the collected completion."""
        for _ in self:
            pass
        return self.completion

    def cancel(self) -> None:
        self._call.cancel()


@dataclass
class Session:
    """A server-side conversation; `send` runs one turn whose reply is appended to the context."""

    client: Client
    info: session_pb2.Session

    @property
    def id(self) -> str:
        return self.info.session_id

    def send(
        self, prompt: PromptLike, timeout: float | None = None, **sampling: Unpack[SamplingOptions]
    ) -> GenerationStream:
        return self.client.session_generate(self.id, prompt, timeout=timeout, **sampling)

    def fork(self, count: int) -> list[Session]:
        return self.client.fork(self.id, count)

    def refresh(self) -> session_pb2.Session:
        self.info = self.client.get_session(self.id)
        return self.info

    def close(self, drop_cache: bool = False) -> int:
        return self.client.close_session(self.id, drop_cache=drop_cache)


class Client:
    """Blocking client for the generation, session and (with `admin_address`) cache-admin services.

    `api_key` is sent as `authorization: Bearer <key>` on the public port (it selects the tenant);
    `admin_token` likewise on the admin port. `root_certificates` (PEM) switches both channels to TLS.
    """

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
        self.channel = make_channel(address, root_certificates)
        self._md = bearer(api_key)
        self._admin_md = bearer(admin_token)
        self.generation = generation_pb2_grpc.GenerationServiceStub(self.channel)
        self.sessions = session_pb2_grpc.SessionServiceStub(self.channel)
        self.admin_channel = make_channel(admin_address, root_certificates) if admin_address else None
        self._admin = (
            cache_admin_pb2_grpc.CacheAdminServiceStub(self.admin_channel) if self.admin_channel else None
        )

    def close(self) -> None:
        self.channel.close()
        if self.admin_channel is not None:
            self.admin_channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: PromptLike,
        *,
        request_id: str = "",
        priority: int = 0,
        timeout: float | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> GenerationStream:
        req = generation_pb2.GenerateRequest(
            request_id=request_id, prompt=to_prompt(prompt), sampling=to_sampling(sampling), priority=priority
        )
        return GenerationStream(self.generation.Generate(req, timeout=timeout, metadata=self._md))

    def complete(
        self, prompt: PromptLike, timeout: float | None = None, **sampling: Unpack[SamplingOptions]
    ) -> Completion:
        """Generate and collect the whole stream."""
        return collect(self.generate(prompt, timeout=timeout, **sampling))

    def abort(self, request_id: str) -> None:
        self.generation.Abort(generation_pb2.AbortRequest(request_id=request_id), metadata=self._md)

    def tokenize(self, prompt: PromptLike) -> list[int]:
        resp = self.generation.Tokenize(
            generation_pb2.TokenizeRequest(prompt=to_prompt(prompt)), metadata=self._md
        )
        return list(resp.token_ids)

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        req = generation_pb2.DetokenizeRequest(token_ids=token_ids, skip_special_tokens=skip_special_tokens)
        text: str = self.generation.Detokenize(req, metadata=self._md).text
        return text

    def model_info(self) -> generation_pb2.GetModelInfoResponse:
        resp: generation_pb2.GetModelInfoResponse = self.generation.GetModelInfo(
            generation_pb2.GetModelInfoRequest(), metadata=self._md
        )
        return resp

    def health(self, service: str = "", timeout: float = 5.0) -> str:
        """The grpc.health.v1 status of `service` ("" = the whole server), e.g. "SERVING"."""
        check = self.channel.unary_unary(HEALTH_CHECK_METHOD)
        data: bytes = check(encode_health_request(service), timeout=timeout)
        return decode_health_response(data)

    # ---- sessions --------------------------------------------------------------------------------
    def create_session(self, context: PromptLike | None = None, ttl_s: float = 0.0) -> Session:
        req = session_pb2.CreateSessionRequest(ttl_s=ttl_s)
        if context is not None:
            req.context.CopyFrom(to_prompt(context))
        return Session(self, self.sessions.CreateSession(req, metadata=self._md).session)

    def session_generate(
        self,
        session_id: str,
        prompt: PromptLike,
        timeout: float | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> GenerationStream:
        req = session_pb2.SessionServiceGenerateRequest(
            session_id=session_id, prompt=to_prompt(prompt), sampling=to_sampling(sampling)
        )
        return GenerationStream(self.sessions.Generate(req, timeout=timeout, metadata=self._md))

    def fork(self, session_id: str, count: int) -> list[Session]:
        req = session_pb2.ForkSessionRequest(session_id=session_id, count=count)
        return [Session(self, s) for s in self.sessions.ForkSession(req, metadata=self._md).children]

    def get_session(self, session_id: str) -> session_pb2.Session:
        resp = self.sessions.GetSession(
            session_pb2.GetSessionRequest(session_id=session_id), metadata=self._md
        )
        info: session_pb2.Session = resp.session
        return info

    def list_sessions(self, page_size: int = 0) -> Iterator[session_pb2.Session]:
        """Every open session of this tenant, fetching pages as needed."""
        token = ""
        while True:
            req = session_pb2.ListSessionsRequest(page_size=page_size, page_token=token)
            resp = self.sessions.ListSessions(req, metadata=self._md)
            yield from resp.sessions
            token = resp.next_page_token
            if not token:
                return

    def close_session(self, session_id: str, drop_cache: bool = False) -> int:
        req = session_pb2.CloseSessionRequest(session_id=session_id, drop_cache=drop_cache)
        freed: int = self.sessions.CloseSession(req, metadata=self._md).freed_blocks
        return freed

    # ---- cache admin -----------------------------------------------------------------------------
    @property
    def admin(self) -> cache_admin_pb2_grpc.CacheAdminServiceStub:
        if self._admin is None:
            raise ValueError("this client has no admin_address; pass admin_address= (and admin_token=)")
        return self._admin

    def evict(
        self,
        *,
        num_blocks: int | None = None,
        prefix: PromptLike | None = None,
        session_id: str | None = None,
        namespace: str = "",
    ) -> int:
        """Evict N LRU blocks, a prefix's cached continuation or a session's context; returns blocks freed."""
        evicted: int = self.admin.Evict(
            evict_request(num_blocks, prefix, session_id, namespace), metadata=self._admin_md
        ).evicted_blocks
        return evicted

    def flush(self, mode: str = "evict_unlocked", timeout_s: float = 30.0) -> int:
        """mode: "evict_unlocked" | "refuse_if_busy" | "wait_for_idle". Returns blocks freed."""
        req = cache_admin_pb2.FlushRequest(mode=flush_mode(mode), timeout_s=timeout_s)
        evicted: int = self.admin.Flush(req, timeout=timeout_s + 10.0, metadata=self._admin_md).evicted_blocks
        return evicted

    def pin(self, prefix: PromptLike, namespace: str = "") -> int:
        req = cache_admin_pb2.PinRequest(prefix=to_prompt(prefix), namespace=namespace)
        pinned: int = self.admin.Pin(req, metadata=self._admin_md).pinned_tokens
        return pinned

    def unpin(self, prefix: PromptLike, namespace: str = "") -> None:
        self.admin.Unpin(
            cache_admin_pb2.UnpinRequest(prefix=to_prompt(prefix), namespace=namespace),
            metadata=self._admin_md,
        )

    def cache_stats(self) -> cache_admin_pb2.GetCacheStatsResponse:
        resp: cache_admin_pb2.GetCacheStatsResponse = self.admin.GetCacheStats(
            cache_admin_pb2.GetCacheStatsRequest(), metadata=self._admin_md
        )
        return resp

    def lookup_prefix(self, prompt: PromptLike, namespace: str = "") -> cache_admin_pb2.LookupPrefixResponse:
        req = cache_admin_pb2.LookupPrefixRequest(prompt=to_prompt(prompt), namespace=namespace)
        resp: cache_admin_pb2.LookupPrefixResponse = self.admin.LookupPrefix(req, metadata=self._admin_md)
        return resp

    def load(self) -> cache_admin_pb2.GetLoadResponse:
        resp: cache_admin_pb2.GetLoadResponse = self.admin.GetLoad(
            cache_admin_pb2.GetLoadRequest(), metadata=self._admin_md
        )
        return resp

    def cache_events(self, after_sequence: int = 0, timeout: float | None = None) -> CacheEventStream:
        """Stream the cache's stored / removed / cleared events (after ``after_sequence``, 0 = new ones
        only); iterate it, and ``cancel()`` it from any thread to stop."""
        req = cache_admin_pb2.SubscribeCacheEventsRequest(after_sequence=after_sequence)
        call = self.admin.SubscribeCacheEvents(req, timeout=timeout, metadata=self._admin_md)
        return cast(CacheEventStream, call)


__all__ = ["CacheEventStream", "Client", "GenerationStream", "Session"]
