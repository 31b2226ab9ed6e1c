"""Speculative decoding: decoding sequences verify drafted tokens in the step's one forward pass.

After the scheduler planned a step, `Speculator.plan` takes the decodes it may draft for (below), asks
the `Drafter` (drafter.py: the radix tree, then the sequence's own tokens) for up to k tokens each (k
from `AdaptiveK`), appends their slots while free blocks last (nothing is evicted or preempted for a
draft) and moves each drafted sequence from the step's decode rows to a chunk of k + 1 tokens: its
last sampled token and the draft. The runner samples after each of those positions (`StepSeq.draft`).

`Speculator.accept` then takes the longest prefix of the draft that equals what the model picked
(greedy rows: its argmax; sampled rows: what rejection sampling kept), and accepts those tokens and
the model's next pick after them, one at a time through `Outputs.accept` (stop tokens and strings,
`max_tokens`, the context limit and streaming apply token by token, so a sequence ends exactly where
plain decoding ends it). The rejected tokens'
slots are dropped (`BlockTable.truncate`): the table ends where its computed tokens end, as after a
plain decode step.

NOTE: exact for greedy rows. A token computed in a chunk is bitwise the token a decode step computes
(batch invariance, docs/batch-invariance.md), and each verified row is sampled on its own, so the
output (tokens and logprobs) is exactly plain decoding's. Drafts live only within their step: nothing
about them is in `Sequence.tokens`, so preemption, aborts, forks and sessions see a plain sequence
between steps.

Unseeded sampled rows (temperature > 0) verify by rejection sampling (daemon/executor/draft_sampling.py): the
output distribution is unchanged. A seeded sampled request is not drafted for: its generator would draw
differently with a draft, and which drafts it gets depends on the cache (on other requests), so its
tokens would no longer be reproducible by its seed (docs/batch-invariance.md).

Constrained rows (a grammar) are drafted for too: the proposal is cut before the first token the
grammar forbids (`Matcher.admitted`, read-only), verification masks each of the k + 1 positions with the
mask the grammar gives after the draft tokens before it (executor/masks.py: the mask thread walks the
matcher over the draft and rolls it back), and `accept` consumes only the accepted tokens, through
`Outputs.accept` as any token: the matcher ends in the state of what was accepted, and a verified row
gives exactly what plain constrained decoding gives. Jump-forward still runs after the row's last
accepted token (core.py); a sequence with forced tokens still to compute has more than one token left
and is not a decode, so a jump-forward stretch is never drafted over.

Drafted for: a running sequence decoding its one last token (a chunk cut to one token by the step's
budget is not) whose sampling reads no history a draft would change: no penalties, no pending
`min_tokens`, not beam search; and a sampled row only without a seed and without logprobs. Other rows
decode as before in the same step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from radixd.daemon.engine.drafter import AdaptiveK, Drafter
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.outputs import Outputs
from radixd.daemon.engine.scheduler import StepPlan
from radixd.daemon.engine.sequence import SeqStatus, Sequence
from radixd.daemon.executor.runner import StepSeq
from radixd.daemon.executor.sampling import SampleResult


@dataclass(slots=True)
class Draft:
    """One sequence's draft in this step: it computes `tokens[start]` then `proposed`."""

    seq: Sequence
    start: int
    proposed: list[int]


class Speculator:
    """Drafts, plans and accepts speculative tokens (engine thread only)."""

    def __init__(self, kv: KVManager, outputs: Outputs, max_model_len: int, speculative_tokens: int) -> None:
        self.kv = kv
        self.outputs = outputs
        self.max_model_len = max_model_len
        self.enabled = speculative_tokens > 0
        self.drafter = Drafter(kv.following)
        self.k = AdaptiveK(speculative_tokens)
        self.drafted_tokens = 0  # draft tokens verified
        self.accepted_tokens = 0  # of those, accepted into an output
        self.draft_s = 0.0  # engine-thread time spent drafting and planning drafts
        self.draft_steps = 0  # steps that looked for drafts
        self.grammar_cut_tokens = 0  # proposed tokens cut because a grammar forbade them (or one before)

    def _draftable(self, seq: Sequence) -> int:
        """How many tokens `seq` may draft now (0: it decodes plainly)."""
        st = seq.sampling
        if st is None or seq.index < 0 or seq.status is not SeqStatus.RUNNING or seq.remaining != 1:
            return 0
        p = st.params
        if p.uses_penalties or seq.request.req.beam_width:
            return 0
        if not p.greedy and (p.logprobs is not None or st.seed is not None):
            return 0  # a seed reproduces its tokens only without drafts; see the module docstring
        generated = len(st.output_token_ids)
        if generated < p.min_tokens:
            return 0
        # The draft and the model's own next token all fit in max_tokens and the context.
        room = min(p.max_tokens - generated, self.max_model_len - len(seq.tokens)) - 1
        return min(room, self.k.get(seq.seq_id))

    def plan(self, plan: StepPlan, budget: int) -> list[Draft]:
        """Draft for the step's decodes within `budget` spare tokens; drafted sequences leave
        `plan.decodes` (their slots are appended here) -> their drafts."""
        if not self.enabled or not plan.decodes:
            return []
        t0 = time.perf_counter()
        kv = self.kv
        drafts: list[Draft] = []
        keep: list[Sequence] = []
        for seq in plan.decodes:
            k = min(self._draftable(seq), budget) if budget > 0 else 0
            proposed = self.drafter.propose(seq.key(), seq.request.req.namespace, k) if k > 0 else []
            grammar = seq.sampling.grammar if proposed and seq.sampling is not None else None
            if grammar is not None:  # cut before the first token the grammar forbids
                admitted = grammar.admitted(proposed)
                self.grammar_cut_tokens += len(proposed) - admitted
                del proposed[admitted:]
            if proposed and kv.new_blocks_for_append(seq, len(proposed)) <= kv.num_free:
                kv.append(seq, len(proposed))
                drafts.append(Draft(seq, seq.num_computed, proposed))
                budget -= len(proposed)
            else:
                keep.append(seq)
        if drafts:
            plan.decodes[:] = keep
        if len(self.k) > 4 * len(plan.decodes) + 64:
            self.k.keep_only({s.seq_id for s in plan.decodes} | {d.seq.seq_id for d in drafts})
        self.draft_steps += 1
        self.draft_s += time.perf_counter() - t0
        return drafts

    @staticmethod
    def step_seq(d: Draft) -> StepSeq:
        """What the runner computes for a draft: the last sampled token, then the proposal."""
        seq = d.seq
        assert seq.table is not None
        return StepSeq(
            seq.seq_id,
            [seq.tokens[d.start], *d.proposed],
            d.start,
            seq.table.blocks,
            seq.sampling,
            draft=len(d.proposed),
        )

    def accept(self, d: Draft, picked: list[SampleResult]) -> tuple[int, bool]:
        """Accept the verified draft of `d` (`picked`: the model's token after each position) ->
        (tokens accepted into the sequence, whether that ended its request's last live sequence)."""
        seq, proposed = d.seq, d.proposed
        n = 0
        while n < len(proposed) and picked[n].token_id == proposed[n]:
            n += 1
        seq.num_computed = d.start + 1
        self.kv.truncate(seq, d.start + 1 + n)  # the rejected draft tokens' slots go
        self.drafted_tokens += len(proposed)
        self.k.update(seq.seq_id, len(proposed), n)
        accept = self.outputs.accept
        kv = self.kv
        for i in range(n + 1):
            kv.insert_full_blocks(seq)
            if i < n:  # counted before it is accepted: the output that carries it reports it
                seq.accepted_draft_tokens += 1
                self.accepted_tokens += 1
            if accept(seq, picked[i]):
                return i + 1, True
            if seq.status is not SeqStatus.RUNNING:
                return i + 1, False
            if i < n:
                seq.num_computed += 1  # the accepted draft token's KV is in the table
        kv.insert_full_blocks(seq)
        return n + 1, False
