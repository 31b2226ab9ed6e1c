"""A running sequence's cached path stays locked, whatever its first match found.

Regression: a request whose first match was empty got a lease that locked nothing, and its inserts
did not lock the path they created; memory pressure then evicted that path (freeing nothing, the
sequence still held the blocks), so a request with the same prefix found 0 cached tokens.
"""

from __future__ import annotations

import pytest
from engine_kit import SYSTEM, assert_all_free, greedy, make_core, run

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


def test_pressure_keeps_a_running_sequences_fresh_path_cached(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    core = make_core(smollm, num_blocks=48)
    prompt = tok.encode(SYSTEM * 3)
    assert len(prompt) > 96
    col = run(core, [])  # a collector bound to nothing yet
    core.requests.add(GenerateRequest("a", prompt, greedy(40)), col)
    while not core.requests["a"].seqs[0].num_computed >= len(prompt):
        assert core.step()
    cached = core.kv.cached_len(prompt, "")
    assert cached >= len(prompt) // 16 * 16 - 16, "the prompt's full blocks are published while it runs"
    evicted = core.kv.evicted_blocks
    # Pressure the engine cannot relieve by eviction: nothing is evicted, the cache keeps the path.
    assert not core.kv.ensure_free(core.kv.pool.num_free + 4)
    assert core.kv.evicted_blocks == evicted and core.kv.tree.evictable_blocks() == 0
    assert core.kv.cached_len(prompt, "") == cached
    # A request with the same prefix, arriving while the first runs, shares its blocks.
    core.requests.add(GenerateRequest("b", [*prompt, 42], greedy(4)), col)
    core.run_until_idle()
    assert col.final("b").cached_tokens >= cached
    assert col.tokens("a") == run(make_core(smollm), [GenerateRequest("a", prompt, greedy(40))]).tokens("a")
    assert_all_free(core)


def test_forked_children_lock_their_paths_from_an_empty_match(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    core = make_core(smollm, num_blocks=96)
    prompt = tok.encode("Write a list of fruits:")
    col = run(core, [])
    core.requests.add(GenerateRequest("n", prompt, greedy(40, n=3)), col)
    for _ in range(30):
        core.step()
    seqs = [s for s in core.requests["n"].seqs if not s.finished]
    assert seqs and all(s.inserted_blocks for s in seqs)
    assert all(s.lease is not None and s.lease.locks_path for s in seqs)
    assert core.kv.tree.evictable_blocks() == 0
    core.run_until_idle()
    assert_all_free(core)
