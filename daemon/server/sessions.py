"""SessionService: sessions, turns, copy-on-write forks, as engine commands on the engine thread.

A session belongs to the namespace that created it; other tenants get NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

from radixd_client._pb import session_pb2, session_pb2_grpc

from radixd.daemon.engine.commands import (
    CloseSession,
    Command,
    CreateSession,
    ForkSession,
    GetSession,
    ListSessions,
)
from radixd.daemon.engine.sessions import SessionInfo
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.limits import check_context
from radixd.daemon.server.common.bounds import (
    MAX_FORK,
    MAX_SESSION_TTL_S,
    check_id,
    check_range,
    check_seconds,
)
from radixd.daemon.server.common.convert import prompt_tokens, sampling_params
from radixd.daemon.server.common.errors import bad_request
from radixd.daemon.server.common.handler import rpc
from radixd.daemon.server.common.pipeline import RequestRegistry, admit
from radixd.daemon.server.common.state import ServerState
from radixd.daemon.server.streaming import run_stream

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


async def on_engine(state: ServerState, cmd: Command[T]) -> T:
    """Apply `cmd` on the engine thread and await its result without blocking the loop."""
    return await asyncio.wrap_future(state.engine.execute(cmd))


def session_id_of(value: str) -> str:
    """A session id from a request: bounded, and not empty."""
    if not value:
        raise bad_request("session_id is empty; pass the id CreateSession returned")
    return check_id("session_id", value)


class SessionServicer(session_pb2_grpc.SessionServiceServicer):
    def __init__(self, state: ServerState, registry: RequestRegistry) -> None:
        self.state = state
        self.registry = registry

    @rpc("CreateSession")
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: Any
    ) -> session_pb2.CreateSessionResponse:
        state = self.state
        ns = state.new_work_namespace(context)
        ttl = check_seconds("ttl_s", request.ttl_s, MAX_SESSION_TTL_S, "the daemon's default") or None
        tokens = (
            await prompt_tokens(state, request.context, "context", generation_prompt=False)
            if request.HasField("context")
            else []
        )
        # The context must leave room for the first reply token, else every turn would be refused.
        check_context(len(tokens), 1, state.limits.context_length)
        limit = state.limits.max_sessions
        info = await on_engine(state, CreateSession(ns, tokens, ttl, max_sessions=limit))
        return session_pb2.CreateSessionResponse(session=session_message(info))

    @rpc("SessionGenerate")
    async def Generate(self, request: session_pb2.SessionServiceGenerateRequest, context: Any) -> None:
        arrival = time.monotonic()
        state = self.state
        ns = admit(state, context, request.request_id)
        sid = check_id("session_id", request.session_id)
        sampling = sampling_params(request.sampling, state.limits)
        info = await on_engine(state, GetSession(session_id_of(sid), ns))
        tail = state.tokenizer.decode(info.tokens[-4:]) if info.tokens else ""
        ids = await prompt_tokens(state, request.prompt, continuation=bool(info.tokens), context_tail=tail)
        if sampling.n != 1:
            raise bad_request(f"a session turn produces one reply; n must be 1, got {sampling.n}")
        # Checked here too (as the engine does), so a refused turn never holds the session.
        check_context(info.num_tokens + len(ids), sampling.max_tokens, state.limits.context_length)
        req = GenerateRequest("", ids, sampling, namespace=ns, session_id=sid, arrival_time=arrival)
        make = session_pb2.SessionServiceGenerateResponse
        await run_stream(state, self.registry, context, req, request.request_id, make)

    @rpc("ForkSession")
    async def ForkSession(
        self, request: session_pb2.ForkSessionRequest, context: Any
    ) -> session_pb2.ForkSessionResponse:
        state = self.state
        ns = state.new_work_namespace(context)
        k = check_range("count", request.count, 1, MAX_FORK)
        sid = session_id_of(request.session_id)
        fork = ForkSession(sid, k, ns, max_sessions=state.limits.max_sessions)
        children = await on_engine(state, fork)
        return session_pb2.ForkSessionResponse(children=[session_message(c) for c in children])

    @rpc("GetSession")
    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: Any
    ) -> session_pb2.GetSessionResponse:
        ns = self.state.namespace(context)
        sid = session_id_of(request.session_id)
        info = await on_engine(self.state, GetSession(sid, ns))
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
        # Pages are ordered by session id and the token is the previous page's last id, so changes
        # between pages never shift the others.
        after = check_id("page_token", request.page_token)
        infos = await on_engine(self.state, ListSessions(ns))
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
        sid = session_id_of(request.session_id)
        freed = await on_engine(self.state, CloseSession(sid, ns, keep_cached=not request.drop_cache))
        return session_pb2.CloseSessionResponse(freed_blocks=freed)
