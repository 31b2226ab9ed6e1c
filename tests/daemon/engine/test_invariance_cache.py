"""Cache invariance (docs/batch-invariance.md), in every mode `auto` can pick: a greedy request whose
prompt comes partly from the prefix cache (its KV written by earlier prefills or decode steps, or kept
by a session) answers bitwise what it answers computed from scratch, and a warm repeat what it
answered first."""

from __future__ import annotations

import pytest
from engine_kit import Collector, assert_all_free, make_core, run
from invariance_kit import Answer, Rig, answer, ask, assert_same, text_tokens

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import GenerateRequest

pytestmark = pytest.mark.slow


def _one(core: EngineCore, req: GenerateRequest) -> tuple[Answer, int]:
    """-> (the answer of `req` run on `core`, its cached prompt tokens)."""
    col = run(core, [req], Collector())
    return answer(col, req.request_id), col.final(req.request_id).cached_tokens


def test_cache_hit_vs_recompute_and_warm_repeat(rig: Rig) -> None:
    ids = text_tokens(rig.lm)
    n_a, tail, max_tokens = (21, 5, 3) if rig.small else (45, 9, 6)
    core = make_core(rig.lm, num_blocks=64)
    a = ids[:n_a]
    first, cached = _one(core, GenerateRequest("a", a, ask(max_tokens)))
    assert cached == 0
    warm, cached = _one(core, GenerateRequest("a-again", a, ask(max_tokens)))
    assert cached == n_a - 1  # all but the last prompt token, recomputed for its logits
    # A hit that ends inside a block (its partly filled last block is copied, the rest computed).
    b = a[: n_a - 3] + ids[200 : 200 + tail]
    hit_b, cached = _one(core, GenerateRequest("b", b, ask(max_tokens)))
    assert cached == n_a - 3
    # A hit on KV written by decode steps: `a`'s answer, fed back as the next prompt's middle.
    c = a + [t for t, _ in first] + ids[250 : 250 + tail]
    hit_c, cached = _one(core, GenerateRequest("c", c, ask(max_tokens)))
    assert cached == n_a + max_tokens - 1  # `a`'s last answer token was sampled, never computed
    assert_same({"a": warm}, {"a": first}, f"warm repeat vs first answer ({rig.mode})")
    got = {"a": first, "b": hit_b, "c": hit_c}
    assert_same(
        got,
        {"a": rig.alone(a, max_tokens), "b": rig.alone(b, max_tokens), "c": rig.alone(c, max_tokens)},
        f"cache hit vs recompute ({rig.mode})",
    )
    assert_all_free(core)


def test_session_turn_vs_fresh_request(rig: Rig) -> None:
    """A session's second turn (its history's KV kept by the session's lease) answers what the same
    tokens sent as one fresh request answer."""
    ids = text_tokens(rig.lm)
    n1, n2, max_tokens = (17, 4, 3) if rig.small else (40, 7, 6)
    core = make_core(rig.lm, num_blocks=64)
    core.sessions.create("chat")
    turn1, turn2 = ids[:n1], ids[100 : 100 + n2]
    t1, _ = _one(core, GenerateRequest("t1", turn1, ask(max_tokens), session_id="chat"))
    core.admin.flush("evict_unlocked")  # what the session keeps is its lease's, not a cache leftover
    t2, cached = _one(core, GenerateRequest("t2", turn2, ask(max_tokens), session_id="chat"))
    fresh = turn1 + [t for t, _ in t1] + turn2
    assert cached == n1 + max_tokens - 1
    assert list(core.sessions.get("chat").tokens) == fresh + [t for t, _ in t2]
    got = {"turn1": t1, "turn2": t2}
    want = {"turn1": rig.alone(turn1, max_tokens), "turn2": rig.alone(fresh, max_tokens)}
    assert_same(got, want, f"session turn vs fresh request ({rig.mode})")
    core.sessions.close("chat")
    assert_all_free(core)
