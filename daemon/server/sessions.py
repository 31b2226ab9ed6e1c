"""SessionService: sessions, turns, copy-on-write forks.

Session operations run on the engine thread (`Engine.call`), which owns the session table and the
cache leases. A session belongs to the namespace (tenant) that created it; other tenants get NOT_FOUND.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from radixd_client._pb import session_pb2, session_pb2_grpc

from radixd.daemon.engine.types import UnknownSession
from radixd.daemon.server.convert import prompt_ids, sampling_params
from radixd.daemon.server.errors import bad_request
from radixd.daemon.server.handler import rpc
from radixd.daemon.server.state import ServerState
from radixd.daemon.server.streaming import RequestRegistry, check_deadline, check_fits, run_stream

if TYPE_CHECKING:
    from radixd.daemon.engine.core import EngineCore
    from radixd.daemon.engine.sessions import SessionInfo

T = TypeVar("T")
MAX_FORK = 64


def session_message(info: SessionInfo) -> session_pb2.Session:
    return session_pb2.Session(
        session_id=info.session_id,
        num_tokens=info.num_tokens,
        num_turns=info.turns,
        parent_id=info.parent_id or "",
        resident_tokens=info.resident_tokens,
        expires_in_s=info.expires_in_s,
        busy=info.busy,
    )


async def on_engine(state: ServerState, fn: Callable[[EngineCore], T]) -> T:
    """Run `fn(core)` on the engine thread and await its result without blocking the loop."""
    return await asyncio.wrap_future(state.engine.call(fn))


def owned(core: EngineCore, session_id: str, namespace: str) -> SessionInfo:
    """The session if it exists in `namespace` (engine thread); UnknownSession otherwise."""
    if not session_id:
        raise bad_request("session_id is empty; pass the id CreateSession returned")
    info = core.sessions.get(session_id)
    if info.namespace != namespace:
        raise UnknownSession(f"no open session {session_id!r}; create it first (or it was closed)")
    return info


class SessionServicer(session_pb2_grpc.SessionServiceServicer):
    def __init__(self, state: ServerState, registry: RequestRegistry) -> None:
        self.state = state
        self.registry = registry

    @rpc("CreateSession")
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: Any
    ) -> session_pb2.CreateSessionResponse:
        state = self.state
        state.refuse_if_draining()
        ns = state.namespace(context)
        tokens = (
            prompt_ids(request.context, state.tokenizer, generation_prompt=False)
            if request.HasField("context")
            else []
        )
        if len(tokens) >= state.limits.context_length:
            raise bad_request(
                f"session context has {len(tokens)} tokens; the context length is"
                f" {state.limits.context_length}"
            )
        if request.ttl_s < 0:
            raise bad_request(f"ttl_s must be >= 0 (0 = daemon default), got {request.ttl_s}")
        ttl = request.ttl_s or None
        info = await on_engine(state, lambda c: c.sessions.create(None, ns, tokens, ttl))
        return session_pb2.CreateSessionResponse(session=session_message(info))

    @rpc("SessionGenerate")
    async def Generate(self, request: session_pb2.SessionServiceGenerateRequest, context: Any) -> None:
        state = self.state
        state.refuse_if_draining()
        ns = state.namespace(context)
        check_deadline(context)
        sid = request.session_id
        info = await on_engine(state, lambda c: owned(c, sid, ns))
        tail = state.tokenizer.decode(info.tokens[-4:]) if info.tokens else ""
        ids = prompt_ids(request.prompt, state.tokenizer, continuation=bool(info.tokens), context_tail=tail)
        sampling = sampling_params(request.sampling, state.limits.default_max_tokens)
        if sampling.n != 1:
            raise bad_request(f"a session turn produces one reply; n must be 1, got {sampling.n}")
        check_fits(state, info.num_tokens + len(ids), sampling)
        with state.stream_slot():
            await run_stream(
                state,
                self.registry,
                context,
                namespace=ns,
                client_id=request.request_id,
                prompt_ids=ids,
                sampling=sampling,
                make=session_pb2.SessionServiceGenerateResponse,
                session_id=sid,
            )

    @rpc("ForkSession")
    async def ForkSession(
        self, request: session_pb2.ForkSessionRequest, context: Any
    ) -> session_pb2.ForkSessionResponse:
        state = self.state
        state.refuse_if_draining()
        ns = state.namespace(context)
        if not 1 <= request.count <= MAX_FORK:
            raise bad_request(f"count must be in [1, {MAX_FORK}], got {request.count}")
        sid, k = request.session_id, request.count

        def fork(core: EngineCore) -> list[SessionInfo]:
            owned(core, sid, ns)
            return core.sessions.fork(sid, k)

        children = await on_engine(state, fork)
        return session_pb2.ForkSessionResponse(children=[session_message(c) for c in children])

    @rpc("GetSession")
    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: Any
    ) -> session_pb2.GetSessionResponse:
        ns = self.state.namespace(context)
        sid = request.session_id
        info = await on_engine(self.state, lambda c: owned(c, sid, ns))
        return session_pb2.GetSessionResponse(session=session_message(info))

    @rpc("ListSessions")
    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: Any
    ) -> session_pb2.ListSessionsResponse:
        ns = self.state.namespace(context)
        limit = self.state.limits.max_sessions_page
        size = request.page_size or 50
        if size > limit:
            raise bad_request(f"page_size must be <= {limit}, got {size}")
        # NOTE: pages are ordered by session id; the token is the last id of the previous page, so a
        # session created or closed between pages never shifts the others.
        after = request.page_token
        infos = await on_engine(self.state, lambda c: c.list_sessions(ns))
        rest = sorted((i for i in infos if i.session_id > after), key=lambda i: i.session_id)
        page = rest[:size]
        token = page[-1].session_id if len(rest) > size else ""
        return session_pb2.ListSessionsResponse(
            sessions=[session_message(i) for i in page], next_page_token=token
        )

    @rpc("CloseSession")
    async def CloseSession(
        self, request: session_pb2.CloseSessionRequest, context: Any
    ) -> session_pb2.CloseSessionResponse:
        ns = self.state.namespace(context)
        sid, drop = request.session_id, request.drop_cache

        def close(core: EngineCore) -> int:
            owned(core, sid, ns)
            return core.sessions.close(sid, keep_cached=not drop)

        freed = await on_engine(self.state, close)
        return session_pb2.CloseSessionResponse(freed_blocks=freed)
