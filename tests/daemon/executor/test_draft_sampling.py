"""Rejection sampling of speculative drafts (executor/draft_sampling.py): each emitted token is distributed
as plain sampling's, whether the draft guesses well or badly, checked by a chi-square test on a small
vocabulary; `sampling.distribution` is what `sample` draws from."""

from __future__ import annotations

import pytest
import torch

from radixd.daemon.executor.draft_sampling import verify_sampled
from radixd.daemon.executor.sampling import SamplingParams, SamplingState, distribution, sample

VOCAB = 6
TRIALS = 1500
# chi-square critical value, 5 degrees of freedom, p = 0.001: a correct sampler fails 1 run in 1000.
CHI2_5_999 = 20.52


# Thousands of tiny draws: a second thread only adds OpenMP overhead.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _chi2(counts: torch.Tensor, p: torch.Tensor) -> float:
    n = float(counts.sum())
    expected = p * n
    keep = expected > 0
    assert int(counts[~keep].sum()) == 0, "a token of probability 0 was emitted"
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def test_distribution_is_what_sample_draws_from() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    params = SamplingParams(temperature=0.7, top_k=4, top_p=0.9, seed=3)
    p = distribution(logits, SamplingState(params))[0]
    assert abs(float(p.sum()) - 1.0) < 1e-6 and float(p[4]) == float(p[5]) == 0.0  # top-k cut them
    st = SamplingState(params)
    counts = torch.zeros(VOCAB)
    for _ in range(TRIALS):
        counts[sample(logits, [st])[0].token_id] += 1
    assert _chi2(counts, p) < CHI2_5_999


def test_rejection_sampling_keeps_the_distribution() -> None:
    """The first emitted token follows p0 and the second (given the first draft token was accepted)
    follows p1, for a likely and an unlikely draft, with top-p truncation in play."""
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 1.5
    params = SamplingParams(temperature=0.9, top_p=0.95)
    st = SamplingState(params, seed=11)
    p = distribution(logits, st)
    for draft in ([int(p[0].argmax()), int(p[1].argmax())], [int(p[0].argmin()), 0]):
        first = torch.zeros(VOCAB)
        second = torch.zeros(VOCAB)
        lengths = torch.zeros(len(draft) + 2)
        for _ in range(TRIALS):
            out = verify_sampled(logits, draft, st)
            lengths[len(out)] += 1
            first[out[0].token_id] += 1
            if len(out) > 1:  # the first draft token was accepted: the next token is drawn at row 1
                second[out[1].token_id] += 1
        assert _chi2(first, p[0]) < CHI2_5_999, (draft, first, p[0])
        if second.sum() > 200:
            assert _chi2(second, p[1]) < CHI2_5_999, (draft, second, p[1])
        # Accepting the first draft token happens with probability p0(d0).
        accepted = float(lengths[2:].sum()) / TRIALS
        want = float(p[0, draft[0]])
        assert abs(accepted - want) < 4 * (want * (1 - want) / TRIALS) ** 0.5 + 1e-3
