"""Prompt logprobs: each prompt token's log-probability under the model, computed from the prefill.

Position q predicts token q + 1; raw distribution (as vLLM), `SCORE_ROWS` positions at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Positions projected to logits at once: 128 x 49,152 fp32 logits are 25 MB.
SCORE_ROWS = 128


class PromptLogprobs:
    """One request's prompt logprobs, filled in position order; `done`: positions [0, done) scored."""

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
        """Leading prompt tokens an admission may take from the cache (none until all are scored)."""
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
    """Score what `scores` still wants of a chunk at [start, start + n) (hidden from `first_row`)."""
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
