"""Requests entering and leaving early: admission into the scheduler's queue, aborts by id.

A request is validated (fixed limits, then whether its session turn fits the context), registered in
the engine's request table and handed to the scheduler as its first sequence; a failing check rejects
it with one error output per index. An abort ends every unfinished sequence of the request; an abort
for an id not seen yet is remembered, so a submit that races behind its own cancel ends at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import structlog

from radixd.daemon.engine.forks import Forker
from radixd.daemon.engine.outputs import Outputs
from radixd.daemon.engine.scheduler import Scheduler
from radixd.daemon.engine.sequence import RequestState
from radixd.daemon.engine.sessions import SessionManager
from radixd.daemon.engine.types import EngineError, GenerateRequest, InvalidRequest, RequestOutput, Sink
from radixd.daemon.engine.validation import Validator

log = structlog.get_logger("radixd.engine")

# Aborts remembered for requests not submitted yet; the oldest are forgotten first.
EARLY_ABORTS_KEPT = 4096


class Intake:
    """Admits and aborts requests (engine thread only)."""

    def __init__(
        self,
        requests: dict[str, RequestState],
        counters: dict[str, int],
        validator: Validator,
        sessions: SessionManager,
        forker: Forker,
        scheduler: Scheduler,
        outputs: Outputs,
        on_first_work: Callable[[], None],
    ) -> None:
        self.requests = requests
        self.counters = counters
        self.validator = validator
        self.sessions = sessions
        self.forker = forker
        self.scheduler = scheduler
        self.outputs = outputs
        # Called when a request arrives at an idle engine (the watchdog times only pending work).
        self.on_first_work = on_first_work
        self._early_aborts: deque[str] = deque(maxlen=EARLY_ABORTS_KEPT)

    def add(self, req: GenerateRequest, sink: Sink) -> None:
        """Queue `req` as its first sequence, or reject it through `sink` with the reason."""
        rid = req.request_id
        if rid in self._early_aborts:
            self._early_aborts.remove(rid)
            self.counters["requests_aborted"] += 1
            for i in range(max(req.sampling.n, 1)):
                self.outputs.emit(
                    sink, RequestOutput(rid, i, [], "", None, len(req.prompt_token_ids), 0, 0, True, "abort")
                )
            self.outputs.on_request_done(rid)
            return
        if rid in self.requests:
            self.outputs.reject(
                req, sink, InvalidRequest(f"request id {rid!r} is already in flight; use a unique id")
            )
            return
        try:
            prompt = self._checked_prompt(req)
        except EngineError as exc:
            self.outputs.reject(req, sink, exc)
            return
        if not self.scheduler.has_work():
            self.on_first_work()
        # NOTE: arrival is when the caller made the request (the RPC's arrival), not when this thread
        # picked it up between steps: queue time and TTFT include the step that was in progress.
        r = RequestState(req=req, sink=sink, prompt=prompt, arrival=req.arrival_time)
        self.requests[rid] = r
        self.counters["prompt_tokens"] += len(prompt)
        log.info(
            "engine.request",
            request_id=rid,
            prompt_tokens=len(prompt),
            n=req.sampling.n,
            session_id=req.session_id,
            beam_width=req.beam_width,
        )
        seq = self.forker.first(r)
        r.seqs.append(seq)
        self.scheduler.add(seq)

    def _checked_prompt(self, req: GenerateRequest) -> list[int]:
        """The full prompt (a session's history first) once every check passed; raises EngineError."""
        self.validator.validate(req)
        if req.session_id is None:
            prompt = list(req.prompt_token_ids)
            self.validator.check_fits(len(prompt), req)
            return prompt
        prompt = self.sessions.begin_turn(req)
        try:
            self.validator.check_fits(len(prompt), req)
        except EngineError:
            self.sessions.end_turn(req.session_id, None)
            raise
        return prompt

    def abort(self, request_id: str) -> bool:
        """Abort by id: idempotent; an id not seen yet is remembered so a late submit ends at once.
        -> whether a request in flight was aborted."""
        r = self.requests.get(request_id)
        if r is None:
            if request_id not in self._early_aborts:
                self._early_aborts.append(request_id)
            return False
        self.counters["requests_aborted"] += 1
        log.info("engine.abort", request_id=request_id)
        for seq in list(r.seqs):
            if not seq.finished:
                self.outputs.finish_seq(seq, "abort", emit=True)
        self.outputs.finish_request(r)
        return True

    def abort_all(self, reason: str) -> None:
        """Abort every request in flight (the engine is stopping)."""
        for rid in list(self.requests):
            self.abort(rid)
        if self.requests:
            log.warning("engine.abort_all_left", reason=reason, left=len(self.requests))
