"""Unexpected engine errors: what fails, and what every affected request is told.

An exception no component expected fails only the work it touched: the request with finish_reason
"error", code "internal" and its id in the log; its blocks, lease and session turn are released. When
the engine thread itself is dying, every request in flight fails the same way, so no stream waits
forever (engine.py decides which of these applies).
"""

from __future__ import annotations

import structlog

from radixd.daemon.engine.outputs import Outputs
from radixd.daemon.engine.sequence import RequestState
from radixd.daemon.engine.sessions import SessionManager
from radixd.daemon.engine.types import EngineFault, GenerateRequest, Sink

log = structlog.get_logger("radixd.engine")


def fault_message(exc: BaseException) -> str:
    """What a request failed by an unexpected engine error is told."""
    return (
        f"internal engine error ({type(exc).__name__}: {exc}); the request was not completed."
        " Retry it; if it keeps failing, report it with the request id from the daemon's log"
    )


class Faults:
    """Fails requests after unexpected errors (engine thread only)."""

    def __init__(self, requests: dict[str, RequestState], outputs: Outputs, sessions: SessionManager) -> None:
        self.requests = requests
        self.outputs = outputs
        self.sessions = sessions

    def fail_request(self, request_id: str, exc: BaseException) -> None:
        """Fail an in-flight request: each unfinished output ends with finish_reason "error" and code
        "internal", its blocks, lease and session turn are released, and the failure is logged with
        the request id."""
        r = self.requests.get(request_id)
        if r is None:
            return
        message = fault_message(exc)
        log.error("engine.request_failed", request_id=request_id, error=message)
        for seq in [seq for seq in r.seqs if not seq.finished]:
            self.outputs.finish_seq(seq, "error", emit=True, error=message)
        if not r.seqs:  # it failed before it got a sequence: nothing above reached its sink
            self.outputs.emit_errors(r, message)
        self.outputs.finish_request(r)

    def fail_submit(self, req: GenerateRequest, sink: Sink, exc: BaseException) -> None:
        """`EngineCore.add_request(req, sink)` raised unexpectedly: fail `req` in whatever state it got
        to."""
        r = self.requests.get(req.request_id)
        if r is not None and r.req is req:
            self.fail_request(req.request_id, exc)
            return
        if req.session_id is not None:
            self.sessions.abandon_turn(req.session_id, req.request_id)
        message = fault_message(exc)
        log.error("engine.request_failed", request_id=req.request_id, error=message)
        self.outputs.reject(req, sink, EngineFault(message))

    def fail_all(self, exc: BaseException) -> None:
        """The engine thread is dying: fail every request in flight. A request whose state is too
        broken to finish properly still gets its error outputs."""
        for rid, r in list(self.requests.items()):
            try:
                self.fail_request(rid, exc)
            except Exception:
                log.exception("engine.request_fail_failed", request_id=rid)
                self.requests.pop(rid, None)
                self.outputs.emit_errors(r, fault_message(exc))
                self.outputs.on_request_done(rid)
