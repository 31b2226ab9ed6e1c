"""The one request-building core of the blocking and asyncio clients.

`Calls` builds every request (message, bearer metadata, option checks) and says how to convert its
response; a `Call` runs blocking (`run`) or awaited (`run_async`): the clients differ only there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from google.protobuf.message import Message

from radixd_client._pb import cache_admin_pb2, generation_pb2, session_pb2
from radixd_client._pb.cache_admin_pb2_grpc import CacheAdminServiceStub
from radixd_client._pb.generation_pb2_grpc import GenerationServiceStub
from radixd_client._pb.session_pb2_grpc import SessionServiceStub
from radixd_client.options import (
    ConnectOptions,
    EvictTarget,
    GenerateOptions,
    Timeout,
    checked,
    evict_request,
    flush_mode,
)
from radixd_client.types import (
    Completion,
    Event,
    PromptLike,
    SamplingOptions,
    from_response,
    to_prompt,
    to_sampling,
)

R = TypeVar("R")
Metadata = tuple[tuple[str, str], ...]
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_ADDRESS = "127.0.0.1:50051"


def bearer(token: str | None) -> Metadata:
    """gRPC metadata carrying `token` as a bearer credential (empty when no token)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


# Standard grpc.health.v1 wire format, encoded by hand so the client needs no grpcio-health-checking:
# HealthCheckRequest{string service = 1}, HealthCheckResponse{ServingStatus status = 1}.
HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"
HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_health_request(service: str = "") -> bytes:
    data = service.encode()
    if not data:
        return b""
    if len(data) > 127:
        raise ValueError("service name too long for the health check")
    return bytes([0x0A, len(data)]) + data


def decode_health_response(data: bytes) -> str:
    if len(data) >= 2 and data[0] == 0x08:
        return HEALTH_STATUS.get(data[1], f"STATUS_{data[1]}")
    return "UNKNOWN"


def channel_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]


@dataclass(frozen=True)
class Call(Generic[R]):
    """One unary call: a stub method, its request and metadata, and the response's conversion."""

    method: Callable[..., Any]
    request: Message | bytes
    metadata: Metadata
    result: Callable[[Any], R]
    timeout: Timeout = None

    def run(self) -> R:
        """Send it and wait (the blocking client)."""
        return self.result(self.method(self.request, timeout=self.timeout, metadata=self.metadata))

    async def run_async(self) -> R:
        """Send it and await the response (the asyncio client)."""
        response = await cast(
            Awaitable[Any], self.method(self.request, timeout=self.timeout, metadata=self.metadata)
        )
        return self.result(response)


def _field(name: str) -> Callable[[Any], Any]:
    return lambda response: getattr(response, name)


def _same(response: R) -> R:
    return response


def _nothing(response: object) -> None:
    return None


class EventReader:
    """A generation's server stream (the gRPC call object): messages read as `Event`s into `completion`."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.completion = Completion()

    def read(self, msg: object) -> Event:
        event = from_response(msg)
        self.completion.add(event)
        return event


class Calls:
    """The requests of the generation, session and cache-admin services over one channel pair."""

    def __init__(self, channel: Any, admin_channel: Any | None, options: ConnectOptions) -> None:
        self.channel = channel
        self.generation = GenerationServiceStub(channel)
        self.sessions = SessionServiceStub(channel)
        self._admin = CacheAdminServiceStub(admin_channel) if admin_channel else None
        self._md = bearer(options.get("api_key"))
        self._admin_md = bearer(options.get("admin_token"))

    @property
    def admin(self) -> CacheAdminServiceStub:
        if self._admin is None:
            raise ValueError("this client has no admin_address; pass admin_address= (and admin_token=)")
        return self._admin

    # ---- generation ------------------------------------------------------------------------------
    def generate(self, prompt: PromptLike, options: GenerateOptions) -> Any:
        """Start the server stream of one generation (the gRPC call object)."""
        sampling = cast(SamplingOptions, dict(options))
        request_id: str = sampling.pop("request_id", "")  # type: ignore[typeddict-item]
        priority: int = sampling.pop("priority", 0)  # type: ignore[typeddict-item]
        timeout: float | None = sampling.pop("timeout", None)  # type: ignore[typeddict-item]
        req = generation_pb2.GenerateRequest(
            request_id=request_id, prompt=to_prompt(prompt), sampling=to_sampling(sampling), priority=priority
        )
        return self.generation.Generate(req, timeout=timeout, metadata=self._md)

    def abort(self, request_id: str) -> Call[None]:
        return Call(
            self.generation.Abort, generation_pb2.AbortRequest(request_id=request_id), self._md, _nothing
        )

    def tokenize(self, prompt: PromptLike) -> Call[list[int]]:
        req = generation_pb2.TokenizeRequest(prompt=to_prompt(prompt))
        return Call(self.generation.Tokenize, req, self._md, lambda r: list(r.token_ids))

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool) -> Call[str]:
        req = generation_pb2.DetokenizeRequest(token_ids=token_ids, skip_special_tokens=skip_special_tokens)
        return Call(self.generation.Detokenize, req, self._md, _field("text"))

    def model_info(self) -> Call[generation_pb2.GetModelInfoResponse]:
        return Call(self.generation.GetModelInfo, generation_pb2.GetModelInfoRequest(), self._md, _same)

    def health(self, service: str, timeout: float) -> Call[str]:
        """grpc.health.v1 Check, encoded by hand (no metadata: the health service is open)."""
        check = self.channel.unary_unary(HEALTH_CHECK_METHOD)
        return Call(check, encode_health_request(service), (), decode_health_response, timeout)

    # ---- sessions --------------------------------------------------------------------------------
    def create_session(self, context: PromptLike | None, ttl_s: float) -> Call[session_pb2.Session]:
        req = session_pb2.CreateSessionRequest(ttl_s=ttl_s)
        if context is not None:
            req.context.CopyFrom(to_prompt(context))
        return Call(self.sessions.CreateSession, req, self._md, _field("session"))

    def session_generate(
        self, session_id: str, prompt: PromptLike, timeout: Timeout, sampling: SamplingOptions
    ) -> Any:
        """Start the server stream of one session turn (the gRPC call object)."""
        req = session_pb2.SessionServiceGenerateRequest(
            session_id=session_id, prompt=to_prompt(prompt), sampling=to_sampling(sampling)
        )
        return self.sessions.Generate(req, timeout=timeout, metadata=self._md)

    def fork(self, session_id: str, count: int) -> Call[list[session_pb2.Session]]:
        req = session_pb2.ForkSessionRequest(session_id=session_id, count=count)
        return Call(self.sessions.ForkSession, req, self._md, lambda r: list(r.children))

    def get_session(self, session_id: str) -> Call[session_pb2.Session]:
        req = session_pb2.GetSessionRequest(session_id=session_id)
        return Call(self.sessions.GetSession, req, self._md, _field("session"))

    def list_sessions(
        self, page_size: int, page_token: str
    ) -> Call[tuple[list[session_pb2.Session], str | None]]:
        """One page of sessions and the next page's token (None after the last page)."""
        req = session_pb2.ListSessionsRequest(page_size=page_size, page_token=page_token)
        return Call(
            self.sessions.ListSessions, req, self._md, lambda r: (list(r.sessions), r.next_page_token or None)
        )

    def close_session(self, session_id: str, drop_cache: bool) -> Call[int]:
        req = session_pb2.CloseSessionRequest(session_id=session_id, drop_cache=drop_cache)
        return Call(self.sessions.CloseSession, req, self._md, _field("freed_blocks"))

    # ---- cache admin -----------------------------------------------------------------------------
    def evict(self, target: EvictTarget) -> Call[int]:
        checked(target, EvictTarget)
        req = evict_request(
            target.get("num_blocks"),
            target.get("prefix"),
            target.get("session_id"),
            target.get("namespace", ""),
        )
        return Call(self.admin.Evict, req, self._admin_md, _field("evicted_blocks"))

    def flush(self, mode: str, timeout_s: float) -> Call[int]:
        req = cache_admin_pb2.FlushRequest(mode=flush_mode(mode), timeout_s=timeout_s)
        return Call(self.admin.Flush, req, self._admin_md, _field("evicted_blocks"), timeout_s + 10.0)

    def pin(self, prefix: PromptLike, namespace: str) -> Call[int]:
        req = cache_admin_pb2.PinRequest(prefix=to_prompt(prefix), namespace=namespace)
        return Call(self.admin.Pin, req, self._admin_md, _field("pinned_tokens"))

    def unpin(self, prefix: PromptLike, namespace: str) -> Call[None]:
        req = cache_admin_pb2.UnpinRequest(prefix=to_prompt(prefix), namespace=namespace)
        return Call(self.admin.Unpin, req, self._admin_md, _nothing)

    def cache_stats(self) -> Call[cache_admin_pb2.GetCacheStatsResponse]:
        return Call(self.admin.GetCacheStats, cache_admin_pb2.GetCacheStatsRequest(), self._admin_md, _same)

    def lookup_prefix(self, prompt: PromptLike, namespace: str) -> Call[cache_admin_pb2.LookupPrefixResponse]:
        req = cache_admin_pb2.LookupPrefixRequest(prompt=to_prompt(prompt), namespace=namespace)
        return Call(self.admin.LookupPrefix, req, self._admin_md, _same)

    def load(self) -> Call[cache_admin_pb2.GetLoadResponse]:
        return Call(self.admin.GetLoad, cache_admin_pb2.GetLoadRequest(), self._admin_md, _same)

    def cache_events(self, after_sequence: int, timeout: float | None) -> Any:
        """Start the server stream of cache events (the gRPC call object)."""
        req = cache_admin_pb2.SubscribeCacheEventsRequest(after_sequence=after_sequence)
        return self.admin.SubscribeCacheEvents(req, timeout=timeout, metadata=self._admin_md)
