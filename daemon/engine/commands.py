"""Everything the engine is asked to do, as typed commands (`Command[T]`: result type `T`) applied on
the engine thread; a command carries all it needs, so callers never touch engine state. Session
commands: `namespace=None` means any tenant (admin); else another tenant's session is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from radixd.daemon.engine.sessions import SessionInfo
from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.engine.types import FlushMode, GenerateRequest, Sink
from radixd.radix import CacheListener

T = TypeVar("T")


class Command(Generic[T]):
    """Base of every engine command; `T` is its result type."""


# ---- requests ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Submit(Command[None]):
    """Queue `req`; its outputs, or its rejection, go to `sink` (`Engine.submit` checks it first)."""

    req: GenerateRequest
    sink: Sink


@dataclass(frozen=True)
class Abort(Command[bool]):
    """Abort a request by id (idempotent, also before its submit); -> whether one in flight was aborted."""

    request_id: str


# ---- cache administration ------------------------------------------------------------------------
@dataclass(frozen=True)
class Evict(Command[int]):
    """Evict up to `n_blocks` unlocked cached blocks (LRU); -> blocks freed."""

    n_blocks: int


@dataclass(frozen=True)
class EvictPrefix(Command[int]):
    """Evict the unlocked cached blocks under `tokens` in `namespace`; -> blocks freed."""

    tokens: list[int]
    namespace: str = ""


@dataclass(frozen=True)
class EvictSession(Command[int]):
    """Release a session's lease and evict its own cached context (it stays open); -> blocks freed."""

    session_id: str


@dataclass(frozen=True)
class Flush(Command[int]):
    """Evict every unlocked cached block (see `FlushMode`); -> blocks freed."""

    mode: FlushMode = "evict_unlocked"
    timeout_s: float = 30.0


@dataclass(frozen=True)
class Pin(Command[int]):
    """Exempt the cached prefix `tokens` from eviction; -> tokens pinned (0: nothing cached)."""

    tokens: list[int]
    namespace: str = ""


@dataclass(frozen=True)
class Unpin(Command[None]):
    """Undo a `Pin` of the same prefix (`NotPinned` when it is not pinned)."""

    tokens: list[int]
    namespace: str = ""


@dataclass(frozen=True)
class LookupPrefix(Command[int]):
    """How many leading tokens of `tokens` are cached (no lock, no LRU change)."""

    tokens: list[int]
    namespace: str = ""


@dataclass(frozen=True)
class GetStats(Command[EngineStats]):
    """The engine's statistics (stats.py), what every stats and load report renders."""


@dataclass(frozen=True, eq=False)
class AddCacheListener(Command[None]):
    """Tell `listener` (on the engine thread; it must only hand events on) of every cache change."""

    listener: CacheListener
    replay: bool = False


@dataclass(frozen=True, eq=False)
class RemoveCacheListener(Command[None]):
    """Stop telling `listener`."""

    listener: CacheListener


# ---- sessions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CreateSession(Command[SessionInfo]):
    """Open a session on `tokens` (which must leave room for one reply token); -> its info."""

    namespace: str = ""
    tokens: list[int] = field(default_factory=list)
    ttl_s: float | None = None
    session_id: str | None = None
    max_sessions: int | None = None


@dataclass(frozen=True)
class GetSession(Command[SessionInfo]):
    """A session's info (`UnknownSession` when it is not open in `namespace`)."""

    session_id: str
    namespace: str | None = None


@dataclass(frozen=True)
class ListSessions(Command[list[SessionInfo]]):
    """The open sessions of `namespace` (None: every tenant's)."""

    namespace: str | None = None


@dataclass(frozen=True)
class ForkSession(Command[list[SessionInfo]]):
    """`count` children sharing the session's tokens (and, through the tree, its KV); -> their info."""

    session_id: str
    count: int
    namespace: str | None = None
    child_ids: list[str] | None = None
    max_sessions: int | None = None


@dataclass(frozen=True)
class CloseSession(Command[int]):
    """Close a session; `keep_cached=False` also evicts its own cached context. -> blocks evicted."""

    session_id: str
    namespace: str | None = None
    keep_cached: bool = True
