"""Jump-forward: the tokens a grammar forces are appended at once (through `Outputs.accept`, token by
token) and computed as one chunk. Not for requests with logprobs or beam search.
NOTE: exact at temperature 0 (a one-token mask picks that token whatever the logits); a sampled row
draws one uniform per forced token, so a seeded request's later draws match step-by-step decoding."""

from __future__ import annotations

import torch

from radixd.daemon.engine.outputs import Outputs
from radixd.daemon.engine.sequence import SeqStatus, Sequence
from radixd.daemon.executor.sampling import SampleResult


class JumpForward:
    """Appends forced tokens to constrained sequences (engine thread only)."""

    def __init__(self, outputs: Outputs, enabled: bool) -> None:
        self.outputs = outputs
        self.enabled = enabled
        self.forced_tokens = 0  # tokens appended without a decode step of their own

    def extend(self, seq: Sequence) -> tuple[int, bool]:
        """Append what `seq`'s grammar forces next; -> (tokens appended, whether the request ended)."""
        st = seq.sampling
        if not self.enabled or st is None or st.grammar is None or st.params.logprobs is not None:
            return 0, False
        if seq.status is not SeqStatus.RUNNING:
            return 0, False
        forced = st.grammar.forced()
        if not forced:
            return 0, False
        accept = self.outputs.accept
        draw = not st.params.greedy
        n = 0
        for tok in forced:
            if draw:  # the draw the sampler would have made in this token's step
                torch.rand((), generator=st.generator, dtype=torch.float64)
            n += 1
            if accept(seq, SampleResult(tok)):
                self.forced_tokens += n
                return n, True
            if seq.finished:  # ended (stop, length) while its request goes on
                break
        self.forced_tokens += n
        return n, False
