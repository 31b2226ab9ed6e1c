"""Memory pressure: preemption by recompute or swap never changes outputs and leaks nothing."""

from __future__ import annotations

import random

import pytest
from engine_kit import QUESTIONS, SYSTEM, Collector, assert_all_free, greedy, make_core, run, sampled

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
    assert stats["preemptions"] > 0
    if mode == "swap":
        assert stats["preemptions_swap"] > 0 and stats["swapped_in_blocks"] > 0
        assert stats["host_free_blocks"] == 24
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
            core.add_request(
                GenerateRequest(rid, prompt, sampled(seed=k, max_tokens=rng.randrange(1, 6), n=n)), col
            )
            submitted.append(rid)
        for _ in range(rng.randrange(20, 32)):
            roll = rng.random()
            if roll < 0.05:
                core.abort_request(f"unknown-{issued}")  # never submitted: remembered, harmless
            else:
                core.abort_request(rng.choice(submitted[-50:]))  # in flight, or already finished
            issued += 1
        core.step()
        assert core.pool.num_free + core.tree.evictable_blocks() <= core.usable_blocks()
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
