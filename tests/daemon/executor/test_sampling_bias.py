"""Logit bias in the sampler and the validation of `logit_bias` / `prompt_logprobs`."""

from __future__ import annotations

import math

import pytest
import torch
from daemon_testkit import SAMPLING_VOCAB, random_logits

from radixd.daemon.executor.sampling import SampleResult, SamplingParams, SamplingState, sample

V = SAMPLING_VOCAB


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"logit_bias": ((1, 100.5),)}, r"logit_bias\[1\] must be in \[-100, 100\]"),
        ({"logit_bias": ((1, -101.0),)}, r"logit_bias\[1\]"),
        ({"logit_bias": ((1, math.nan),)}, r"logit_bias\[1\] must be finite"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias token id"),
        ({"logit_bias": ((1.5, 1.0),)}, "logit_bias token id"),
        ({"logit_bias": ((3, 1.0), (3, 2.0))}, "names token id 3 twice"),
        ({"logit_bias": ((3,),)}, "pairs"),
        ({"logit_bias": "3:1"}, "logit_bias must map"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs must be <= 20"),
    ],
)
def test_invalid_values_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_a_mapping_is_stored_as_sorted_pairs() -> None:
    p = SamplingParams(logit_bias={7: -2, 3: 1.5})  # type: ignore[arg-type]
    assert p.logit_bias == ((3, 1.5), (7, -2.0))
    assert SamplingParams(prompt_logprobs=0).prompt_logprobs == 0
    hash(p)  # still a frozen, hashable value


def test_a_biased_greedy_request_leaves_the_fast_path() -> None:
    assert SamplingState(SamplingParams(temperature=0.0)).plain
    assert not SamplingState(SamplingParams(temperature=0.0, logit_bias=((1, 0.5),))).plain
    # Prompt logprobs are the prefill's business, not the sampler's.
    assert SamplingState(SamplingParams(temperature=0.0, prompt_logprobs=5)).plain


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bias_forces_a_token(temperature: float) -> None:
    logits = random_logits(1)
    weakest = int(torch.argmin(logits[0]))
    st = SamplingState(SamplingParams(temperature=temperature, seed=5, logit_bias=((weakest, 100.0),)))
    for _ in range(20):
        assert sample(logits, [st])[0].token_id == weakest


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bias_forbids_tokens(temperature: float) -> None:
    logits = random_logits(2)
    top = torch.topk(logits[0], 5).indices.tolist()
    st = SamplingState(
        SamplingParams(temperature=temperature, seed=6, logit_bias=tuple((t, -100.0) for t in top))
    )
    picked = {sample(logits, [st])[0].token_id for _ in range(200)}
    assert picked and not picked & set(top)


def test_logprobs_describe_the_biased_distribution() -> None:
    logits = random_logits(3)
    bias = ((4, 3.0), (9, -2.5))
    st = SamplingState(SamplingParams(temperature=0.0, logprobs=2, logit_bias=bias))
    (res,) = sample(logits, [st])
    biased = logits[0].clone()
    for t, b in bias:
        biased[t] += b
    lp = torch.log_softmax(biased, dim=0)
    assert res.token_id == int(torch.argmax(biased))
    assert res.logprob == pytest.approx(float(lp[res.token_id]), abs=1e-6)
    assert [t for t, _ in res.top_logprobs] == torch.topk(lp, 2).indices.tolist()


def _results(params: list[SamplingParams], steps: int) -> list[list[SampleResult]]:
    states = [SamplingState(p) for p in params]
    out: list[list[SampleResult]] = [[] for _ in params]
    for step in range(steps):
        logits = random_logits(200 + step, rows=len(params))
        before = logits.clone()
        for row, res in enumerate(sample(logits, states)):
            states[row].append(res.token_id)
            out[row].append(res)
        assert torch.equal(logits, before)  # the bias goes to a copy, never the caller's logits
    return out


def test_rows_without_bias_are_bitwise_unchanged_in_a_mixed_batch() -> None:
    others = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.9, top_p=0.8, seed=11, logprobs=1),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.1, repetition_penalty=1.2, seed=12, logprobs=2),
    ]
    biased = SamplingParams(temperature=0.7, seed=13, logit_bias=((0, 100.0), (1, -100.0)))
    unbiased = SamplingParams(temperature=0.7, seed=13)
    mixed = _results([others[0], others[1], biased, others[2], others[3]], 12)
    plain = _results([others[0], others[1], unbiased, others[2], others[3]], 12)
    for row in (0, 1, 3, 4):
        # Token ids, logprobs and top logprobs compared exactly: not one bit may move.
        assert mixed[row] == plain[row]
    assert [r.token_id for r in mixed[2]] == [0] * 12
