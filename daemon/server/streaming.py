"""radixd's generation stream (GenerationService.Generate, SessionService turns): one engine request
run through the pipeline, written as Start, then Chunks, then one End per output index."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.server.common.convert import chunk_message, end_message, start_message
from radixd.daemon.server.common.pipeline import RequestRegistry, open_request
from radixd.daemon.server.common.state import ServerState

# Builds the service's response message from one of the oneof fields: start=, chunk= or end=.
MakeResponse = Callable[..., Any]


async def run_stream(
    state: ServerState,
    registry: RequestRegistry,
    context: Any,
    req: GenerateRequest,
    client_id: str,
    make: MakeResponse,
) -> None:
    """Run `req` and write its stream to `context`; raises RpcFailure for errors before output."""
    async with open_request(state, registry, req, client_id) as outputs:
        started = False
        async for out in outputs:
            if not started:
                started = True
                start = start_message(outputs.client_id, out, req.session_id or "")
                await context.write(make(start=start))
            if out.new_token_ids or out.text_delta:
                await context.write(make(chunk=chunk_message(out)))
            if out.finished:
                await context.write(make(end=end_message(out, time.monotonic() - req.arrival_time)))
