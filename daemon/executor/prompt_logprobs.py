"""Prompt logprobs: each prompt token's log-probability under the model, computed from the prefill.

The logits at position q predict token q + 1, so a prompt of L tokens has L - 1 scored positions
(0 .. L - 2) and its first token has none. `PromptLogprobs` collects them as the prefill computes its
chunks (`ModelRunner.run` calls `score_chunk` for a chunk that carries one); the engine reads the
result once every position is scored.

NOTE: the distribution is the model's raw one (no logit bias, penalty or temperature), as vLLM's
prompt logprobs. The logits are projected `SCORE_ROWS` positions at a time, so a long chunk never
holds more than [SCORE_ROWS, vocab] logits at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Positions projected to logits at once: 128 x 49,152 fp32 logits are 25 MB.
SCORE_ROWS = 128


class PromptLogprobs:
    """One request's prompt logprobs, filled in position order as its prefill runs.

    `top`: how many alternatives each position reports (the request's `prompt_logprobs`). `done`:
    positions scored so far, all of [0, done); a sequence that resumes after a preemption computes
    from a prefix no longer than `done` (see `cached_prefix_limit`), so no position is ever skipped.
    """

    def __init__(self, prompt: Sequence[int], top: int) -> None:
        self.prompt = list(prompt)
        self.top = top
        self.done = 0
        self.logprobs: list[float] = []
        self.tops: list[tuple[tuple[int, float], ...]] = []

    @property
    def positions(self) -> int:
        """Positions to score: every prompt position but the last (its logits predict the output)."""
        return max(0, len(self.prompt) - 1)

    @property
    def complete(self) -> bool:
        return self.done >= self.positions

    def cached_prefix_limit(self) -> int:
        """How many leading prompt tokens a (re-)admission may take from the prefix cache: none
        until every position is scored, since cached tokens have no hidden states here (vLLM v1 does
        not read the prefix cache for a request with prompt logprobs either)."""
        return len(self.prompt) if self.complete else self.done

    def wanted(self, start: int, n: int) -> range:
        """The positions of a chunk computing [start, start + n) that still need a score."""
        return range(max(start, self.done), min(start + n, self.positions))

    def record(self, first: int, logprobs: list[float], tops: list[tuple[tuple[int, float], ...]]) -> None:
        """Store the scores of positions [first, first + len(logprobs)); first <= done."""
        if first > self.done:
            raise ValueError(f"prompt logprobs: position {first} scored before position {self.done}")
        skip = self.done - first
        self.logprobs += logprobs[skip:]
        self.tops += tops[skip:]
        self.done = len(self.logprobs)

    def entries(self) -> list[tuple[int, float | None, tuple[tuple[int, float], ...]]]:
        """(token id, logprob or None for the first token, top alternatives) per prompt token."""
        out: list[tuple[int, float | None, tuple[tuple[int, float], ...]]] = []
        if self.prompt:
            out.append((self.prompt[0], None, ()))
        for q in range(self.done):
            out.append((self.prompt[q + 1], self.logprobs[q], self.tops[q]))
        return out


def score_chunk(
    hidden: torch.Tensor,
    first_row: int,
    start: int,
    n: int,
    scores: PromptLogprobs,
    project: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Score what `scores` still wants of a chunk computing positions [start, start + n), whose
    hidden states are `hidden[first_row : first_row + n]`; `project` maps hidden rows to logits."""
    wanted = scores.wanted(start, n)
    if not wanted:
        return
    prompt = scores.prompt
    k = scores.top
    logprobs: list[float] = []
    tops: list[tuple[tuple[int, float], ...]] = []
    for a in range(wanted.start, wanted.stop, SCORE_ROWS):
        b = min(a + SCORE_ROWS, wanted.stop)
        rows = hidden[first_row + a - start : first_row + b - start]
        logits = project(rows).float()
        lse = torch.logsumexp(logits, dim=1, keepdim=True)
        target = torch.tensor(prompt[a + 1 : b + 1], dtype=torch.int64, device=logits.device)
        logprobs += (logits.gather(1, target.unsqueeze(1)) - lse).squeeze(1).tolist()
        if k:
            values, ids = torch.topk(logits, k, dim=1)
            values -= lse
            tops += [
                tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)
            ]
        else:
            tops += [()] * (b - a)
    scores.record(wanted.start, logprobs, tops)
