"""Sessions: a conversation or agent's tokens plus a lease that keeps its prefix resident.

A turn prompts with the session's tokens + its own; ending well advances the session and re-locks the
new path. The lease lapses `ttl_s` after last use (the prefix stays cached, evictable). Forks get their
own leases on the same path, so copy-on-write comes from the tree."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.errors import EngineError, InvalidRequest, TooManySessions, UnknownSession
from radixd.radix import KeptWindow, Lease, WindowStore


class SessionBusy(EngineError):
    """A session runs one turn at a time."""

    code = "failed_precondition"


@dataclass
class Session:
    session_id: str
    namespace: str
    tokens: list[int]
    ttl_s: float
    expires_at: float
    created_at: float
    parent_id: str | None = None
    lease: Lease | None = None
    window: KeptWindow | None = None  # sliding layers: the kept window at its end, held like the lease
    resident_tokens: int = 0
    turns: int = 0
    busy_with: str | None = None


@dataclass(frozen=True)
class SessionInfo:
    """A snapshot of a session for callers on other threads."""

    session_id: str
    namespace: str
    num_tokens: int
    resident_tokens: int  # tokens locked in the cache by the session's lease
    expires_in_s: float
    turns: int
    busy: bool
    parent_id: str | None
    tokens: tuple[int, ...]


class SessionManager:
    """All open sessions (engine thread only)."""

    def __init__(self, kv: KVManager, default_ttl_s: float) -> None:
        self.kv = kv
        self.default_ttl_s = default_ttl_s
        self._sessions: dict[str, Session] = {}
        self._ids = itertools.count(1)
        self.shed = 0  # leases dropped early under memory pressure

    def __len__(self) -> int:
        return len(self._sessions)

    def _get(self, session_id: str) -> Session:
        s = self._sessions.get(session_id)
        if s is None:
            raise UnknownSession(f"no open session {session_id!r}; create it first (or it was closed)")
        return s

    def info(self, s: Session, now: float | None = None) -> SessionInfo:
        now = time.monotonic() if now is None else now
        return SessionInfo(
            s.session_id,
            s.namespace,
            len(s.tokens),
            s.resident_tokens if s.lease is not None else 0,
            max(0.0, s.expires_at - now) if s.lease is not None else 0.0,
            s.turns,
            s.busy_with is not None,
            s.parent_id,
            tuple(s.tokens),
        )

    def _relock(self, s: Session, now: float) -> None:
        """Lock the session's cached path (the new lease first, so shared nodes stay locked)."""
        hit = self.kv.match(s.tokens, s.namespace)
        self._unlock(s)
        s.lease, s.window = hit.lease, hit.window  # the hit's holds pass to the session
        hit.lease = hit.window = None
        s.resident_tokens = hit.num_tokens
        s.expires_at = now + s.ttl_s

    def _unlock(self, s: Session) -> None:
        """Drop the session's lease (and the hold on its kept window); the prefix stays cached, evictable."""
        self.kv.drop_lease(s.lease)
        s.lease = None
        if s.window is not None:
            WindowStore.release_window(s.window)
            s.window = None

    # ---- operations ------------------------------------------------------------------------------
    def create(
        self,
        session_id: str | None = None,
        namespace: str = "",
        tokens: list[int] | None = None,
        ttl_s: float | None = None,
        parent_id: str | None = None,
    ) -> SessionInfo:
        sid = session_id or f"sess-{next(self._ids)}"
        if sid in self._sessions:
            raise InvalidRequest(f"session {sid!r} already exists; pick another id")
        ttl = self.default_ttl_s if ttl_s is None else ttl_s
        if ttl <= 0:
            raise InvalidRequest(f"session ttl must be > 0 seconds, got {ttl}")
        now = time.monotonic()
        s = Session(sid, namespace, list(tokens or []), ttl, now + ttl, now, parent_id)
        self._sessions[sid] = s
        self._relock(s, now)
        return self.info(s, now)

    def get(self, session_id: str, namespace: str | None = None) -> SessionInfo:
        """The session's info; with `namespace`, a session of another tenant reads as unknown."""
        s = self._get(session_id)
        if namespace is not None and s.namespace != namespace:
            raise UnknownSession(f"no open session {session_id!r}; create it first (or it was closed)")
        return self.info(s)

    def check_room(self, k: int, limit: int | None) -> None:
        """Refuse `k` more sessions when `limit` (None: no limit) would be exceeded."""
        if limit is not None and len(self._sessions) + k > limit:
            raise TooManySessions(
                f"{len(self._sessions)} sessions are open and at most {limit} may be; close sessions you"
                " no longer use (CloseSession) or retry later"
            )

    def all(self, namespace: str | None = None) -> list[SessionInfo]:
        now = time.monotonic()
        return [
            self.info(s, now)
            for s in self._sessions.values()
            if namespace is None or s.namespace == namespace
        ]

    def fork(self, session_id: str, k: int, child_ids: list[str] | None = None) -> list[SessionInfo]:
        """k children sharing the parent's tokens (and, through the tree, its KV)."""
        if k < 1:
            raise InvalidRequest(f"fork needs k >= 1, got {k}")
        if child_ids is not None and len(child_ids) != k:
            raise InvalidRequest(f"got {len(child_ids)} child ids for k={k}")
        parent = self._get(session_id)
        ids = child_ids or [f"{session_id}.{i}" for i in range(k)]
        return [self.create(cid, parent.namespace, parent.tokens, parent.ttl_s, session_id) for cid in ids]

    def close(self, session_id: str, keep_cached: bool = True) -> int:
        """Close a session; -> blocks evicted (`keep_cached=False`: its own node, never shared ancestors)."""
        s = self._sessions.pop(session_id, None)
        if s is None:
            raise UnknownSession(f"no open session {session_id!r}")
        self._unlock(s)
        return 0 if keep_cached else self._drop_cached(s)

    def evict_cached(self, session_id: str) -> int:
        """Release the session's lease and evict its own cached context (it stays open); -> blocks evicted."""
        s = self._get(session_id)
        self.release_lease(session_id)
        return self._drop_cached(s)

    def _drop_cached(self, s: Session) -> int:
        if not s.tokens:
            return 0
        # Evict the node holding the last cached token (shared ancestors stay), by the cached prefix:
        # the token list usually runs one past the cache.
        n = self.kv.cached_len(s.tokens, s.namespace)
        return self.kv.evict_prefix(s.tokens[:n], s.namespace, count_evicted=False) if n else 0

    def release_lease(self, session_id: str) -> None:
        """Drop the session's lock early (memory pressure); the session stays open."""
        s = self._get(session_id)
        self._unlock(s)

    # ---- turns -----------------------------------------------------------------------------------
    def begin_turn(self, req: GenerateRequest) -> list[int]:
        """Mark the session busy; -> the full prompt (session tokens + the turn's tokens)."""
        s = self._get(req.session_id or "")
        if s.busy_with is not None:
            raise SessionBusy(f"session {s.session_id!r} is busy with request {s.busy_with!r}; wait for it")
        if s.namespace != req.namespace:
            raise UnknownSession(f"no open session {s.session_id!r} in this namespace")
        prompt = s.tokens + list(req.prompt_token_ids)
        if not prompt:
            raise InvalidRequest("the session is empty and the turn has no tokens; send at least one token")
        s.busy_with = req.request_id
        return prompt

    def end_turn(self, session_id: str, tokens: list[int] | None) -> None:
        """The turn ended; `tokens` (prompt + output) advance the session, None leaves it as it was."""
        s = self._sessions.get(session_id)
        if s is None:
            return
        s.busy_with = None
        if tokens is not None:
            s.tokens = list(tokens)
            s.turns += 1
        self._relock(s, time.monotonic())

    def abandon_turn(self, session_id: str, request_id: str) -> None:
        """A turn that failed before the engine tracked it: free the session if that turn holds it."""
        s = self._sessions.get(session_id)
        if s is not None and s.busy_with == request_id:
            self.end_turn(session_id, None)

    def shed_one(self) -> bool:
        """Memory pressure: drop the earliest-expiring idle session's lease; -> whether one went."""
        idle = [s for s in self._sessions.values() if s.lease is not None and s.busy_with is None]
        if not idle:
            return False
        s = min(idle, key=lambda x: x.expires_at)
        self._unlock(s)
        self.shed += 1
        return True

    def expire(self, now: float) -> None:
        for s in self._sessions.values():
            if s.lease is not None and s.busy_with is None and now >= s.expires_at:
                self._unlock(s)
