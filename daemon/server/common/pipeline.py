"""One request's path through the server, whatever protocol it came by: id registry (for Abort),
drain count, submit, request metrics and cleanup; protocols only map messages in and out.
NOTE: whatever ends a stream early leaves `open_request` through `finally`, which aborts the unfinished
request in the engine, so its KV is freed within one step."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.process.log import get_logger
from radixd.daemon.server.common.bounds import check_id
from radixd.daemon.server.common.bridge import OutputBridge
from radixd.daemon.server.common.errors import RpcFailure, bad_request, status_for_code_name
from radixd.daemon.server.common.state import ServerState

log = get_logger("radixd.server.stream")


class RequestRegistry:
    """Client request ids per namespace -> engine ids, for Abort.
    NOTE: engine ids are fresh uuids, so tenants' ids never collide and a tenant aborts only its own."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], str] = {}

    def register(self, namespace: str, client_id: str) -> str:
        key = (namespace, client_id)
        if key in self._ids:
            raise bad_request(
                f"request_id {client_id!r} is already running; use a unique id or leave it empty"
            )
        engine_id = uuid.uuid4().hex
        self._ids[key] = engine_id
        return engine_id

    def unregister(self, namespace: str, client_id: str) -> None:
        self._ids.pop((namespace, client_id), None)

    def lookup(self, namespace: str, client_id: str) -> str | None:
        return self._ids.get((namespace, client_id))


def check_deadline(context: Any) -> None:
    """Raise DEADLINE_EXCEEDED if the client's deadline already passed (checked before costly work)."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the request started")


def admit(state: ServerState, context: Any, request_id: str) -> str:
    """The checks every generation call passes before it costs anything; -> the caller's namespace."""
    namespace = state.new_work_namespace(context)
    check_deadline(context)
    check_id("request_id", request_id)
    return namespace


def abort(state: ServerState, registry: RequestRegistry, namespace: str, client_id: str) -> None:
    """Abort the caller's request `client_id` if it is running (an id not running is no error)."""
    engine_id = registry.lookup(namespace, client_id)
    if engine_id is not None:
        state.engine.abort(engine_id)


def failure(out: RequestOutput) -> RpcFailure:
    """The RPC's failure for an output that ended in an error, with the engine's status."""
    return RpcFailure(status_for_code_name(out.error_code), out.error or "the request failed")


class RequestOutputs:
    """One request's outputs until every index finished; an error before any output raises."""

    def __init__(
        self, state: ServerState, req: GenerateRequest, client_id: str, bridge: OutputBridge
    ) -> None:
        self.client_id = client_id
        self.pending = set(range(req.sampling.n))  # n <= bounds.MAX_N, checked with the sampling
        self._metrics = state.metrics
        self._bridge = bridge
        self._arrival = req.arrival_time
        self._last_chunk = req.arrival_time
        self._started = False

    def __aiter__(self) -> RequestOutputs:
        return self

    async def __anext__(self) -> RequestOutput:
        if not self.pending:
            raise StopAsyncIteration
        out = await self._bridge.get()
        metrics = self._metrics
        if not self._started:
            if out.finish_reason == "error":
                raise failure(out)
            self._started = True
            metrics.prompt_tokens.inc(out.prompt_tokens)
            metrics.cached_tokens.inc(out.cached_tokens)
        if out.new_token_ids:
            now = time.monotonic()
            metrics.generated_tokens.inc(len(out.new_token_ids))
            if self._last_chunk > self._arrival:
                metrics.inter_token.observe(now - self._last_chunk)
            self._last_chunk = now
        if out.finished:
            self.pending.discard(out.index)
            if out.ttft_s is not None:
                metrics.ttft.observe(out.ttft_s)
            if out.queue_time_s is not None:
                metrics.queue_time.observe(out.queue_time_s)
        return out


@contextlib.asynccontextmanager
async def open_request(
    state: ServerState, registry: RequestRegistry, req: GenerateRequest, client_id: str
) -> AsyncIterator[RequestOutputs]:
    """Submit `req` under a fresh engine id (its `request_id` is replaced), registered as `client_id`
    (a fresh uuid when empty) in its namespace; yields its outputs and cleans up on exit."""
    engine = state.engine
    metrics = state.metrics
    namespace = req.namespace
    client_id = client_id or uuid.uuid4().hex
    with state.stream_slot():
        req = dataclasses.replace(req, request_id=registry.register(namespace, client_id))
        engine_id = req.request_id

        def overflow() -> None:
            metrics.slow_reader_aborts.inc()
            engine.abort(engine_id)

        loop = asyncio.get_running_loop()
        bridge = OutputBridge(loop, state.limits.stream_buffer, overflow, state.handover)
        # Every line logged for this stream carries both ids (engine lines carry the engine id).
        structlog.contextvars.bind_contextvars(request_id=client_id, engine_request_id=engine_id)
        outputs = RequestOutputs(state, req, client_id, bridge)
        try:
            engine.submit(req, bridge.sink)
        except BaseException:
            registry.unregister(namespace, client_id)
            raise
        try:
            yield outputs
        finally:
            registry.unregister(namespace, client_id)
            pending = outputs.pending
            completed = req.sampling.n - len(pending)
            log.info("stream.end", completed=completed, seconds=round(time.monotonic() - req.arrival_time, 4))
            if pending:
                engine.abort(engine_id)
                log.info("stream.aborted", engine_request_id=engine_id, pending=sorted(pending))
