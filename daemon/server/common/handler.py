"""`@rpc`: the wrapper every servicer method runs in: log context, exceptions -> status, call counts."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from radixd.daemon.process.log import bind_request, get_logger
from radixd.daemon.server.common.errors import status_for
from radixd.daemon.server.common.state import ServerState

log = get_logger("radixd.server")

R = TypeVar("R")


class HasState(Protocol):
    state: ServerState


Handler = Callable[[Any, Any, Any], Awaitable[R]]


def rpc(name: str) -> Callable[[Handler[R]], Handler[R | None]]:
    """Decorate an async servicer method `(self, request, context)`; `self.state` is a ServerState."""

    def wrap(fn: Handler[R]) -> Handler[R | None]:
        @functools.wraps(fn)
        async def handler(self: HasState, request: Any, context: Any) -> R | None:
            code = grpc.StatusCode.OK
            with bind_request(rpc=name, rpc_id=uuid.uuid4().hex[:12]):
                try:
                    return await fn(self, request, context)
                except asyncio.CancelledError:
                    code = grpc.StatusCode.CANCELLED
                    log.info("rpc.cancelled")
                    raise
                except Exception as exc:
                    if isinstance(exc, grpc.aio.AbortError):
                        raise
                    code, message = status_for(exc)
                    if code == grpc.StatusCode.INTERNAL:
                        log.exception("rpc.failed", code=code.name)
                    else:
                        log.info("rpc.refused", code=code.name, reason=message)
                    await context.abort(code, message)
                    return None
                finally:
                    self.state.metrics.requests.labels(name, code.name).inc()

        return handler

    return wrap
