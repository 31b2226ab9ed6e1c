"""The requests in flight: their table, admission, aborts, endings and failures (engine thread only).

A constrained request waits off the schedule for its grammar; a session turn's full prompt is checked
here. An abort for an id not seen yet is remembered, so a submit racing behind its cancel ends at once.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import structlog

from radixd.daemon.engine.forks import Forker
from radixd.daemon.engine.grammars import Compiled, GrammarWait
from radixd.daemon.engine.outputs import Outputs
from radixd.daemon.engine.scheduler import Scheduler
from radixd.daemon.engine.sequence import RequestState
from radixd.daemon.engine.sessions import SessionManager
from radixd.daemon.engine.types import GenerateRequest, RequestOutput, Sink
from radixd.daemon.engine.validation import Validator
from radixd.daemon.errors import EngineError, EngineFault, InvalidRequest
from radixd.daemon.executor.prompt_logprobs import PromptLogprobs
from radixd.daemon.structured.grammar import GrammarError

log = structlog.get_logger("radixd.engine")

# Aborts remembered for requests not submitted yet; the oldest are forgotten first.
EARLY_ABORTS_KEPT = 4096


def fault_message(exc: BaseException) -> str:
    """What a request failed by an unexpected engine error is told."""
    return (
        f"internal engine error ({type(exc).__name__}: {exc}); the request was not completed."
        " Retry it; if it keeps failing, report it with the request id from the daemon's log"
    )


def error_output(
    req: GenerateRequest, index: int, prompt_tokens: int, cached_tokens: int, message: str, code: str
) -> RequestOutput:
    """The final output of index `index` of `req` when it ends in an error (nothing generated)."""
    return RequestOutput(
        request_id=req.request_id,
        index=index,
        new_token_ids=[],
        text_delta="",
        logprobs=None,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=0,
        finished=True,
        finish_reason="error",
        error=message,
        error_code=code,
        session_id=req.session_id,
    )


def _no_callback(_request_id: str) -> None:
    """`Requests.on_request_done` until the `Engine` sets it."""


@dataclass(eq=False, repr=False)
class Requests:
    """The table of requests in flight; `on_request_done` runs once per ending request."""

    validator: Validator
    grammars: GrammarWait
    sessions: SessionManager
    forker: Forker
    scheduler: Scheduler
    outputs: Outputs
    # Called when a request arrives at an idle engine (the watchdog times only pending work).
    on_first_work: Callable[[], None]
    on_request_done: Callable[[str], None] = field(init=False, default_factory=lambda: _no_callback)
    _table: dict[str, RequestState] = field(init=False, default_factory=dict)
    # Requests whose prefill still scores its prompt (`prompt_scoring.plan_scoring` reads it).
    scoring: set[RequestState] = field(init=False, default_factory=set)
    _early_aborts: deque[str] = field(init=False, default_factory=lambda: deque(maxlen=EARLY_ABORTS_KEPT))
    finished: int = field(init=False, default=0)
    aborted: int = field(init=False, default=0)
    rejected: int = field(init=False, default=0)
    prompt_tokens: int = field(init=False, default=0)  # of every request that entered the queue
    cached_tokens: int = field(init=False, default=0)  # of every finished request

    # ---- the table -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._table) + len(self.grammars)

    def __getitem__(self, request_id: str) -> RequestState:
        return self._table[request_id]

    def ids(self) -> Iterator[str]:
        """The ids in flight, those waiting for their grammar included (a copy)."""
        return iter([*self._table, *self.grammars.ids()])

    # ---- entering --------------------------------------------------------------------------------
    def add(self, req: GenerateRequest, sink: Sink) -> None:
        """Queue `req` as its first sequence (after its grammar compiles), or reject it through `sink`."""
        rid = req.request_id
        if rid in self._early_aborts:
            self._early_aborts.remove(rid)
            self._emit_aborted(req, sink)
            return
        if rid in self._table or rid in self.grammars:
            self.reject(
                req, sink, InvalidRequest(f"request id {rid!r} is already in flight; use a unique id")
            )
            return
        if req.sampling.constraint is None:
            self._enter(req, sink, None)
            return
        compiled = self.grammars.compile(req)
        if compiled.done():
            self._enter(req, sink, compiled)
            return
        log.info("engine.grammar_wait", request_id=rid, kind=req.sampling.constraint.kind)
        self.grammars.park(req, sink, compiled)

    def admit_compiled(self) -> None:
        """Queue the waiting requests whose grammar compiled, reject those whose grammar failed."""
        for p in self.grammars.ready():
            try:
                self._enter(p.req, p.sink, p.compiled)
            except Exception as exc:  # out of the wait, not yet in the table: only its sink can hear
                self.fail_submit(p.req, p.sink, exc)

    def _emit_aborted(self, req: GenerateRequest, sink: Sink) -> None:
        """End a request that never entered the table with an "abort" output for each index."""
        self.aborted += 1
        rid = req.request_id
        for i in range(max(req.sampling.n, 1)):
            self.outputs.emit(
                sink, RequestOutput(rid, i, [], "", None, len(req.prompt_token_ids), 0, 0, True, "abort")
            )
        self.on_request_done(rid)

    def _enter(self, req: GenerateRequest, sink: Sink, compiled: Compiled | None) -> None:
        """Queue `req` (its grammar compiled, when it has a constraint) as its first sequence."""
        grammar = None
        if compiled is not None:
            exc = compiled.exception()
            if exc is not None:
                if isinstance(exc, GrammarError):
                    self.reject(req, sink, InvalidRequest(str(exc)))
                else:
                    log.error("engine.grammar_failed", request_id=req.request_id, error=repr(exc))
                    self.reject(req, sink, EngineFault(fault_message(exc)))
                return
            grammar = compiled.result()
        rid = req.request_id
        prompt = list(req.prompt_token_ids)
        if req.session_id is not None:
            try:
                prompt = self._session_prompt(req)
            except EngineError as exc:
                self.reject(req, sink, exc)
                return
        if not self.scheduler.has_work():
            self.on_first_work()
        # Arrival is the caller's (the RPC's), so queue time and TTFT include the step in progress.
        r = RequestState(req=req, sink=sink, prompt=prompt, arrival=req.arrival_time, grammar=grammar)
        if req.sampling.prompt_logprobs is not None:
            r.prompt_logprobs = PromptLogprobs(prompt, req.sampling.prompt_logprobs)
            self.scoring.add(r)
        self._table[rid] = r
        self.prompt_tokens += len(prompt)
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

    def _session_prompt(self, req: GenerateRequest) -> list[int]:
        """A session turn's full prompt (the session's tokens first) once it fits; raises EngineError."""
        prompt = self.sessions.begin_turn(req)
        try:
            self.validator.check_fits(len(prompt), req)
        except EngineError:
            self.sessions.end_turn(req.session_id or "", None)
            raise
        return prompt

    def reject(self, req: GenerateRequest, sink: Sink, exc: EngineError) -> None:
        """Finish a request that never ran with an error output for each index."""
        self.rejected += 1
        log.info("engine.reject", request_id=req.request_id, error=str(exc), code=exc.code)
        for i in range(max(req.sampling.n, 1)):
            self.outputs.emit(sink, error_output(req, i, len(req.prompt_token_ids), 0, str(exc), exc.code))
        self.on_request_done(req.request_id)

    # ---- leaving ---------------------------------------------------------------------------------
    def finish(self, r: RequestState) -> None:
        """End a request whose sequences all finished: advance its session, count it (idempotent)."""
        if r.done:
            return
        r.done = True
        self._table.pop(r.request_id, None)
        self.finished += 1
        self.cached_tokens += r.cached_tokens or 0
        ok = all(s.finish_reason in ("stop", "length") for s in r.seqs)
        if r.req.session_id is not None:
            best = next((s for s in r.seqs if s.index == 0), None)
            self.sessions.end_turn(r.req.session_id, best.tokens if ok and best is not None else None)
        log.info(
            "engine.finished",
            request_id=r.request_id,
            reasons=dict(Counter(s.finish_reason or "none" for s in r.seqs)),  # n=64: one count, not 64
            prompt_tokens=r.prompt_len,
            cached_tokens=r.cached_tokens,
            completion_tokens=sum(max(0, s.num_generated) for s in r.seqs),
        )
        # A request and its sequences point at each other: dropping the list frees them now, not at
        # the cyclic GC's next full pass.
        r.seqs = []
        self.on_request_done(r.request_id)

    def abort(self, request_id: str) -> bool:
        """Abort by id (idempotent; unknown ids are remembered); -> whether one in flight was aborted."""
        r = self._table.get(request_id)
        if r is None:
            parked = self.grammars.take(request_id)
            if parked is not None:
                log.info("engine.abort", request_id=request_id)
                self._emit_aborted(parked.req, parked.sink)
                return True
            if request_id not in self._early_aborts:
                self._early_aborts.append(request_id)
            return False
        self.aborted += 1
        log.info("engine.abort", request_id=request_id)
        for seq in list(r.seqs):
            if not seq.finished:
                self.outputs.finish_seq(seq, "abort", emit=True)
        self.finish(r)
        return True

    def abort_all(self, reason: str) -> None:
        """Abort every request in flight (the engine is stopping)."""
        for rid in self.ids():
            self.abort(rid)
        if self._table:
            log.warning("engine.abort_all_left", reason=reason, left=len(self._table))

    # ---- failures --------------------------------------------------------------------------------
    def fail(self, request_id: str, exc: BaseException) -> None:
        """Fail an in-flight request: unfinished outputs end in "error" ("internal", or "invalid_argument"
        for an `InvalidRequest`), its blocks, lease and turn are released, the failure is logged."""
        r = self._table.get(request_id)
        if r is None:
            return
        client = isinstance(exc, InvalidRequest)
        message = str(exc) if client else fault_message(exc)
        code = InvalidRequest.code if client else EngineFault.code
        log.error("engine.request_failed", request_id=request_id, error=message, code=code)
        for seq in [seq for seq in r.seqs if not seq.finished]:
            self.outputs.finish_seq(seq, "error", emit=True, error=message, code=code)
        if not r.seqs:  # it failed before it got a sequence: nothing above reached its sink
            self._emit_errors(r, message, code)
        self.finish(r)

    def fail_submit(self, req: GenerateRequest, sink: Sink, exc: BaseException) -> None:
        """`add(req, sink)` raised unexpectedly: fail `req` in whatever state it got to."""
        r = self._table.get(req.request_id)
        if r is not None and r.req is req:
            self.fail(req.request_id, exc)
            return
        if req.session_id is not None:
            self.sessions.abandon_turn(req.session_id, req.request_id)
        message = fault_message(exc)
        log.error("engine.request_failed", request_id=req.request_id, error=message)
        self.reject(req, sink, EngineFault(message))

    def fail_all(self, exc: BaseException) -> None:
        """The engine thread is dying: fail every request in flight, however broken its state."""
        for rid in self.grammars.ids():
            parked = self.grammars.take(rid)
            if parked is not None:
                self.reject(parked.req, parked.sink, EngineFault(fault_message(exc)))
        for rid, r in list(self._table.items()):
            try:
                self.fail(rid, exc)
            except Exception:
                log.exception("engine.request_fail_failed", request_id=rid)
                self._table.pop(rid, None)
                self._emit_errors(r, fault_message(exc))
                self.on_request_done(rid)

    def _emit_errors(self, r: RequestState, message: str, code: str = EngineFault.code) -> None:
        """A final error output for each index of `r` that has not finished yet."""
        ended = {s.index for s in r.seqs if s.finished and s.index >= 0}
        for i in range(r.n):
            if i not in ended:
                out = error_output(r.req, i, r.prompt_len, r.cached_tokens or 0, message, code)
                self.outputs.emit(r.sink, out)
