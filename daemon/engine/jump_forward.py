"""Jump-forward: the tokens a grammar forces are appended at once and computed as one chunk.

Where a constrained sequence's grammar admits exactly one continuation for several tokens (a JSON
schema's keys and punctuation, the rest of a choice), `JumpForward.extend` appends them right after
the sampled token, through the same `Outputs.accept` path a sampled token takes (its grammar consumes
each, stop strings, `max_tokens`, the context limit and streaming apply token by token, so a forced
run ends exactly where step-by-step decoding would have ended). The sequence then has several tokens
to compute: the scheduler plans them as one prefill-style chunk (`Sequence.remaining`), which writes
their KV and samples once after the last. Preemption needs nothing: forced tokens are tokens like any
other (recompute and swap keep every token, and the grammar has consumed exactly them).

NOTE: exact at temperature 0. Where the mask allows a single token, step-by-step sampling picks it
whatever the logits; `Matcher.forced` gives exactly those tokens (llguidance's canonical tokenization,
which is all its mask allows at forced text: checked on the test schemas). A sampled (temperature > 0)
row draws one uniform per forced token from its own generator, as the sampler would have in the skipped
steps, so a seeded request's later draws line up with step-by-step decoding too.

Left out: a request asking for logprobs (a forced token's logprob is the model's, which only the
skipped forward would give: such requests decode step by step), and beam search (its own step).
"""

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
        """After `seq` accepted a sampled token: append what its grammar forces next. -> (tokens
        appended, whether that ended its request's last live sequence)."""
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
