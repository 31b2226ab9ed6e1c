"""Apply an engine command (commands.py) to the components that own its state (engine thread only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixd.daemon.engine.admin import Admin
from radixd.daemon.engine.commands import (
    AddCacheListener,
    CloseSession,
    Command,
    CreateSession,
    Evict,
    EvictPrefix,
    EvictSession,
    Flush,
    ForkSession,
    GetLoad,
    GetSession,
    GetStats,
    ListSessions,
    LookupPrefix,
    Pin,
    RemoveCacheListener,
    Unpin,
)
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.sessions import SessionInfo, SessionManager
from radixd.daemon.engine.types import GenerateRequest, InvalidRequest
from radixd.daemon.engine.validation import Validator
from radixd.daemon.sampling import SamplingParams


class CommandRunner:
    """Runs each command kind through the public methods of the admin, session and KV components."""

    def __init__(self, admin: Admin, sessions: SessionManager, validator: Validator, kv: KVManager) -> None:
        self.admin = admin
        self.sessions = sessions
        self.validator = validator
        a, s = admin, sessions
        self._handlers: dict[type[Any], Callable[[Any], object]] = {
            Evict: lambda c: a.evict(c.n_blocks),
            EvictPrefix: lambda c: a.evict_prefix(c.tokens, c.namespace),
            EvictSession: lambda c: s.evict_cached(c.session_id),
            Flush: lambda c: a.flush(c.mode),
            Pin: lambda c: a.pin(c.tokens, c.namespace),
            Unpin: lambda c: a.unpin(c.tokens, c.namespace),
            LookupPrefix: lambda c: a.lookup_prefix(c.tokens, c.namespace),
            GetStats: lambda c: a.stats(),
            GetLoad: lambda c: a.load(),
            CreateSession: self._create_session,
            GetSession: lambda c: s.get(c.session_id, c.namespace),
            ListSessions: lambda c: s.all(c.namespace),
            ForkSession: self._fork_session,
            CloseSession: self._close_session,
            AddCacheListener: lambda c: kv.add_listener(c.listener, c.replay),
            RemoveCacheListener: lambda c: kv.remove_listener(c.listener),
        }

    def kinds(self) -> tuple[type[Any], ...]:
        """The command classes this runner applies."""
        return tuple(self._handlers)

    def run(self, cmd: Command[Any]) -> object:
        """Apply `cmd`; its result, or the error it raised. An unknown command: InvalidRequest."""
        handler = self._handlers.get(type(cmd))
        if handler is None:
            names = ", ".join(sorted(k.__name__ for k in self._handlers))
            raise InvalidRequest(f"{type(cmd).__name__} is not an engine command; the engine runs {names}")
        return handler(cmd)

    def _create_session(self, c: CreateSession) -> SessionInfo:
        self.sessions.check_room(1, c.max_sessions)
        if c.tokens:
            # NOTE: the context must leave room for the first reply token, in the context window and in
            # the pool, else every turn would be refused: the same check (and message) as a request's.
            probe = GenerateRequest("session-context", c.tokens, SamplingParams(max_tokens=1), c.namespace)
            self.validator.check_fits(len(c.tokens), probe)
        return self.sessions.create(c.session_id, c.namespace, c.tokens, c.ttl_s)

    def _fork_session(self, c: ForkSession) -> list[SessionInfo]:
        self.sessions.get(c.session_id, c.namespace)
        self.sessions.check_room(c.count, c.max_sessions)
        return self.sessions.fork(c.session_id, c.count, c.child_ids)

    def _close_session(self, c: CloseSession) -> int:
        self.sessions.get(c.session_id, c.namespace)
        return self.sessions.close(c.session_id, keep_cached=c.keep_cached)
