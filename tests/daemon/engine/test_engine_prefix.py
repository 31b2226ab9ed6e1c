"""Prefix reuse: conversations hit the cache, and caching never changes what is generated."""

from __future__ import annotations

import pytest
from engine_kit import QUESTIONS, SYSTEM, Collector, assert_all_free, greedy, make_core, run, sampled

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


def test_turn_two_reuses_turn_one_prompt_and_output(smollm: LoadedModel) -> None:
    """cached_tokens of turn 2 == len(turn-1 prompt) + len(turn-1 output) - 1.

    The one token recomputed is turn 1's last generated token: it was sampled but never fed back
    through the model, so it has no KV. Everything else (prompt and all other output tokens, including
    the partially filled last block, which is copied instead of recomputed) comes from the cache.
    """
    tok = smollm.tokenizer
    core = make_core(smollm)
    p1 = tok.encode(SYSTEM + "\nUser: " + QUESTIONS[0] + "\nAssistant:")
    col = run(core, [GenerateRequest("t1", p1, greedy(13))])
    out1 = col.tokens("t1")
    assert len(out1) == 13 and col.final("t1").cached_tokens == 0
    assert col.final("t1").prompt_tokens == len(p1)
    p2 = p1 + out1 + tok.encode("\nUser: " + QUESTIONS[1] + "\nAssistant:")
    col = run(core, [GenerateRequest("t2", p2, greedy(5))], col)
    assert col.final("t2").cached_tokens == len(p1) + len(out1) - 1
    assert col.final("t2").prompt_tokens == len(p2)
    # The same prompt again: all but its last token is cached (that one is recomputed for logits).
    col = run(core, [GenerateRequest("t3", p2, greedy(5))], col)
    assert col.final("t3").cached_tokens == len(p2) - 1
    assert col.tokens("t3") == col.tokens("t2")
    assert_all_free(core)


def test_session_turns_report_cached_tokens(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    core = make_core(smollm)
    info = core.sessions.create("chat", tokens=[])
    assert info.num_tokens == 0
    turn1 = tok.encode(SYSTEM + "\nUser: " + QUESTIONS[2] + "\nAssistant:")
    col = run(core, [GenerateRequest("s1", turn1, greedy(9), session_id="chat")])
    out1 = col.tokens("s1")
    after1 = core.sessions.get("chat")
    assert list(after1.tokens) == turn1 + out1 and after1.turns == 1
    assert after1.resident_tokens == len(turn1) + len(out1) - 1  # locked by the session's lease
    turn2 = tok.encode("\nUser: " + QUESTIONS[3] + "\nAssistant:")
    col = run(core, [GenerateRequest("s2", turn2, greedy(4), session_id="chat")], col)
    final = col.final("s2")
    assert final.prompt_tokens == len(turn1) + len(out1) + len(turn2)
    assert final.cached_tokens == len(turn1) + len(out1) - 1
    # The session's lease keeps its prefix resident through a flush; closing releases it.
    core.admin.flush("evict_unlocked")
    tokens = list(core.sessions.get("chat").tokens)
    assert core.kv.cached_len(tokens, "") == len(tokens) - 1
    # Closing with drop evicts the session's last cached node (its newest tokens), not shared ancestors.
    assert core.sessions.close("chat", keep_cached=False) > 0
    assert len(turn1) <= core.kv.cached_len(tokens, "") < len(tokens) - 1
    assert_all_free(core)


def _conversations(smollm: LoadedModel) -> list[list[int]]:
    tok = smollm.tokenizer
    return [tok.encode(SYSTEM + "\nUser: " + q + "\nAssistant:") for q in QUESTIONS]


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "batched"])
def test_outputs_identical_with_cache_on_and_off(smollm: LoadedModel, batched: bool) -> None:
    prompts = _conversations(smollm)[:4]
    results = {}
    for caching in (True, False):
        core = make_core(smollm, prefix_caching=caching, max_num_batched_tokens=96)
        col = Collector()
        reqs = []
        for i, p in enumerate(prompts):
            reqs.append(GenerateRequest(f"g{i}", p, greedy(8)))
            reqs.append(GenerateRequest(f"s{i}", p, sampled(seed=100 + i, max_tokens=8)))
        if batched:
            run(core, reqs, col)
        else:
            for r in reqs:
                run(core, [r], col)
        results[caching] = {r.request_id: col.tokens(r.request_id) for r in reqs}
        cached = sum(col.final(r.request_id).cached_tokens for r in reqs)
        if caching:
            assert cached > len(reqs) * 16  # the shared system prompt was reused
        else:
            assert cached == 0
        assert_all_free(core)
    assert results[True] == results[False]


def test_shared_uncached_prefix_is_computed_once(smollm: LoadedModel) -> None:
    """Requests arriving together with one long uncached prefix: the first computes it, the others
    wait for it and then hit it."""
    tok = smollm.tokenizer
    prefix = tok.encode(SYSTEM + " " + SYSTEM)
    prompts = [prefix + tok.encode("\nUser: " + q + "\nAssistant:") for q in QUESTIONS]
    shared = len(prefix)
    core = make_core(smollm)  # the budget would fit every prompt in one step
    col = run(core, [GenerateRequest(f"q{i}", p, greedy(3)) for i, p in enumerate(prompts)])
    finals = [col.final(f"q{i}") for i in range(len(prompts))]
    assert finals[0].cached_tokens == 0
    full = shared - shared % core.block_size
    assert all(f.cached_tokens >= full for f in finals[1:]), [f.cached_tokens for f in finals]
    assert core.stats().held_for_shared_prefix > 0
    assert_all_free(core)


def test_longest_prefix_ordering_runs_all(smollm: LoadedModel) -> None:
    prompts = _conversations(smollm)
    core = make_core(smollm, schedule_policy="lpm", max_num_seqs=2)
    run(core, [GenerateRequest("warm", prompts[0], greedy(2))])
    col = run(core, [GenerateRequest(f"l{i}", p, greedy(3)) for i, p in enumerate(prompts)])
    assert all(col.finished(f"l{i}") for i in range(len(prompts)))
    assert_all_free(core)


def test_hits_and_misses_add_up_to_the_prompt_tokens(smollm: LoadedModel) -> None:
    """hit_tokens = the requests' cached_tokens and hit + miss = their prompt tokens, whatever else
    looks up the tree: session relocks, lookups, admissions retried for memory, preemptions."""
    tok = smollm.tokenizer
    core = make_core(smollm, num_blocks=17)  # 16 usable blocks: admissions wait and get preempted
    core.sessions.create("s", tokens=tok.encode(SYSTEM))
    prompts = [
        tok.encode(SYSTEM[: 60 + 20 * i] + f"\nUser: {q}\nAssistant:") for i, q in enumerate(QUESTIONS)
    ]
    reqs = [GenerateRequest(f"r{i}", p, greedy(16)) for i, p in enumerate(prompts)]
    reqs.append(GenerateRequest("n2", prompts[0], sampled(seed=3, max_tokens=4, n=2)))
    col = run(core, reqs)
    for turn in ("t1", "t2"):
        run(core, [GenerateRequest(turn, tok.encode(f"\nUser: {turn}?"), greedy(4), session_id="s")], col)
        core.kv.cached_len(prompts[1], "")
    stats = core.stats()
    assert stats.preemptions > 0 and core.kv.cache_stats().hit_tokens > 0
    finals = [col.final(rid) for rid in [r.request_id for r in reqs] + ["t1", "t2"]]
    cached = sum(f.cached_tokens for f in finals)
    assert cached > 0 and stats.hit_tokens == cached
    assert stats.hit_tokens + stats.miss_tokens == sum(f.prompt_tokens for f in finals)
    assert stats.prompt_tokens == sum(f.prompt_tokens for f in finals)
