"""Outputs: accept sampled tokens, stream them to sinks, finish sequences (a finished one inserts its
tokens into the tree, so the next turn hits, and frees its table, lease and host blocks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.prompt_scoring import take_prompt_logprobs
from radixd.daemon.engine.scheduler import Scheduler
from radixd.daemon.engine.sequence import SeqStatus, Sequence
from radixd.daemon.engine.swap import HostSwap
from radixd.daemon.engine.types import FinishReason, RequestOutput, Sink, TokenLogprob
from radixd.daemon.executor.sampling import SampleResult

log = structlog.get_logger("radixd.engine")


@dataclass(eq=False, repr=False)
class Outputs:
    """Token acceptance and sequence endings (engine thread only)."""

    scheduler: Scheduler
    kv: KVManager
    swap: HostSwap | None
    max_model_len: int
    stream_interval: int

    def emit(self, sink: Sink, out: RequestOutput) -> None:
        """Hand `out` to `sink`; a sink that raises is logged and ignored.

        Hot (every output of every step): no log context is bound; a sink that logs names its request."""
        try:
            sink(out)
        except Exception:  # a broken sink must not take the engine down
            log.exception("engine.sink_failed", request_id=out.request_id)

    def accept(self, seq: Sequence, res: SampleResult) -> bool:
        """Append the sampled token, stream it, finish the sequence when it ends; -> whether that ended
        its request's last live sequence. Hot (per sequence per step): attributes read once into locals.
        """
        r = seq.request
        tok = res.token_id
        reason: FinishReason | None = None
        stop: str | int | None = None  # what ended the sequence, when it stops (`matched_stop`)
        sampling = seq.sampling
        if sampling is not None:
            sampling.append(tok)  # first: a token its grammar refuses raises before it is kept anywhere
            reason = sampling.finish_reason(tok)  # type: ignore[assignment]
            if reason == "stop" and tok in sampling.params.stop_token_ids:
                stop = tok
        tokens = seq.tokens
        tokens.append(tok)
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
                # As in vLLM, EOS and stop token ids are checked before stop strings.
                if reason != "stop":
                    stop = text.matched
                reason = "stop"
        if reason is None:
            if len(tokens) < self.max_model_len:
                # The first token goes out at once, so the interval never delays TTFT.
                if len(seq.pending_tokens) < self.stream_interval and len(tokens) - len(r.prompt) > 1:
                    seq.pending_text += delta  # streamed with the next output
                else:
                    self.send(seq, delta)
                return False
            reason = "length"
        if text is not None:
            delta += text.finish()
        self.send(seq, delta, reason, None, stop)
        self.finish_seq(seq, reason, emit=False)
        return not r.live_seqs

    def send(
        self,
        seq: Sequence,
        delta: str,
        reason: FinishReason | None = None,
        error: str | None = None,
        stop: str | int | None = None,
        code: str = "internal",
    ) -> None:
        """Emit `seq`'s pending tokens and text (then `delta`) as one output; `reason` makes it the last."""
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
        # NOTE: positional, in field order (a test checks every field): keywords bind slower, per token.
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
            code if reason == "error" else None,  # error_code
            req.session_id,  # session_id
            stop,  # matched_stop
            None,  # prompt_logprobs (below)
            seq.accepted_draft_tokens,  # accepted_draft_tokens
        )
        if r.prompt_logprobs is not None:
            out.prompt_logprobs = take_prompt_logprobs(r)
        seq.pending_tokens = []
        seq.pending_logprobs = []
        self.emit(r.sink, out)

    def finish_seq(
        self,
        seq: Sequence,
        reason: FinishReason,
        emit: bool,
        error: str | None = None,
        code: str = "internal",
    ) -> None:
        """End one sequence: its computed tokens go into the tree, its blocks and lease are freed."""
        if emit:
            indexes = [seq.index] if not seq.is_root else list(range(seq.request.n))
            for i in indexes:
                seq.index = i
                self.send(seq, "", reason, error, None, code)
        self.scheduler.remove(seq)
        if self.swap is not None and seq.host_blocks:
            self.swap.drop(seq)
        self.kv.insert_all(seq)
        self.kv.release(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
