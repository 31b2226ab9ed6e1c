"""Blocking client: `Client`, `Session` and `GenerationStream`, over the request core (core.py).

    client = Client("127.0.0.1:50051", admin_address="127.0.0.1:50052", admin_token="...")
    print(client.generate("The capital of France is", max_tokens=8).collect().text)

Errors are `grpc.RpcError` with the daemon's status code and a message saying what to fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, Unpack, cast

import grpc

from radixd_client import core
from radixd_client._pb import cache_admin_pb2, cache_admin_pb2_grpc, generation_pb2, session_pb2
from radixd_client.core import MAX_MESSAGE_BYTES, channel_options
from radixd_client.options import ConnectOptions, EvictTarget, GenerateOptions, Timeout, checked
from radixd_client.types import Completion, Event, PromptLike, SamplingOptions, collect


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
        self._events = core.EventReader(call)
        self.completion = self._events.completion

    def __iter__(self) -> Iterator[Event]:
        return map(self._events.read, self._events.call)

    def collect(self) -> Completion:
        """Drain the stream and return the collected completion."""
        for _ in self:
            pass
        return self.completion

    def cancel(self) -> None:
        self._events.call.cancel()


@dataclass
class Session:
    """A server-side conversation; `send` runs one turn whose reply is appended to the context."""

    client: Client
    info: session_pb2.Session

    @property
    def id(self) -> str:
        return self.info.session_id

    def send(
        self, prompt: PromptLike, timeout: Timeout = None, **sampling: Unpack[SamplingOptions]
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

    Keyword arguments: see `ConnectOptions` (api_key, admin_address, admin_token, root_certificates).
    """

    def __init__(self, address: str = core.DEFAULT_ADDRESS, **options: Unpack[ConnectOptions]) -> None:
        checked(options, ConnectOptions)
        admin_address, root = options.get("admin_address"), options.get("root_certificates")
        self.address = address
        self.channel = make_channel(address, root)
        self.admin_channel = make_channel(admin_address, root) if admin_address else None
        self._calls = core.Calls(self.channel, self.admin_channel, options)
        self.generation = self._calls.generation
        self.sessions = self._calls.sessions

    def close(self) -> None:
        self.channel.close()
        if self.admin_channel is not None:
            self.admin_channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- generation ------------------------------------------------------------------------------
    def generate(self, prompt: PromptLike, **options: Unpack[GenerateOptions]) -> GenerationStream:
        return GenerationStream(self._calls.generate(prompt, options))

    def complete(
        self, prompt: PromptLike, timeout: Timeout = None, **sampling: Unpack[SamplingOptions]
    ) -> Completion:
        """Generate and collect the whole stream."""
        return collect(self.generate(prompt, timeout=timeout, **sampling))

    def abort(self, request_id: str) -> None:
        self._calls.abort(request_id).run()

    def tokenize(self, prompt: PromptLike) -> list[int]:
        return self._calls.tokenize(prompt).run()

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._calls.detokenize(token_ids, skip_special_tokens).run()

    def model_info(self) -> generation_pb2.GetModelInfoResponse:
        return self._calls.model_info().run()

    def health(self, service: str = "", timeout: float = 5.0) -> str:
        """The grpc.health.v1 status of `service` ("" = the whole server), e.g. "SERVING"."""
        return self._calls.health(service, timeout).run()

    # ---- sessions --------------------------------------------------------------------------------
    def create_session(self, context: PromptLike | None = None, ttl_s: float = 0.0) -> Session:
        return Session(self, self._calls.create_session(context, ttl_s).run())

    def session_generate(
        self, session_id: str, prompt: PromptLike, timeout: Timeout = None, **options: Unpack[SamplingOptions]
    ) -> GenerationStream:
        return GenerationStream(self._calls.session_generate(session_id, prompt, timeout, options))

    def fork(self, session_id: str, count: int) -> list[Session]:
        return [Session(self, s) for s in self._calls.fork(session_id, count).run()]

    def get_session(self, session_id: str) -> session_pb2.Session:
        return self._calls.get_session(session_id).run()

    def list_sessions(self, page_size: int = 0) -> Iterator[session_pb2.Session]:
        """Every open session of this tenant, fetching pages as needed."""
        token: str | None = ""
        while token is not None:
            page, token = self._calls.list_sessions(page_size, token).run()
            yield from page

    def close_session(self, session_id: str, drop_cache: bool = False) -> int:
        return self._calls.close_session(session_id, drop_cache).run()

    # ---- cache admin -----------------------------------------------------------------------------
    @property
    def admin(self) -> cache_admin_pb2_grpc.CacheAdminServiceStub:
        """The cache-admin stub (ValueError without `admin_address`)."""
        return self._calls.admin

    def evict(self, **target: Unpack[EvictTarget]) -> int:
        """Evict N LRU blocks, a prefix's cached continuation or a session's context; returns blocks freed."""
        return self._calls.evict(target).run()

    def flush(self, mode: str = "evict_unlocked", timeout_s: float = 30.0) -> int:
        """mode: "evict_unlocked" | "refuse_if_busy" | "wait_for_idle". Returns blocks freed."""
        return self._calls.flush(mode, timeout_s).run()

    def pin(self, prefix: PromptLike, namespace: str = "") -> int:
        return self._calls.pin(prefix, namespace).run()

    def unpin(self, prefix: PromptLike, namespace: str = "") -> None:
        self._calls.unpin(prefix, namespace).run()

    def cache_stats(self) -> cache_admin_pb2.GetCacheStatsResponse:
        return self._calls.cache_stats().run()

    def lookup_prefix(self, prompt: PromptLike, namespace: str = "") -> cache_admin_pb2.LookupPrefixResponse:
        return self._calls.lookup_prefix(prompt, namespace).run()

    def load(self) -> cache_admin_pb2.GetLoadResponse:
        return self._calls.load().run()

    def cache_events(self, after_sequence: int = 0, timeout: Timeout = None) -> CacheEventStream:
        """Stream the cache's stored / removed / cleared events (after ``after_sequence``, 0 = new ones
        only); iterate it, and ``cancel()`` it from any thread to stop."""
        return cast(CacheEventStream, self._calls.cache_events(after_sequence, timeout))


__all__ = [
    "MAX_MESSAGE_BYTES",
    "CacheEventStream",
    "Client",
    "GenerationStream",
    "Session",
    "channel_options",
]
