"""One generation stream: submit to the engine, relay outputs as Start / Chunk / End, always clean up.

NOTE: KV release. Whatever ends the handler early (client cancel, deadline, disconnect, a write error,
a slow-reader overflow, a server error) leaves through `finally`, which aborts the request in the
engine unless every completion already finished; the engine frees its blocks within one step.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc
import structlog

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.log import get_logger
from radixd.daemon.sampling import SamplingParams
from radixd.daemon.server.bridge import OutputBridge
from radixd.daemon.server.convert import chunk_message, end_message, start_message
from radixd.daemon.server.errors import RpcFailure, bad_request, status_for_code_name
from radixd.daemon.server.state import ServerState

log = get_logger("radixd.server.stream")

# Builds the service's response message from one of the oneof fields: start=, chunk= or end=.
MakeResponse = Callable[..., Any]


class RequestRegistry:
    """Client-visible request ids per namespace -> engine request ids, for Abort.

    NOTE: engine ids are always fresh uuids, so two tenants choosing the same id never collide and a
    tenant can only abort its own requests.
    """

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


class Submitted(NamedTuple):
    """A request handed to the engine: its ids and the bridge its outputs arrive on."""

    client_id: str
    engine_id: str
    bridge: OutputBridge


def submit(
    state: ServerState,
    registry: RequestRegistry,
    *,
    namespace: str,
    client_id: str,
    prompt_ids: list[int],
    sampling: SamplingParams,
    arrival: float,
    session_id: str | None = None,
    priority: int = 0,
) -> Submitted:
    """Register `client_id` (a fresh uuid when empty), bind both ids to the log context and submit
    the request; its outputs arrive on the returned bridge, whose overflow aborts it. The caller
    unregisters `client_id` when the stream ends (here only if the submit itself fails)."""
    engine = state.engine
    client_id = client_id or uuid.uuid4().hex
    engine_id = registry.register(namespace, client_id)
    metrics = state.metrics

    def overflow() -> None:
        metrics.slow_reader_aborts.inc()
        engine.abort(engine_id)

    bridge = OutputBridge(asyncio.get_running_loop(), state.limits.stream_buffer, overflow)
    req = GenerateRequest(
        request_id=engine_id,
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        namespace=namespace,
        session_id=session_id,
        priority=priority,
        arrival_time=arrival,
    )
    # Every line logged for this stream carries both ids (engine lines carry the engine id).
    structlog.contextvars.bind_contextvars(request_id=client_id, engine_request_id=engine_id)
    try:
        engine.submit(req, bridge.sink)
    except BaseException:
        registry.unregister(namespace, client_id)
        raise
    return Submitted(client_id, engine_id, bridge)


async def run_stream(
    state: ServerState,
    registry: RequestRegistry,
    context: Any,
    *,
    namespace: str,
    client_id: str,
    prompt_ids: list[int],
    sampling: SamplingParams,
    make: MakeResponse,
    session_id: str | None = None,
    priority: int = 0,
    arrival: float | None = None,
) -> None:
    """Run one request and write its stream to `context`; raises RpcFailure for errors before output.

    `arrival` (time.monotonic()) is when the RPC arrived: the engine measures queue time and TTFT
    from it, so they include tokenization and the engine step in progress when the request came.
    """
    engine = state.engine
    metrics = state.metrics
    t0 = time.monotonic() if arrival is None else arrival
    client_id, engine_id, bridge = submit(
        state,
        registry,
        namespace=namespace,
        client_id=client_id,
        prompt_ids=prompt_ids,
        sampling=sampling,
        arrival=t0,
        session_id=session_id,
        priority=priority,
    )
    pending = set(range(sampling.n))  # n <= bounds.MAX_N, checked with the sampling params
    started = False
    try:
        last_chunk = t0
        while pending:
            out = await bridge.get()
            if out.finish_reason == "error" and not started:
                # Nothing was streamed yet: fail the RPC with the engine's status (e.g. NOT_FOUND).
                raise RpcFailure(status_for_code_name(out.error_code), out.error or "the request failed")
            if not started:
                started = True
                metrics.prompt_tokens.inc(out.prompt_tokens)
                metrics.cached_tokens.inc(out.cached_tokens)
                await context.write(make(start=start_message(client_id, out, session_id or "")))
            if out.new_token_ids or out.text_delta:
                now = time.monotonic()
                if out.new_token_ids:
                    metrics.generated_tokens.inc(len(out.new_token_ids))
                    if last_chunk > t0:
                        metrics.inter_token.observe(now - last_chunk)
                last_chunk = now
                await context.write(make(chunk=chunk_message(out)))
            if out.finished:
                pending.discard(out.index)
                if out.ttft_s is not None:
                    metrics.ttft.observe(out.ttft_s)
                if out.queue_time_s is not None:
                    metrics.queue_time.observe(out.queue_time_s)
                await context.write(make(end=end_message(out, time.monotonic() - t0)))
    finally:
        registry.unregister(namespace, client_id)
        log.info("stream.end", completed=sampling.n - len(pending), seconds=round(time.monotonic() - t0, 4))
        if pending:
            engine.abort(engine_id)
            log.info("stream.aborted", engine_request_id=engine_id, pending=sorted(pending))


def check_deadline(context: Any) -> None:
    """Raise DEADLINE_EXCEEDED if the client's deadline already passed (checked before costly work)."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the request started")
