"""Sampling: validation, top-k/top-p/min-p support, seeds (alone == batched), penalties, logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from daemon_testkit import SAMPLING_VOCAB, random_logits

from radixd.daemon.executor.sampling import SamplingParams, SamplingState, greedy_argmax, sample

V = SAMPLING_VOCAB


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"seed": -1}, "seed"),
        ({"stop": ("",)}, "stop"),
        ({"stop": "abc"}, "stop"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
        ({"n": 0}, "n"),
        ({"top_k": 1.5}, "top_k"),
    ],
)
def test_invalid_params_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_greedy_is_argmax_and_ignores_seed() -> None:
    logits = random_logits(1, rows=4)
    states = [SamplingState(SamplingParams(temperature=0.0, seed=i)) for i in range(4)]
    got = [r.token_id for r in sample(logits, states)]
    assert got == logits.argmax(dim=1).tolist()


def test_top_k_never_leaves_top_k() -> None:
    logits = random_logits(2)
    allowed = set(torch.topk(logits[0], 5).indices.tolist())
    seen = set()
    for seed in range(300):
        st = SamplingState(SamplingParams(temperature=2.0, top_k=5, seed=seed))
        seen.add(sample(logits, [st])[0].token_id)
    assert seen <= allowed
    assert len(seen) >= 4  # high temperature: the draw really is random within the top k


def test_top_p_keeps_only_the_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.05, 0.05] + [0.0] * (V - 5)])
    logits = torch.log(probs.clamp_min(1e-12))
    seen = {
        sample(logits, [SamplingState(SamplingParams(top_p=0.75, seed=s))])[0].token_id for s in range(200)
    }
    assert seen == {0, 1}


def test_min_p_filters_unlikely_tokens() -> None:
    probs = torch.tensor([[0.4, 0.35, 0.2, 0.05] + [0.0] * (V - 4)])
    logits = torch.log(probs.clamp_min(1e-12))
    seen = {
        sample(logits, [SamplingState(SamplingParams(min_p=0.3, seed=s))])[0].token_id for s in range(200)
    }
    assert seen == {0, 1, 2}


def _draw(states: list[SamplingState], steps: int, logit_seed: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in states]
    for step in range(steps):
        logits = random_logits(logit_seed + step, rows=len(states))
        for i, r in enumerate(sample(logits, states)):
            states[i].append(r.token_id)
            out[i].append(r.token_id)
    return out


def test_same_seed_same_tokens_alone_and_batched() -> None:
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    steps = 20
    # Alone: row 0 of each step's logits.
    alone_state = SamplingState(params)
    alone = []
    for step in range(steps):
        logits = random_logits(100 + step, rows=5)[:1]
        tok = sample(logits, [alone_state])[0].token_id
        alone_state.append(tok)
        alone.append(tok)
    # Batched as row 0 with four other requests of different kinds.
    others = [
        SamplingParams(temperature=0.7, seed=1),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.3, top_k=3),
        SamplingParams(temperature=1.0, repetition_penalty=1.3, seed=9),
    ]
    states = [SamplingState(params)] + [SamplingState(p) for p in others]
    batched = _draw(states, steps, 100)[0]
    assert batched == alone
    # A different seed gives a different stream.
    assert (
        _draw([SamplingState(SamplingParams(temperature=1.0, top_p=0.9, seed=4321))], steps, 100)[0] != alone
    )


def test_fork_children_follow_their_own_seeds() -> None:
    parent = SamplingState(SamplingParams(temperature=1.0, seed=5), prompt_token_ids=[1, 2])
    a, b, a2 = parent.fork(10), parent.fork(11), parent.fork(10)
    ra, rb, ra2 = (_draw([s], 15, 7)[0] for s in (a, b, a2))
    assert ra == ra2 and ra != rb


def test_repetition_penalty_demotes_seen_tokens() -> None:
    logits = torch.zeros(1, V)
    logits[0, 3] = 2.0
    logits[0, 4] = 1.5
    st = SamplingState(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt_token_ids=[3])
    assert sample(logits, [st])[0].token_id == 4  # 2.0 / 2 = 1.0 < 1.5
    plain = SamplingState(SamplingParams(temperature=0.0), prompt_token_ids=[3])
    assert sample(logits, [plain])[0].token_id == 3


def test_presence_and_frequency_penalties_count_output_tokens() -> None:
    logits = torch.zeros(1, V)
    logits[0, 7] = 1.0
    logits[0, 8] = 0.5
    st = SamplingState(SamplingParams(temperature=0.0, frequency_penalty=0.3), prompt_token_ids=[7, 7, 7])
    assert sample(logits, [st])[0].token_id == 7  # the prompt does not count
    st.append(7)
    assert sample(logits, [st])[0].token_id == 7  # 1.0 - 0.3 > 0.5
    st.append(7)
    assert sample(logits, [st])[0].token_id == 8  # 1.0 - 0.6 < 0.5
    pres = SamplingState(SamplingParams(temperature=0.0, presence_penalty=0.6))
    pres.append(7)
    assert sample(logits, [pres])[0].token_id == 8


def test_min_tokens_masks_eos_and_stop_tokens() -> None:
    logits = torch.zeros(1, V)
    logits[0, 2] = 5.0  # eos
    logits[0, 9] = 4.0  # a stop token id
    st = SamplingState(SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(9,)), eos_token_ids=[2])
    assert sample(logits, [st])[0].token_id not in (2, 9)
    st.append(0)
    st.append(0)
    assert sample(logits, [st])[0].token_id == 2


def test_finish_reasons() -> None:
    st = SamplingState(SamplingParams(max_tokens=3, stop_token_ids=(9,)), eos_token_ids=[2])
    st.append(5)
    assert st.finish_reason(5) is None
    st.append(9)
    assert st.finish_reason(9) == "stop"
    ign = SamplingState(SamplingParams(max_tokens=2, ignore_eos=True), eos_token_ids=[2])
    ign.append(2)
    assert ign.finish_reason(2) is None
    ign.append(2)
    assert ign.finish_reason(2) == "length"


def test_logprobs_of_chosen_and_top_n() -> None:
    logits = random_logits(3)
    st = SamplingState(SamplingParams(temperature=0.0, logprobs=3))
    (res,) = sample(logits, [st])
    lp = torch.log_softmax(logits[0], dim=0)
    assert res.logprob == pytest.approx(float(lp[res.token_id]), abs=1e-6)
    top = torch.topk(lp, 3)
    assert [t for t, _ in res.top_logprobs] == top.indices.tolist()
    assert [v for _, v in res.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-6)
    assert sample(logits, [SamplingState(SamplingParams())])[0].logprob is None


@pytest.mark.parametrize("vocab", [1, 127, 128, 255, 256, 257, 511, 513, 1000, 49152, 49153])
def test_greedy_argmax_equals_torch_argmax(vocab: int) -> None:
    """Same index as torch.argmax for any width (short last group included), with ties, NaN and
    maxima in the last column."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(9, vocab, generator=g)
    x[1] = 0.5  # all tied: the first column wins
    x[2, -1] = 100.0  # maximum in the last (possibly short) group
    x[3, vocab // 2] = float("nan")
    x[4, -1] = float("nan")
    x[5, : min(vocab, 300) : 7] = 50.0  # ties spread over several groups
    x[6] = x[6].round()  # many small ties
    x[7] = float("-inf")
    assert torch.equal(greedy_argmax(x), torch.argmax(x, dim=1))
