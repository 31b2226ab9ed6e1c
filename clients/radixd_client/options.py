"""The clients' keyword arguments and their checks: connection, generate and evict options, flush modes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, TypeVar

from radixd_client._pb import cache_admin_pb2
from radixd_client.types import PromptLike, SamplingOptions, to_prompt

K = TypeVar("K", bound=Mapping[str, object])
Timeout = float | None
"""A call's deadline in seconds (None: none)."""


FLUSH_MODES: dict[str, cache_admin_pb2.FlushMode] = {
    "evict_unlocked": cache_admin_pb2.FLUSH_MODE_EVICT_UNLOCKED,
    "refuse_if_busy": cache_admin_pb2.FLUSH_MODE_REFUSE_IF_BUSY,
    "wait_for_idle": cache_admin_pb2.FLUSH_MODE_WAIT_FOR_IDLE,
}


class ConnectOptions(TypedDict, total=False):
    """Keyword arguments of `Client` and `AsyncClient` besides the address: bearer tokens for the public
    port (`api_key`, the tenant) and the admin port; `root_certificates` (PEM) switches to TLS."""

    api_key: str | None
    admin_address: str | None
    admin_token: str | None
    root_certificates: bytes | None


class GenerateOptions(SamplingOptions, total=False):
    """Keyword arguments of `generate`: the request's id ("" = the daemon picks one), its scheduling
    priority, the call's deadline in seconds, and the sampling options."""

    request_id: str
    priority: int
    timeout: Timeout


class EvictTarget(TypedDict, total=False):
    """Keyword arguments of `evict`: exactly one of ``num_blocks`` (LRU blocks), ``prefix`` (a prompt's
    cached continuation) or ``session_id`` (a session's context), within ``namespace`` ("" = default)."""

    num_blocks: int | None
    prefix: PromptLike | None
    session_id: str | None
    namespace: str


def checked(options: K, kind: type[K]) -> K:
    """``options``, or TypeError naming a keyword argument that ``kind`` (a TypedDict) lacks."""
    unknown = sorted(set(options) - kind.__required_keys__ - kind.__optional_keys__)  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    return options


def flush_mode(mode: str) -> cache_admin_pb2.FlushMode:
    """The wire FlushMode for a mode name."""
    if mode not in FLUSH_MODES:
        raise ValueError(f"flush mode must be one of {sorted(FLUSH_MODES)}, got {mode!r}")
    return FLUSH_MODES[mode]


def evict_request(
    num_blocks: int | None, prefix: PromptLike | None, session_id: str | None, namespace: str
) -> cache_admin_pb2.EvictRequest:
    """The EvictRequest for exactly one of num_blocks / prefix / session_id."""
    chosen = [x is not None for x in (num_blocks, prefix, session_id)]
    if sum(chosen) != 1:
        raise ValueError("evict needs exactly one of num_blocks=, prefix= or session_id=")
    req = cache_admin_pb2.EvictRequest(namespace=namespace)
    if num_blocks is not None:
        req.num_blocks = num_blocks
    elif prefix is not None:
        req.prefix.CopyFrom(to_prompt(prefix))
    elif session_id is not None:
        req.session_id = session_id
    return req
