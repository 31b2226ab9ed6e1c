"""Prompt logprobs in the engine: which prefill work scores a prompt, and handing the result out.

A request with `SamplingParams.prompt_logprobs` carries a `PromptLogprobs` (`RequestState`) from
admission until its first output. Its definition:

- the prompt is the prompt the engine runs: for a session turn, the session's tokens and the turn's;
- it is computed once per request, by the sequence that prefills the prompt (the only sequence when
  n == 1; the root that forks into the n samples or the beams otherwise), and goes out once, on the
  request's first output (`take_prompt_logprobs`);
- cached prompt tokens have no hidden states, so until every position is scored the request reads no
  more of the prefix cache than it scored (`PromptLogprobs.cached_prefix_limit`, read by the
  scheduler's admission: nothing, at first admission), as
  vLLM v1, which skips the prefix cache for a request with prompt logprobs. It still inserts its
  blocks, so the next request reuses them;
- a scored position must project its logits: a one-token prefill chunk the scheduler planned as a
  decode row (which projects none unless it samples) runs as a chunk instead (`plan_scoring`).

NOTE: a batch without such a request pays one empty-set test per step (`Requests.scoring`).
"""

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
    """Move `plan`'s one-token rows that score a prompt position into its chunks (in place), and
    forget the `pending` requests that need nothing more."""
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
