"""Sequences of a request: its first sequence, and the copy-on-write fork of a root into children.
The first child takes the root's lease and the others clones, so the prefix stays locked while any runs.
"""

from __future__ import annotations

import dataclasses

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.sequence import BeamState, RequestState, SeqIds, SeqStatus, Sequence
from radixd.daemon.engine.textstream import TextStream
from radixd.daemon.executor.sampling import SamplingParams, SamplingState
from radixd.daemon.text.tokenizer import TextTokenizer


class Forker:
    """Creates a request's sequences (engine thread only); the scheduler owns where they run."""

    def __init__(
        self, kv: KVManager, seq_ids: SeqIds, tokenizer: TextTokenizer, eos_token_ids: tuple[int, ...]
    ) -> None:
        self.kv = kv
        self.seq_ids = seq_ids
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        TextStream.prepare(tokenizer)

    def sampling_state(
        self, r: RequestState, seed: int | None, params: SamplingParams | None = None
    ) -> SamplingState:
        """A fresh sampler for `r` (`params`: other than the request's), at its grammar's start."""
        st = SamplingState(params or r.req.sampling, r.prompt, self.eos_token_ids, seed=seed)
        if r.grammar is not None:
            st.grammar = r.grammar.matcher()
        return st

    def text(self, r: RequestState) -> TextStream | None:
        """The output's text stream; none when the reader takes ids only and no stop string needs text."""
        stop = r.req.sampling.stop
        if not r.req.detokenize and not stop:
            return None
        return TextStream(self.tokenizer, r.prompt, stop)

    def first(self, r: RequestState) -> Sequence:
        """The request's first sequence: one that samples (n == 1, no beams) or a root that forks."""
        if r.n == 1 and not r.req.beam_width:
            return Sequence(
                self.seq_ids.next(), r, 0, list(r.prompt), self.sampling_state(r, None), self.text(r)
            )
        return Sequence(self.seq_ids.next(), r, -1, list(r.prompt), None)

    def fork(self, root: Sequence) -> list[Sequence]:
        """Turn a root into its CoW children (not yet queued); the root is finished and released."""
        r = root.request
        children = [self._first_beam(root)] if r.req.beam_width else self._samplers(root)
        self.kv.fork(root, children)
        self.kv.release(root)
        root.status = SeqStatus.FINISHED
        r.seqs = children
        r.forked = True
        return children

    def _samplers(self, root: Sequence) -> list[Sequence]:
        """n children, each with its own sampler (seeded seed + i when the request has a seed)."""
        r = root.request
        seed = r.req.sampling.seed
        base = self.sampling_state(r, seed)
        children = []
        for i in range(r.n):
            child = Sequence(
                self.seq_ids.next(),
                r,
                i,
                list(root.tokens),
                base.fork(None if seed is None else seed + i),
                self.text(r),
            )
            children.append(child)
        return children

    def _first_beam(self, root: Sequence) -> Sequence:
        """The first beam: the root's table and tokens, a greedy sampler reporting top-2k logprobs."""
        r = root.request
        width = r.req.beam_width
        params = dataclasses.replace(r.req.sampling, temperature=0.0, logprobs=min(2 * width, 20), n=1)
        r.beam = BeamState(width)
        beam = Sequence(self.seq_ids.next(), r, 0, list(root.tokens), self.sampling_state(r, None, params))
        return beam
