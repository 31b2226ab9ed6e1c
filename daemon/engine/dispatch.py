"""The one command table: each engine command (commands.py) -> the component method that applies it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixd.daemon.engine.admin import Admin
from radixd.daemon.engine.commands import (
    Abort,
    AddCacheListener,
    CloseSession,
    CreateSession,
    Evict,
    EvictPrefix,
    EvictSession,
    Flush,
    ForkSession,
    GetSession,
    GetStats,
    ListSessions,
    LookupPrefix,
    Pin,
    RemoveCacheListener,
    Submit,
    Unpin,
)
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.requests import Requests
from radixd.daemon.engine.sessions import SessionInfo, SessionManager
from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.engine.validation import Validator
from radixd.daemon.executor.sampling import SamplingParams

Handler = Callable[[Any], object]


def command_table(
    requests: Requests,
    admin: Admin,
    sessions: SessionManager,
    validator: Validator,
    kv: KVManager,
    stats: Callable[[], EngineStats],
) -> dict[type[Any], Handler]:
    """Every command kind and its handler, over the components' public methods."""
    s = sessions

    def create_session(c: CreateSession) -> SessionInfo:
        s.check_room(1, c.max_sessions)
        if c.tokens:
            # The context must leave room for the first reply token, else every turn would be refused.
            probe = GenerateRequest("session-context", c.tokens, SamplingParams(max_tokens=1), c.namespace)
            validator.check_fits(len(c.tokens), probe)
        return s.create(c.session_id, c.namespace, c.tokens, c.ttl_s)

    def fork_session(c: ForkSession) -> list[SessionInfo]:
        s.get(c.session_id, c.namespace)
        s.check_room(c.count, c.max_sessions)
        return s.fork(c.session_id, c.count, c.child_ids)

    def close_session(c: CloseSession) -> int:
        s.get(c.session_id, c.namespace)
        return s.close(c.session_id, keep_cached=c.keep_cached)

    return {
        Submit: lambda c: requests.add(c.req, c.sink),
        Abort: lambda c: requests.abort(c.request_id),
        Evict: lambda c: admin.evict(c.n_blocks),
        EvictPrefix: lambda c: admin.evict_prefix(c.tokens, c.namespace),
        EvictSession: lambda c: s.evict_cached(c.session_id),
        Flush: lambda c: admin.flush(c.mode, c.timeout_s),
        Pin: lambda c: kv.pin(c.tokens, c.namespace),
        Unpin: lambda c: kv.unpin(c.tokens, c.namespace),
        LookupPrefix: lambda c: kv.cached_len(c.tokens, c.namespace),
        GetStats: lambda c: stats(),
        CreateSession: create_session,
        GetSession: lambda c: s.get(c.session_id, c.namespace),
        ListSessions: lambda c: s.all(c.namespace),
        ForkSession: fork_session,
        CloseSession: close_session,
        AddCacheListener: lambda c: kv.add_listener(c.listener, c.replay),
        RemoveCacheListener: lambda c: kv.remove_listener(c.listener),
    }
