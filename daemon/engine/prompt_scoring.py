"""Prompt logprobs in the engine: which prefill work scores a prompt, and handing the result out.

Scored once (the full prompt, session tokens included) by the prefilling sequence, sent on the first
output. Cached tokens have no hidden states, so the request reads no more of the cache than it scored;
a one-token chunk that scores runs as a chunk, not a decode row, so it projects logits."""

from __future__ import annotations

from radixd.daemon.engine.scheduler import Planned, StepPlan
from radixd.daemon.engine.sequence import RequestState, Sequence
from radixd.daemon.engine.types import TokenLogprob
from radixd.daemon.executor.prompt_logprobs import PromptLogprobs


def scoring(seq: Sequence) -> PromptLogprobs | None:
    """What `seq`'s prefill still scores, if anything."""
    scores = seq.request.prompt_logprobs
    return None if scores is None or scores.complete else scores


def plan_scoring(plan: StepPlan, pending: set[RequestState]) -> None:
    """Move `plan`'s scoring one-token rows into its chunks; forget `pending` requests that are done."""
    for r in [r for r in pending if r.done or r.prompt_logprobs is None or r.prompt_logprobs.complete]:
        pending.discard(r)
    if not pending:
        return
    keep: list[Sequence] = []
    for seq in plan.decodes:
        scores = scoring(seq)
        if scores is not None and scores.wanted(seq.num_computed, 1):
            plan.chunks.append(Planned(seq, seq.num_computed, 1))
        else:
            keep.append(seq)
    plan.decodes = keep


def take_prompt_logprobs(r: RequestState) -> list[TokenLogprob | None] | None:
    """The request's prompt logprobs once all are scored, handed out once (then None)."""
    scores = r.prompt_logprobs
    if scores is None or not scores.complete:
        return None
    r.prompt_logprobs = None
    return [None if lp is None else TokenLogprob(tid, lp, list(top)) for tid, lp, top in scores.entries()]
