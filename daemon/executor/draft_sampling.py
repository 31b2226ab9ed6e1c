"""Rejection sampling of a speculative draft for a sampled (temperature > 0) sequence: the draft is a
point mass, so accept d with probability p(d), else draw from p without d and stop. Emitted tokens are
distributed exactly as plain sampling's; uniforms come from the sequence's own generator (batch
invariant)."""

from __future__ import annotations

import torch

from radixd.daemon.executor.sampling import SampleResult, SamplingState, distribution


def _draw(state: SamplingState) -> float:
    return float(torch.rand((), generator=state.generator, dtype=torch.float64))


def _pick(p: torch.Tensor, u: float) -> int:
    """Inverse-CDF pick over `p` [V] (zeros never picked)."""
    cdf = torch.cumsum(p.double(), dim=0)
    i = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True))
    nz = torch.nonzero(p > 0).flatten()
    return min(i, int(nz[-1]))  # float rounding past the last kept token steps back to it


def verify_sampled(logits: torch.Tensor, draft: list[int], state: SamplingState) -> list[SampleResult]:
    """`logits` [len(draft) + 1, V] -> the accepted draft tokens, then one token drawn by the model."""
    p = distribution(logits, state)
    out: list[SampleResult] = []
    for i, d in enumerate(draft):
        row = p[i]
        if _draw(state) < float(row[d]):
            out.append(SampleResult(d))
            continue
        residual = row.clone()
        residual[d] = 0.0
        if float(residual.sum()) <= 0.0:  # p(d) < 1 only by rounding: nothing else to draw
            residual = row
        out.append(SampleResult(_pick(residual, _draw(state))))
        return out
    out.append(SampleResult(_pick(p[len(draft)], _draw(state))))
    return out
