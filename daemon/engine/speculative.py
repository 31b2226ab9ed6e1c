"""Speculative decoding: decoding sequences verify drafted tokens in the step's one forward pass.

A drafted decode becomes a chunk of its last token + k drafts; the matching prefix and the model's next
pick are accepted through `Outputs.accept`. NOTE: exact for greedy rows, distribution-preserving for
sampled ones; drafts live only within their step. Never drafted: seeds, penalties, beams, logprobs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from radixd.daemon.engine.draft_budget import Acceptance, DraftBudget, StepCost
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
        self.acceptance = Acceptance()
        self.budget = DraftBudget(StepCost())  # its cost is fed by the engine after each step
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

    def observe(self, rows: int, seconds: float, drafted: bool) -> None:
        """A step computed `rows` tokens (`drafted`: drafts among them) in `seconds` (what the draft
        budget learns step costs from)."""
        self.budget.cost.observe(rows, seconds, drafted)

    def plan(self, plan: StepPlan, budget: int) -> list[Draft]:
        """Draft for the step's decodes within `budget` spare tokens and the draft budget (moving the
        drafted ones out of `plan.decodes`)."""
        if not self.enabled or not plan.decodes:
            return []
        t0 = time.perf_counter()
        kv, rate = self.kv, self.acceptance.rate
        emits = sum(1 for p in plan.chunks if p.start + p.n == len(p.seq.tokens))
        self.budget.start(sum(p.n for p in plan.chunks) + len(plan.decodes), len(plan.decodes) + emits)
        wanted = [(seq, k) for seq in plan.decodes if (k := self._draftable(seq)) > 0]
        wanted.sort(key=lambda w: rate(w[0].seq_id), reverse=True)  # the likeliest drafts first
        drafts: list[Draft] = []
        drafted: set[int] = set()
        for seq, most in wanted:
            if budget <= 0:
                break
            p = rate(seq.seq_id)
            k = self.budget.rows_for(p, min(most, budget))
            if k == 0:
                break  # NOTE: the rest are accepted less often: the budget gives them no rows either
            proposed = self.drafter.propose(seq.key(), seq.request.req.namespace, k)
            grammar = seq.sampling.grammar if proposed and seq.sampling is not None else None
            if grammar is not None:  # cut before the first token the grammar forbids
                admitted = grammar.admitted(proposed)
                self.grammar_cut_tokens += len(proposed) - admitted
                del proposed[admitted:]
            if proposed and kv.new_blocks_for_append(seq, len(proposed)) <= kv.num_free:
                kv.append(seq, len(proposed))
                drafts.append(Draft(seq, seq.num_computed, proposed))
                drafted.add(seq.seq_id)
                self.budget.take(p, len(proposed))
                budget -= len(proposed)
        if drafts:
            plan.decodes[:] = [s for s in plan.decodes if s.seq_id not in drafted]
        if len(self.k) > 4 * len(plan.decodes) + 64:
            live = {s.seq_id for s in plan.decodes} | drafted
            self.k.keep_only(live)
            self.acceptance.keep_only(live)
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
            window_tables=seq.window.pages if seq.window is not None else (),
        )

    def accept(self, d: Draft, picked: list[SampleResult]) -> tuple[int, bool]:
        """Accept the verified draft of `d` -> (tokens accepted, whether the request's last one ended)."""
        seq, proposed = d.seq, d.proposed
        n = 0
        while n < len(proposed) and picked[n].token_id == proposed[n]:
            n += 1
        seq.num_computed = d.start + 1
        self.kv.truncate(seq, d.start + 1 + n)  # the rejected draft tokens' slots go
        self.drafted_tokens += len(proposed)
        self.k.update(seq.seq_id, len(proposed), n)
        self.acceptance.update(seq.seq_id, len(proposed), n)
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
