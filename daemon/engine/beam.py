"""Beam search of width k on the copy-on-write fork mechanism.

Each step every live beam reports its top-2k logprobs; the best k extensions survive (a beam chosen m
times forks m ways). Scores only decrease, so the search stops once n finished hypotheses beat every
live beam; the n best go out once, at the end."""

from __future__ import annotations

import time
from collections.abc import Callable

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.outputs import Outputs
from radixd.daemon.engine.prompt_scoring import take_prompt_logprobs
from radixd.daemon.engine.scheduler import Scheduler
from radixd.daemon.engine.sequence import BeamState, Hypothesis, RequestState, SeqIds, Sequence
from radixd.daemon.engine.types import RequestOutput
from radixd.daemon.executor.sampling import MASKED_LOGIT, SampleResult
from radixd.daemon.text.tokenizer import TextTokenizer


class BeamSearch:
    """Steps beam-search requests (engine thread only); `Forker` starts them with their first beam."""

    def __init__(
        self,
        scheduler: Scheduler,
        kv: KVManager,
        outputs: Outputs,
        finish: Callable[[RequestState], None],
        tokenizer: TextTokenizer,
        seq_ids: SeqIds,
        eos_token_ids: tuple[int, ...],
        max_model_len: int,
    ) -> None:
        self.scheduler = scheduler
        self.kv = kv
        self.outputs = outputs
        self.finish = finish  # ends a request whose hypotheses went out (`Requests.finish`)
        self.tokenizer = tokenizer
        self.seq_ids = seq_ids
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def step(self, seq: Sequence, res: SampleResult) -> None:
        """Record one beam's candidates; select the next beams once every live beam has reported."""
        r = seq.request
        st = r.beam
        if st is None:
            return
        if r.first_token_at is None:
            r.first_token_at = time.monotonic()
        # NOTE: a token the sampler masked (a grammar's, or min_tokens' ends) is never a candidate.
        top = [c for c in res.top_logprobs if c[1] > MASKED_LOGIT / 2]
        st.candidates[seq.seq_id] = top or [(res.token_id, res.logprob or 0.0)]
        live = r.live_seqs
        if all(s.seq_id in st.candidates for s in live):
            self._select(r, st, live)

    def _select(self, r: RequestState, st: BeamState, live: list[Sequence]) -> None:
        p = r.req.sampling
        k = st.width
        ends = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
        cands = sorted(
            ((b.score + lp, b.seq_id, tok, b) for b in live for tok, lp in st.candidates[b.seq_id][: 2 * k]),
            key=lambda c: (-c[0], c[1], c[2]),
        )
        st.candidates.clear()
        picks: list[tuple[Sequence, int, float]] = []
        for score, _sid, tok, b in cands:
            gen = b.num_generated + 1
            if tok in ends and gen >= p.min_tokens:
                st.finished.append(Hypothesis(score, [*b.tokens[r.prompt_len :], tok], "stop"))
                continue
            picks.append((b, tok, score))
            if len(picks) == k:
                break
        best_done = max((h.score for h in st.finished), default=None)
        n_out = max(p.n, 1)
        stop = not picks or (
            len(st.finished) >= n_out and best_done is not None and best_done >= max(s for _, _, s in picks)
        )
        by_parent: dict[int, list[tuple[int, float]]] = {}
        for b, tok, score in picks:
            by_parent.setdefault(b.seq_id, []).append((tok, score))
        new_live: list[Sequence] = []
        for b in live:
            chosen = by_parent.get(b.seq_id, [])
            if stop or not chosen:
                self.outputs.finish_seq(b, "stop", emit=False)
                continue
            base_tokens = list(b.tokens)
            # NOTE: every extension forks the parent's sampler before any appends its token, so each
            # history (and grammar) holds the parent's tokens plus its own one.
            base_state = b.sampling
            states = [base_state] + [base_state.fork(None) for _ in chosen[1:]] if base_state else []
            for j, (tok, score) in enumerate(chosen):
                if j == 0:
                    child = b
                else:
                    child = Sequence(self.seq_ids.next(), r, 0, list(base_tokens), None)
                    self.kv.fork(b, [child])
                    self.scheduler.add_running(child)
                    r.seqs.append(child)
                if states:
                    child.sampling = states[j]
                    child.sampling.append(tok)
                child.tokens.append(tok)
                child.score = score
                new_live.append(child)
        r.seqs = [s for s in r.seqs if not s.finished]
        if not stop:
            limit = self.max_model_len
            full = [s for s in new_live if s.num_generated >= p.max_tokens or len(s.tokens) >= limit]
            if len(full) == len(new_live):
                for s in new_live:
                    st.finished.append(Hypothesis(s.score, s.tokens[r.prompt_len :], "length"))
                stop = True
        if stop:
            for s in list(r.seqs):
                if not s.finished:
                    self.outputs.finish_seq(s, "length", emit=False)
            self._emit_final(r, st)

    def _emit_final(self, r: RequestState, st: BeamState) -> None:
        hyps = sorted(st.finished, key=lambda h: -h.score)[: max(r.req.sampling.n, 1)]
        p = r.req.sampling
        for i, h in enumerate(hyps):
            text = self.tokenizer.decode(h.tokens, skip_special_tokens=True) if r.req.detokenize else ""
            last = h.tokens[-1] if h.tokens else None
            self.outputs.emit(
                r.sink,
                RequestOutput(
                    request_id=r.request_id,
                    index=i,
                    new_token_ids=h.tokens,
                    text_delta=text,
                    logprobs=None,
                    prompt_tokens=r.prompt_len,
                    cached_tokens=r.cached_tokens or 0,
                    completion_tokens=len(h.tokens),
                    finished=True,
                    finish_reason=h.reason,
                    ttft_s=(r.first_token_at - r.arrival) if r.first_token_at is not None else None,
                    matched_stop=last if h.reason == "stop" and last in p.stop_token_ids else None,
                    prompt_logprobs=take_prompt_logprobs(r) if r.prompt_logprobs is not None else None,
                ),
            )
        self.finish(r)
