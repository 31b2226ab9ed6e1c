"""Prompt logprobs and logit bias in the engine, with the real model in float32.

Every prompt logprob is compared with the log-softmax of one direct full forward over the prompt (the
same weights on a runner of its own), whatever path computed it: one prefill, small chunks, one-token
chunks, a root that forks, a prompt whose prefix is cached, a session turn.
"""

from __future__ import annotations

import pytest
import torch
from engine_kit import QUESTIONS, SYSTEM, Collector, assert_all_free, greedy, make_core, run, sampled

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.prompt_scoring import scoring
from radixd.daemon.engine.sequence import Sequence
from radixd.daemon.engine.types import GenerateRequest, RequestOutput, TokenLogprob
from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow

# float32 throughout; chunked and one-shot prefills only differ in summation order.
ATOL = 2e-4


def reference(core: EngineCore, prompt: list[int]) -> torch.Tensor:
    """log_softmax of a direct full forward over `prompt` on a fresh runner: [len(prompt), vocab]."""
    runner = ModelRunner(core.runner.model, num_blocks=len(prompt) // 16 + 2, block_size=16)
    assert runner.dtype == torch.float32
    table = list(range(1, len(prompt) // 16 + 2))
    logits = runner.step_logits([StepSeq(0, prompt, 0, table, None)])
    return torch.log_softmax(logits.double(), dim=1)


def check(entries: list[TokenLogprob | None] | None, prompt: list[int], ref: torch.Tensor, k: int) -> None:
    assert entries is not None and len(entries) == len(prompt)
    assert entries[0] is None
    for q, e in enumerate(entries[1:]):
        assert e is not None and e.token_id == prompt[q + 1]
        assert e.logprob == pytest.approx(float(ref[q, prompt[q + 1]]), abs=ATOL)
        assert len(e.top) == k
        if k:
            values, ids = torch.topk(ref[q], k)
            assert [v for _, v in e.top] == sorted((v for _, v in e.top), reverse=True)
            assert e.top[0][0] == int(ids[0])
            for (_, got), want in zip(e.top, values.tolist(), strict=True):
                assert got == pytest.approx(want, abs=ATOL)


def carried(outs: list[RequestOutput]) -> list[list[TokenLogprob | None]]:
    """The prompt logprobs the outputs carried (the request's first output only)."""
    return [o.prompt_logprobs for o in outs if o.prompt_logprobs is not None]


def prompt(lm: LoadedModel, i: int = 0) -> list[int]:
    return lm.tokenizer.encode(SYSTEM + "\nUser: " + QUESTIONS[i] + "\nAssistant:")


def test_prompt_logprobs_equal_a_full_forward(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    p = prompt(smollm)
    ref = reference(core, p)
    col = run(core, [GenerateRequest("a", p, greedy(4, prompt_logprobs=3))])
    outs = col.outs[("a", 0)]
    assert len(outs) == 4 and len(carried(outs)) == 1 and outs[0].prompt_logprobs is not None
    check(outs[0].prompt_logprobs, p, ref, 3)
    # k = 0: the logprob of each prompt token, no alternatives. The output itself is unchanged.
    col = run(
        core, [GenerateRequest("b", p, greedy(4, prompt_logprobs=0)), GenerateRequest("c", p, greedy(4))], col
    )
    check(col.outs[("b", 0)][0].prompt_logprobs, p, ref, 0)
    assert col.tokens("b") == col.tokens("a") == col.tokens("c")
    assert not carried(col.outs[("c", 0)])
    assert_all_free(core)


@pytest.mark.parametrize("chunk", [5, 16])
def test_prompt_logprobs_under_chunked_prefill(smollm: LoadedModel, chunk: int) -> None:
    """Chunks of 5 leave one-token chunks (run as decode rows unless they score) for a root of n=2."""
    core = make_core(smollm, max_num_batched_tokens=chunk)
    p = prompt(smollm, 1)
    p = p[: (len(p) - 2) // chunk * chunk + 2]  # the root computes len - 1 = k * chunk + 1 tokens
    ref = reference(core, p)
    # Alone, so the root's chunks are exactly chunk, chunk, ..., 1 (the last one a scored position).
    col = run(core, [GenerateRequest("two", p, sampled(7, 3, n=2, prompt_logprobs=2))])
    col = run(core, [GenerateRequest("one", p, greedy(3, prompt_logprobs=2))], col)
    check(carried(col.outs[("one", 0)])[0], p, ref, 2)
    got = carried(col.outs[("two", 0)]) + carried(col.outs[("two", 1)])
    assert len(got) == 1  # once per request, whichever index spoke first
    check(got[0], p, ref, 2)
    assert_all_free(core)


def test_prompt_logprobs_bypass_the_cached_prefix_and_still_insert(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    p = prompt(smollm, 2)
    ref = reference(core, p)
    col = run(core, [GenerateRequest("warm", p, greedy(2))])
    col = run(core, [GenerateRequest("scored", p, greedy(2, prompt_logprobs=1))], col)
    final = col.final("scored")
    assert final.cached_tokens == 0  # the cached prefix has no hidden states: recomputed
    check(carried(col.outs[("scored", 0)])[0], p, ref, 1)
    assert col.tokens("scored") == col.tokens("warm")
    # Its blocks went into the tree (the same prefix again, now recomputed by it), and a later
    # request without prompt logprobs reads them as usual.
    col = run(core, [GenerateRequest("after", p, greedy(2))], col)
    assert col.final("after").cached_tokens == len(p) - 1
    assert_all_free(core)


def test_prompt_logprobs_of_a_session_turn_cover_the_whole_prompt(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    core.sessions.create("s", tokens=[])
    turn1 = prompt(smollm, 3)
    col = run(core, [GenerateRequest("t1", turn1, greedy(5), session_id="s")])
    turn2 = smollm.tokenizer.encode("\nUser: " + QUESTIONS[4] + "\nAssistant:")
    col = run(core, [GenerateRequest("t2", turn2, greedy(3, prompt_logprobs=0), session_id="s")], col)
    full = turn1 + col.tokens("t1") + turn2
    assert col.final("t2").prompt_tokens == len(full)
    check(carried(col.outs[("t2", 0)])[0], full, reference(core, full), 0)
    core.sessions.close("s", keep_cached=False)
    assert_all_free(core)


def test_prompt_logprobs_with_beam_search(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    p = prompt(smollm, 5)
    col = run(core, [GenerateRequest("b", p, greedy(3, n=2, prompt_logprobs=1), beam_width=2)])
    got = carried(col.outs[("b", 0)]) + carried(col.outs[("b", 1)])
    assert len(got) == 1
    check(got[0], p, reference(core, p), 1)
    assert_all_free(core)


def test_logit_bias_forces_and_forbids_tokens(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    p = prompt(smollm)
    col = run(core, [GenerateRequest("plain", p, greedy(4, logprobs=1))])
    plain = col.tokens("plain")
    forced = smollm.tokenizer.encode(" banana", add_special_tokens=False)[0]
    col = run(
        core,
        [
            GenerateRequest("force", p, greedy(4, logit_bias=((forced, 100.0),), logprobs=1)),
            GenerateRequest("ban", p, greedy(4, logit_bias=((plain[0], -100.0),))),
            GenerateRequest("same", p, greedy(4)),
        ],
        col,
    )
    assert col.tokens("force") == [forced] * 4
    # Logprobs describe the biased distribution: the forced token is the top one, near-certain.
    lp = col.outs[("force", 0)][0].logprobs
    assert lp is not None and lp[0].top[0][0] == forced and lp[0].logprob > -1e-3
    assert col.tokens("ban")[0] != plain[0]
    assert col.tokens("same") == plain
    assert_all_free(core)


def test_a_logit_bias_id_outside_the_vocabulary_is_refused(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    req = GenerateRequest("x", prompt(smollm), greedy(2, logit_bias=((core.vocab_size, 1.0),)))
    with pytest.raises(ValueError, match="logit_bias token id"):
        core.validator.validate(req)
    col = Collector()
    core.requests.add(GenerateRequest("y", prompt(smollm), greedy(2)), col)
    core.run_until_idle()
    assert col.final("y").finish_reason == "length"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_prompt_logprobs_survive_preemption_mid_prefill(smollm: LoadedModel, mode: str) -> None:
    """A pool far smaller than the load: sequences are preempted while their prompt is being scored,
    and resume from no more of the cache than they scored."""
    extra = {"preemption_mode": "swap", "num_host_blocks": 24} if mode == "swap" else {}
    core = make_core(smollm, num_blocks=16, max_num_batched_tokens=24, **extra)
    reqs = []
    for i, q in enumerate(QUESTIONS):
        p = smollm.tokenizer.encode(SYSTEM[: 60 + 20 * i] + "\nUser: " + q + "\nAssistant:")
        reqs.append(
            GenerateRequest(f"r{i}", p, sampled(seed=i, max_tokens=12, prompt_logprobs=1), priority=-i)
        )
    reqs.append(GenerateRequest("n2", reqs[-1].prompt_token_ids, greedy(8, n=2, prompt_logprobs=1)))
    refs = {r.request_id: reference(core, r.prompt_token_ids) for r in reqs}
    preempted_scoring: list[bool] = []
    preempt = core.scheduler.preempt

    def watch(seq: Sequence) -> None:
        preempted_scoring.append(scoring(seq) is not None)
        preempt(seq)

    core.scheduler.preempt = watch  # type: ignore[method-assign]
    col = run(core, reqs)
    assert any(preempted_scoring), "no sequence was preempted while scoring its prompt"
    for r in reqs:
        got = [lp for i in range(r.sampling.n) for lp in carried(col.outs[(r.request_id, i)])]
        assert len(got) == 1, r.request_id
        check(got[0], r.prompt_token_ids, refs[r.request_id], 1)
    assert_all_free(core)
