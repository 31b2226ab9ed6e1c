"""Memory pressure: preemption by recompute or swap never changes outputs, never stalls on session
leases, and leaks nothing."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from engine_kit import QUESTIONS, SYSTEM, Collector, assert_all_free, greedy, make_core, run, sampled

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


def _load(smollm: LoadedModel) -> list[GenerateRequest]:
    tok = smollm.tokenizer
    reqs = []
    for i, q in enumerate(QUESTIONS):
        p = tok.encode(SYSTEM[: 40 + 15 * i] + "\nUser: " + q + "\nAssistant:")
        reqs.append(GenerateRequest(f"g{i}", p, greedy(12)))
        reqs.append(GenerateRequest(f"s{i}", p, sampled(seed=7 + i, max_tokens=12)))
    reqs.append(GenerateRequest("n3", reqs[0].prompt_token_ids, sampled(seed=99, max_tokens=12, n=3)))
    return reqs


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_small_pool_completes_everything_like_a_big_one(smollm: LoadedModel, mode: str) -> None:
    reqs = _load(smollm)
    big = make_core(smollm, num_blocks=512)
    ref = run(big, reqs)
    need = sum(big.kv.blocks_for(len(r.prompt_token_ids) + 12) for r in reqs)
    small_blocks = 16  # 15 usable: far less than the blocks the load holds at once
    assert need > 2 * small_blocks
    extra = {"preemption_mode": "swap", "num_host_blocks": 24} if mode == "swap" else {}
    small = make_core(smollm, num_blocks=small_blocks, **extra)
    col = run(small, reqs)
    for r in reqs:
        for i in range(r.sampling.n):
            assert col.tokens(r.request_id, i) == ref.tokens(r.request_id, i), (r.request_id, i)
            assert col.text(r.request_id, i) == ref.text(r.request_id, i)
            assert col.final(r.request_id, i).finish_reason == "length"
    stats = small.stats()
    assert stats.preemptions > 0
    if mode == "swap":
        assert stats.preemptions_swap > 0 and stats.swapped_in_blocks > 0
        assert stats.host_free_blocks == 24
    assert_all_free(small)
    assert_all_free(big)


def test_random_aborts_leak_nothing(smollm: LoadedModel) -> None:
    """500 aborts at random moments (waiting, prefilling, decoding, after the end, unknown ids)."""
    rng = random.Random(5)
    vocab = smollm.config.vocab_size
    core = make_core(smollm, num_blocks=96, max_num_seqs=48)
    col = Collector()
    issued = 0
    submitted: list[str] = []
    prefix = [rng.randrange(vocab) for _ in range(16)]
    k = 0
    while issued < 500:
        for _ in range(rng.randrange(12, 24)):
            k += 1
            rid = f"r{k}"
            body = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
            prompt = (prefix if rng.random() < 0.5 else []) + body
            n = 2 if rng.random() < 0.15 else 1
            core.requests.add(
                GenerateRequest(rid, prompt, sampled(seed=k, max_tokens=rng.randrange(1, 6), n=n)), col
            )
            submitted.append(rid)
        for _ in range(rng.randrange(20, 32)):
            roll = rng.random()
            if roll < 0.05:
                core.requests.abort(f"unknown-{issued}")  # never submitted: remembered, harmless
            else:
                core.requests.abort(rng.choice(submitted[-50:]))  # in flight, or already finished
            issued += 1
        core.step()
        assert core.kv.pool.num_free + core.kv.tree.evictable_blocks() <= core.kv.usable_blocks()
    core.run_until_idle()
    for rid in submitted:
        n = 2 if (rid, 1) in col.outs else 1
        for i in range(n):
            outs = col.outs[(rid, i)]
            assert sum(o.finished for o in outs) == 1 and outs[-1].finished, rid
            assert outs[-1].finish_reason in ("abort", "length", "stop")
    aborted = sum(col.final(r).finish_reason == "abort" for r in submitted)
    assert aborted > 100
    assert_all_free(core)


def _idle_lease_scenario(core: EngineCore) -> tuple[Collector, list[int]]:
    """A session turn "t" and a longer request "b" share a 16-block pool; "b" is preempted, then "t"
    ends and its idle session locks 8 blocks, so "b" needs more than what is left. -> outputs and the
    swapped-out count seen after every step."""
    core.sessions.create("sess")
    col = Collector()
    core.requests.add(
        GenerateRequest("t", [11 + i % 50 for i in range(96)], greedy(24), session_id="sess"), col
    )
    core.step()
    core.requests.add(GenerateRequest("b", [300 + i % 70 for i in range(130)], greedy(30)), col)
    return col, _drive(core)


def _busy_session_scenario(core: EngineCore) -> tuple[Collector, list[int]]:
    """A session holds 150 cached tokens (10 blocks of 16); its next turn "t2" is preempted by an older
    request "r". Swapping "t2" back in needs 11 fresh blocks beside the session's 10: only
    recompute (sharing the session's prefix) fits, and the busy session's lease is never shed."""
    core.sessions.create("s")
    run(core, [GenerateRequest("t1", [11 + i % 50 for i in range(150)], greedy(1), session_id="s")])
    col = Collector()
    core.requests.add(GenerateRequest("r", [300 + i for i in range(40)], greedy(40)), col)
    core.step()
    core.requests.add(GenerateRequest("t2", [500 + i for i in range(10)], greedy(20), session_id="s"), col)
    return col, _drive(core)


def _drive(core: EngineCore) -> list[int]:
    """`run_until_idle` (which raises on a stall), recording how many sequences were swapped out."""
    swapped = []
    for _ in range(10_000):
        if not core.has_work():
            return swapped
        if not core.step():
            core.tick()
            assert core.step(), f"stalled: {core.stats()}"
        swapped.append(core.stats().swapped_seqs)
    raise AssertionError("still busy after 10000 steps")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("scenario", [_idle_lease_scenario, _busy_session_scenario])
def test_preempted_requests_resume_while_session_leases_hold_the_pool(
    smollm: LoadedModel, mode: str, scenario: Callable[[EngineCore], tuple[Collector, list[int]]]
) -> None:
    ref, _ = scenario(make_core(smollm, num_blocks=512))
    extra = {"preemption_mode": "swap", "num_host_blocks": 32} if mode == "swap" else {}
    core = make_core(smollm, num_blocks=17, **extra)  # 16 usable blocks
    col, swapped = scenario(core)
    for key in ref.outs:
        assert col.tokens(*key) == ref.tokens(*key), key
        assert col.final(*key).finish_reason == "length"
    stats = core.stats()
    if mode == "swap":
        assert stats.preemptions_swap == 1 and max(swapped) == 1  # the load shows it while it waits
    else:
        assert stats.preemptions_recompute == 1 and max(swapped) == 0
    if scenario is _busy_session_scenario:
        assert core.sessions.shed == 0 and stats.swap_fallbacks == (mode == "swap")
    else:
        assert core.sessions.shed == 1 and stats.swap_fallbacks == 0
    core.sessions.close("sess" if scenario is _idle_lease_scenario else "s")
    assert_all_free(core)
