"""SessionService: sessions, turns, copy-on-write forks.

Session operations run on the engine thread (`Engine.call`), which owns the session table and the
cache leases. A session belongs to the namespace (tenant) that created it; other tenants get NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from radixd_client._pb import session_pb2, session_pb2_grpc

from radixd.daemon.engine.types import GenerateRequest, UnknownSession
from radixd.daemon.sampling import SamplingParams
from radixd.daemon.server.bounds import MAX_FORK, MAX_SESSION_TTL_S, check_id, check_range, check_seconds
from radixd.daemon.server.convert import prompt_tokens, sampling_params
from radixd.daemon.server.errors import RpcFailure, bad_request
from radixd.daemon.server.handler import rpc
from radixd.daemon.server.state import ServerState
from radixd.daemon.server.streaming import RequestRegistry, check_deadline, check_fits, run_stream

if TYPE_CHECKING:
    from radixd.daemon.engine.core import EngineCore
    from radixd.daemon.engine.sessions import SessionInfo

T = TypeVar("T")


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


def check_session_room(core: EngineCore, state: ServerState, k: int) -> None:
    """Refuse `k` more sessions when the daemon already holds its maximum (engine thread)."""
    limit = state.limits.max_sessions
    if len(core.sessions) + k > limit:
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{len(core.sessions)} sessions are open and at most {limit} may be; close sessions you no"
            " longer use (CloseSession) or retry later",
        )


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
        ttl = check_seconds("ttl_s", request.ttl_s, MAX_SESSION_TTL_S, "the daemon's default") or None
        tokens = (
            await prompt_tokens(state, request.context, "context", generation_prompt=False)
            if request.HasField("context")
            else []
        )
        # NOTE: the context must leave room for the first reply token, in the context window and in the
        # pool, else every turn would be refused: the same checks (and messages) as Generate.
        probe = SamplingParams(max_tokens=1)
        check_fits(state, len(tokens), probe)

        def create(core: EngineCore) -> SessionInfo:
            check_session_room(core, state, 1)
            if tokens:
                core.check_fits(len(tokens), GenerateRequest("session-context", tokens, probe, ns))
            return core.sessions.create(None, ns, tokens, ttl)

        info = await on_engine(state, create)
        return session_pb2.CreateSessionResponse(session=session_message(info))

    @rpc("SessionGenerate")
    async def Generate(self, request: session_pb2.SessionServiceGenerateRequest, context: Any) -> None:
        arrival = time.monotonic()
        state = self.state
        state.refuse_if_draining()
        ns = state.namespace(context)
        check_deadline(context)
        sid = check_id("session_id", request.session_id)
        check_id("request_id", request.request_id)
        sampling = sampling_params(request.sampling, state.limits)
        info = await on_engine(state, lambda c: owned(c, sid, ns))
        tail = state.tokenizer.decode(info.tokens[-4:]) if info.tokens else ""
        ids = await prompt_tokens(state, request.prompt, continuation=bool(info.tokens), context_tail=tail)
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
                arrival=arrival,
            )

    @rpc("ForkSession")
    async def ForkSession(
        self, request: session_pb2.ForkSessionRequest, context: Any
    ) -> session_pb2.ForkSessionResponse:
        state = self.state
        state.refuse_if_draining()
        ns = state.namespace(context)
        k = check_range("count", request.count, 1, MAX_FORK)
        sid = check_id("session_id", request.session_id)

        def fork(core: EngineCore) -> list[SessionInfo]:
            owned(core, sid, ns)
            check_session_room(core, state, k)
            return core.sessions.fork(sid, k)

        children = await on_engine(state, fork)
        return session_pb2.ForkSessionResponse(children=[session_message(c) for c in children])

    @rpc("GetSession")
    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: Any
    ) -> session_pb2.GetSessionResponse:
        ns = self.state.namespace(context)
        sid = check_id("session_id", request.session_id)
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
        after = check_id("page_token", request.page_token)
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
        sid, drop = check_id("session_id", request.session_id), request.drop_cache

        def close(core: EngineCore) -> int:
            owned(core, sid, ns)
            return core.sessions.close(sid, keep_cached=not drop)

        freed = await on_engine(self.state, close)
        return session_pb2.CloseSessionResponse(freed_blocks=freed)
