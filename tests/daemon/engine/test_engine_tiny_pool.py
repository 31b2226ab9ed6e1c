"""A KV pool about one request large, in both KV layouts (a random-weight Gemma 3): every request either
is refused at admission (`Validator.check_fits`, the pool can never hold it) or runs to its end, never
waits forever: not on blocks its own prefix hit locks, not on sequences out of preemptions."""

from __future__ import annotations

import random

import pytest
from engine_kit import Collector, assert_all_free, greedy, make_core, run
from tiny_models import write_tiny_gemma3

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.errors import RequestTooLarge
from radixd.daemon.loaders import LoadedModel, load_model

S, F = "sliding_attention", "full_attention"
LAYOUTS = ["full", "windowed"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = write_tiny_gemma3(tmp_path_factory.mktemp("gemma3"), [S, S, F, S, S, S, F], 8)
    return load_model(str(path), "cpu", "auto")  # the mode users run: its tokens do not depend on load either


def _pool_for(gemma: LoadedModel, layout: str, req: GenerateRequest, spare: int = 0) -> EngineCore:
    """A core whose pool holds exactly what `req` needs alone (plus `spare` blocks)."""
    probe = make_core(gemma, 64, kv_layout=layout)
    need = probe.kv.peak_blocks(len(req.prompt_token_ids), req)
    return make_core(gemma, need + spare + 1, kv_layout=layout)  # + the null block


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_hit_that_locks_more_than_it_reuses_does_not_stall_a_pool_of_one_request(
    gemma: LoadedModel, layout: str
) -> None:
    """The second request shares 12 tokens of the 2-block node the first one's prompt chunk cached. Its
    hit used to lock that whole node, so in a pool of exactly its own size its first chunk never had
    room (a wait without end, `engine.no_progress`); the match now splits the node after the block it
    reuses, and the node's unused tail stays evictable."""
    shared = [5 + i % 40 for i in range(12)]
    first = GenerateRequest("a", [*shared, *range(20, 50)], greedy(12))
    second = GenerateRequest("b", [*shared, *[30 + i % 25 for i in range(27)]], greedy(11))
    core = _pool_for(gemma, layout, second)
    col = run(core, [first])
    run(core, [second], col)
    ref = run(make_core(gemma, 256, kv_layout=layout), [first, second])
    for rid in ("a", "b"):
        assert col.final(rid).finish_reason == "length"
        assert col.tokens(rid) == ref.tokens(rid)
    assert_all_free(core)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_request_one_block_too_large_is_refused_naming_the_numbers(gemma: LoadedModel, layout: str) -> None:
    req = GenerateRequest("big", list(range(3, 43)), greedy(30))
    core = _pool_for(gemma, layout, req, spare=-1)
    need = core.kv.peak_blocks(40, req)
    with pytest.raises(RequestTooLarge, match=rf"needs up to {need} KV blocks .* pool has {need - 1}"):
        core.validator.validate(req)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sequences_out_of_preemptions_still_finish(gemma: LoadedModel, layout: str) -> None:
    """Two sequences that each fit alone, not together, with one preemption each: both finish with a
    roomy pool's tokens (were neither left a victim while neither could grow, the engine preempts past
    the limit rather than plan nothing forever)."""
    reqs = [GenerateRequest(f"r{i}", [*range(3, 20), 40 + i], greedy(40)) for i in range(2)]
    probe = _pool_for(gemma, layout, reqs[0])
    core = make_core(gemma, probe.kv.num_blocks, kv_layout=layout, max_preemptions=1)
    col = run(core, reqs)
    ref = run(make_core(gemma, 256, kv_layout=layout), reqs)
    for r in reqs:
        assert col.final(r.request_id).finish_reason == "length"
        assert col.tokens(r.request_id) == ref.tokens(r.request_id)
    assert core.stats().preemptions > 0
    assert_all_free(core)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", range(3))
def test_random_requests_in_a_tiny_pool_all_finish_or_are_refused(
    gemma: LoadedModel, layout: str, seed: int
) -> None:
    """Random prompt lengths, shared prefixes, max_tokens, pool sizes, chunk budgets and preemption
    modes: every accepted request ends with "length" and the tokens a roomy pool gives."""
    rng = random.Random(seed)
    mode = rng.choice(["recompute", "swap"])
    extra = {"preemption_mode": "swap", "num_host_blocks": rng.randint(1, 12)} if mode == "swap" else {}
    budget = rng.choice([16, 64, 512])
    core = make_core(gemma, rng.randint(5, 16), kv_layout=layout, max_num_batched_tokens=budget, **extra)
    base = [rng.randrange(3, 60) for _ in range(80)]
    reqs: list[GenerateRequest] = []
    for i in range(rng.randint(2, 6)):
        length = rng.randint(1, 70)
        share = rng.randint(0, length)
        prompt = base[:share] + [rng.randrange(3, 60) for _ in range(length - share)]
        req = GenerateRequest(f"r{i}", prompt, greedy(rng.randint(1, 50)))
        try:
            core.validator.validate(req)
        except RequestTooLarge:
            continue
        reqs.append(req)
    col = Collector()
    for r in reqs:
        core.requests.add(r, col)
    core.run_until_idle(5_000)  # raises on a step that plans nothing while work is pending
    ref = run(make_core(gemma, 512, kv_layout=layout), reqs)
    for r in reqs:
        assert col.final(r.request_id).finish_reason == "length", col.final(r.request_id).error
        assert col.tokens(r.request_id) == ref.tokens(r.request_id)
    assert_all_free(core)
