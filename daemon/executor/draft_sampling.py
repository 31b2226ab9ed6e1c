"""Rejection sampling of a speculative draft for a sampled (temperature > 0) sequence.

The drafter proposes one token per position with certainty (its q is a point mass on the draft token
d), so the standard speculative rule (Leviathan et al., 2023; Chen et al., 2023) reduces to: with p the
distribution the sequence samples from at that position (`sampling.distribution`), accept d with
probability p(d); on rejection, draw from p with d removed (the residual max(p - q, 0), normalized)
and stop. When every draft token is accepted, the position after the draft is sampled from its p as
usual. Each emitted token is thus distributed exactly as plain sampling's (tests/daemon/
test_draft_sampling.py checks it statistically), although a seeded request draws different uniforms
than plain decoding would, so its tokens differ from a run without speculation.

Every uniform comes from the sequence's own generator, one row at a time: batch invariant, as
`sampling.sample` is.
"""

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
    """`logits` [len(draft) + 1, V]: row i scores the position after the draft's first i tokens.
    -> the accepted draft tokens, then one token drawn by the model (a residual or the next one)."""
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
