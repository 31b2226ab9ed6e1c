"""Copy-on-write forks: n > 1 parallel sampling, beam search, session forks."""

from __future__ import annotations

import math

import pytest
import torch
from engine_kit import SYSTEM, assert_all_free, greedy, make_core, run, sampled

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.runner import StepSeq
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


def test_seeded_n8_equals_eight_independent_runs(smollm: LoadedModel) -> None:
    """Child i of an n=8 request with seed s samples exactly like a lone request with seed s + i."""
    prompt = smollm.tokenizer.encode(SYSTEM + "\nUser: Tell me a story.\nAssistant:")
    core = make_core(smollm)
    col = run(core, [GenerateRequest("fork", prompt, sampled(seed=1234, max_tokens=10, n=8))])
    forked = [col.tokens("fork", i) for i in range(8)]
    assert all(col.final("fork", i).finish_reason == "length" for i in range(8))
    assert len(set(map(tuple, forked))) > 1  # really sampled, not 8 copies
    assert core.stats().peak_active_blocks < 8 * core.kv.blocks_for(len(prompt))  # prompt shared
    assert_all_free(core)
    solo_core = make_core(smollm, prefix_caching=False)
    solo = run(
        solo_core, [GenerateRequest(f"s{i}", prompt, sampled(seed=1234 + i, max_tokens=10)) for i in range(8)]
    )
    assert forked == [solo.tokens(f"s{i}") for i in range(8)]
    assert_all_free(solo_core)


def _score(lm: LoadedModel, prompt: list[int], gen: list[int]) -> float:
    """Sum of log p(gen[i] | prompt + gen[:i]) computed in one pass."""
    core = make_core(lm, num_blocks=64)
    toks = prompt + gen
    n_blocks = core.kv.blocks_for(len(toks))
    logits = core.runner.step_logits([StepSeq(1, toks, 0, list(range(1, n_blocks + 1)), None)])
    lp = torch.log_softmax(logits.float(), dim=-1)
    return sum(float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(gen))


def test_beam_search(smollm: LoadedModel) -> None:
    prompt = smollm.tokenizer.encode("The three most important inventions in history are")
    core = make_core(smollm)
    col = run(
        core,
        [
            GenerateRequest("greedy", prompt, greedy(6)),
            GenerateRequest("b1", prompt, greedy(6), beam_width=1),
            GenerateRequest("b3", prompt, SamplingParams(max_tokens=6, ignore_eos=True, n=2), beam_width=3),
        ],
    )
    assert col.tokens("b1") == col.tokens("greedy")  # width 1 is greedy search
    best, second = col.tokens("b3", 0), col.tokens("b3", 1)
    assert len(best) == len(second) == 6 and best != second
    s_best, s_second, s_greedy = (_score(smollm, prompt, g) for g in (best, second, col.tokens("greedy")))
    assert s_best >= s_second - 1e-4
    assert s_best >= s_greedy - 1e-4  # the beam found something at least as likely as greedy
    assert math.isfinite(s_best)
    assert_all_free(core)


def test_session_forks_share_the_context(smollm: LoadedModel) -> None:
    """8 forks of a 1,000-token context: each costs only its own new tokens plus one copied partial
    block (the context's last, partially filled block)."""
    tok = smollm.tokenizer
    text = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(200))
    context = tok.encode(text)[:1000]
    core = make_core(smollm, num_blocks=512)
    bs = core.block_size
    core.sessions.create("agent")
    run(core, [GenerateRequest("ctx", context, greedy(1), session_id="agent")])
    base_tokens = len(core.sessions.get("agent").tokens)  # 1001: context + 1 generated
    assert core.sessions.get("agent").resident_tokens == 1000
    children = core.sessions.fork("agent", 8)
    assert [c.num_tokens for c in children] == [base_tokens] * 8
    core.admin.flush("evict_unlocked")  # nothing but the leased context stays
    used_before = core.kv.usable_blocks() - core.kv.pool.num_free
    assert used_before == core.kv.blocks_for(1000)
    core.admin.peak_used_blocks = 0
    new_tokens, gen = 10, 5
    turns = [tok.encode(f" Step {i} of {SYSTEM[:30]}")[:new_tokens] for i in range(8)]
    assert all(len(t) == new_tokens for t in turns)
    col = run(
        core,
        [
            GenerateRequest(f"c{i}", turns[i], greedy(gen), session_id=c.session_id)
            for i, c in enumerate(children)
        ],
    )
    assert all(col.final(f"c{i}").cached_tokens == 1000 for i in range(8))
    # Per child: its table = the 62 shared full blocks + one copied partial block + blocks for what
    # it computes beyond that block (its own new tokens).
    computed = base_tokens + new_tokens + gen - 1
    own = core.kv.blocks_for(computed) - 1000 // bs
    assert own == 2
    assert core.admin.peak_used_blocks - used_before == 8 * own
    assert core.admin.peak_used_blocks < 8 * core.kv.blocks_for(computed) / 4  # vs. 8 private copies
    for c in children:
        core.sessions.close(c.session_id)
    core.sessions.close("agent")
    assert_all_free(core)
