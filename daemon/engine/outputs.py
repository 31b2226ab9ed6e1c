"""Outputs and endings: accept sampled tokens, stream them to sinks, finish sequences and requests.

A finished sequence inserts every computed token into the tree (so the next turn hits) and frees its
table, lease and host blocks; a finished request advances its session and tells the engine.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import structlog

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.scheduler import Scheduler
from radixd.daemon.engine.sequence import RequestState, SeqStatus, Sequence
from radixd.daemon.engine.sessions import SessionManager
from radixd.daemon.engine.swap import HostSwap
from radixd.daemon.engine.types import (
    EngineError,
    EngineFault,
    FinishReason,
    GenerateRequest,
    RequestOutput,
    Sink,
    TokenLogprob,
)
from radixd.daemon.sampling import SampleResult

log = structlog.get_logger("radixd.engine")


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


class Outputs:
    """Token acceptance and request endings (engine thread only).

    `requests` is the engine's table of requests in flight (shared with the core, which adds to it);
    `counters` the engine's counters. `on_request_done(request_id)` runs once per request that ends.
    """

    def __init__(
        self,
        requests: dict[str, RequestState],
        scheduler: Scheduler,
        kv: KVManager,
        swap: HostSwap | None,
        sessions: SessionManager,
        counters: dict[str, int],
        max_model_len: int,
        stream_interval: int,
    ) -> None:
        self.requests = requests
        self.scheduler = scheduler
        self.kv = kv
        self.swap = swap
        self.sessions = sessions
        self.counters = counters
        self.max_model_len = max_model_len
        self.stream_interval = stream_interval
        self.on_request_done: Callable[[str], None] = lambda _rid: None

    def emit(self, sink: Sink, out: RequestOutput) -> None:
        """Hand `out` to `sink`; a sink that raises is logged and ignored.

        NOTE: a sink runs on the engine thread for every output of every step (256 a step at 256
        sequences), so nothing is bound around it: binding the request id into the log context cost
        1 ms of a 10 ms step of bookkeeping there. A sink that logs names its request itself."""
        try:
            sink(out)
        except Exception:  # a broken sink must not take the engine down
            log.exception("engine.sink_failed", request_id=out.request_id)

    def reject(self, req: GenerateRequest, sink: Sink, exc: EngineError) -> None:
        """Finish a request that never ran with an error output for each index."""
        self.counters["requests_rejected"] += 1
        log.info("engine.reject", request_id=req.request_id, error=str(exc), code=exc.code)
        for i in range(max(req.sampling.n, 1)):
            self.emit(sink, error_output(req, i, len(req.prompt_token_ids), 0, str(exc), exc.code))
        self.on_request_done(req.request_id)

    def emit_errors(self, r: RequestState, message: str) -> None:
        """A final error output for each index of `r` that has not finished yet."""
        ended = {s.index for s in r.seqs if s.finished and s.index >= 0}
        for i in range(r.n):
            if i not in ended:
                out = error_output(r.req, i, r.prompt_len, r.cached_tokens or 0, message, EngineFault.code)
                self.emit(r.sink, out)

    def accept(self, seq: Sequence, res: SampleResult) -> None:
        """Append the sampled token to `seq`, stream it, and finish the sequence when it ends.

        NOTE: runs once per sequence per decode step (256 times a step at 256 sequences): attributes
        are read once into locals and nothing is computed that the step does not need.
        """
        r = seq.request
        tok = res.token_id
        tokens = seq.tokens
        tokens.append(tok)
        reason: FinishReason | None = None
        stop: str | int | None = None  # what ended the sequence, when it stops (`matched_stop`)
        sampling = seq.sampling
        if sampling is not None:
            sampling.append(tok)
            reason = sampling.finish_reason(tok)  # type: ignore[assignment]
            if reason == "stop" and tok in sampling.params.stop_token_ids:
                stop = tok
        if r.first_token_at is None:
            r.first_token_at = time.monotonic()
        seq.pending_tokens.append(tok)
        if res.logprob is not None and r.req.sampling.logprobs is not None:
            seq.pending_logprobs.append(TokenLogprob(tok, res.logprob, list(res.top_logprobs)))
        text = seq.text
        delta = ""
        if text is not None:
            delta = text.push(tok)
            if text.stopped:
                # NOTE: as in vLLM, EOS and stop token ids are checked before stop strings.
                if reason != "stop":
                    stop = text.matched
                reason = "stop"
        if reason is None:
            if len(tokens) < self.max_model_len:
                # NOTE: the first token always goes out at once, so the interval never delays the
                # time to first token; after it, tokens leave in groups of `stream_interval`.
                if len(seq.pending_tokens) < self.stream_interval and len(tokens) - len(r.prompt) > 1:
                    seq.pending_text += delta  # streamed with the next output
                else:
                    self.send(seq, delta)
                return
            reason = "length"
        if text is not None:
            delta += text.finish()
        self.send(seq, delta, reason, None, stop)
        self.finish_seq(seq, reason, emit=False)
        if not r.live_seqs:
            self.finish_request(r)

    def send(
        self,
        seq: Sequence,
        delta: str,
        reason: FinishReason | None = None,
        error: str | None = None,
        stop: str | int | None = None,
    ) -> None:
        """Emit `seq`'s pending tokens and text (then `delta`) as one output; `reason` makes it the
        last, `stop` is the stop that ended it."""
        r = seq.request
        if seq.pending_text:
            delta = seq.pending_text + delta
            seq.pending_text = ""
        arrival = r.arrival
        cached = r.cached_tokens
        queued = None if cached is None else (r.admitted_at or time.monotonic()) - arrival
        first = r.first_token_at
        req = r.req
        generated = len(seq.tokens) - len(r.prompt)
        # NOTE: positional, in field order (tests/daemon/engine/test_engine_streaming.py checks every
        # field): keyword arguments cost 2.7x as much to bind (1.37 vs 0.50 us), once per token.
        out = RequestOutput(
            req.request_id,  # request_id
            seq.index if seq.index > 0 else 0,  # index
            seq.pending_tokens,  # new_token_ids
            delta,  # text_delta
            seq.pending_logprobs if req.sampling.logprobs is not None else None,  # logprobs
            len(r.prompt),  # prompt_tokens
            cached or 0,  # cached_tokens
            generated if generated > 0 else 0,  # completion_tokens
            reason is not None,  # finished
            reason,  # finish_reason
            error,  # error
            queued,  # queue_time_s
            None if first is None else first - arrival,  # ttft_s
            "internal" if reason == "error" else None,  # error_code
            req.session_id,  # session_id
            stop,  # matched_stop
        )
        seq.pending_tokens = []
        seq.pending_logprobs = []
        self.emit(r.sink, out)

    def finish_seq(self, seq: Sequence, reason: FinishReason, emit: bool, error: str | None = None) -> None:
        """End one sequence: its computed tokens go into the tree, its blocks and lease are freed."""
        if emit:
            indexes = [seq.index] if not seq.is_root else list(range(seq.request.n))
            for i in indexes:
                seq.index = i
                self.send(seq, "", reason, error)
        self.scheduler.remove(seq)
        if self.swap is not None and seq.host_blocks:
            self.swap.drop(seq)
        self.kv.insert_all(seq)
        self.kv.release(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def finish_request(self, r: RequestState) -> None:
        """End a request whose sequences have all finished: advance its session, count it, tell the
        engine (idempotent)."""
        if r.done:
            return
        r.done = True
        self.requests.pop(r.request_id, None)
        self.counters["requests_finished"] += 1
        self.counters["cached_tokens"] += r.cached_tokens or 0
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
        # NOTE: a request and its sequences point at each other; dropping the list lets reference
        # counting free them now. Left to the cyclic GC, an n = 64 request's 1.6 MB (token lists,
        # generators, text streams) piled up until its next full pass.
        r.seqs = []
        self.on_request_done(r.request_id)
