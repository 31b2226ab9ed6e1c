"""Batch invariance (docs/batch-invariance.md), in every mode `auto` can pick: a greedy request's tokens
and per-token logprobs are bitwise those it gets alone, whatever else shares its steps and however its
prompt was cut into prefill chunks."""

from __future__ import annotations

import pytest
from engine_kit import Collector, make_core
from invariance_kit import Answer, Rig, answer, ask, assert_same, record_shapes, text_tokens

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import GenerateRequest

pytestmark = pytest.mark.slow


def _mixed_requests(rig: Rig) -> tuple[list[GenerateRequest], tuple[int, ...]]:
    """Requests of mixed prompt lengths, and the waves they arrive in (a step between waves)."""
    ids = text_tokens(rig.lm)
    # NOTE: the first request still decodes when the last wave arrives (max_tokens >= len(waves)).
    n, longest, waves = (14, 6, (1, 3, 10)) if rig.small else (64, 8, (1, 15, 48))
    max_tokens = 3
    reqs = []
    for i in range(n):
        start = (13 * i) % 200  # distinct starts: no two prompts share a prefix
        length = 1 + (7 * i) % longest
        reqs.append(GenerateRequest(f"r{i}", ids[start : start + length], ask(max_tokens)))
    assert sum(waves) == n
    return reqs, waves


def _run_in_waves(core: EngineCore, reqs: list[GenerateRequest], waves: tuple[int, ...]) -> dict[str, Answer]:
    col = Collector()
    it = iter(reqs)
    for w in waves:
        for _ in range(w):
            core.requests.add(next(it), col)
        core.step()  # the wave's prefills join the decodes of the earlier waves
    core.run_until_idle()
    return {r.request_id: answer(col, r.request_id) for r in reqs}


def test_alone_vs_batches_of_mixed_lengths(rig: Rig) -> None:
    """Requests arriving in waves of 1, 15 and 48 (1, 3 and 10 where bf16 is emulated) share steps of
    1, 16, 64, 63 and 48 requests, prefill chunks beside decode rows: each answers what it answers
    alone, and what it answers when they arrive in the reverse order (other neighbours, rows and
    step sizes for each).
    NOTE: the cost is the tokens computed, and a request alone costs a whole forward pass per token:
    of 64, every 4th request (some of every wave) runs alone and every one in both orders."""
    reqs, waves = _mixed_requests(rig)
    core = make_core(rig.lm, num_blocks=256, prefix_caching=False, max_num_batched_tokens=1024)
    shapes = record_shapes(core)
    batched = _run_in_waves(core, reqs, waves)
    # The load really varied: prefills beside decodes, one decode row and every request's at once
    # (more than 12: int4 switched kernels at 12 rows before batch invariance).
    rows = [r for _, _, r in shapes.steps]
    assert shapes.mixed() >= len(waves) - 1, shapes.steps
    assert 1 in rows and max(rows) >= len(reqs) - 1 > 12, shapes.steps
    assert max(c + r for c, _, r in shapes.steps) == len(reqs), shapes.steps
    sample = reqs if rig.small else reqs[::4]
    firsts = [sum(waves[:k]) for k in range(len(waves))]
    assert all(any(f <= reqs.index(r) < f + w for r in sample) for f, w in zip(firsts, waves, strict=True))
    assert_same(
        {r.request_id: batched[r.request_id] for r in sample},
        rig.alone_all(sample),
        f"batched vs alone ({rig.mode})",
    )
    if len(sample) < len(reqs):
        backward = _run_in_waves(core, reqs[::-1], waves)
        assert_same(backward, batched, f"in reverse order vs in order ({rig.mode})")


def test_chunked_vs_whole_prefill(rig: Rig) -> None:
    """Long prompts prefilled a few tokens per step (a budget that cuts them off block boundaries,
    shared with the others' decode rows) answer what one whole prefill answers."""
    ids = text_tokens(rig.lm)
    lengths, budget, max_tokens = ((20, 33), 7, 3) if rig.small else ((37, 100), 13, 3)
    reqs = [GenerateRequest(f"c{n}", ids[i : i + n], ask(max_tokens)) for i, n in enumerate(lengths)]
    core = make_core(rig.lm, num_blocks=64, prefix_caching=False, max_num_batched_tokens=budget)
    shapes = record_shapes(core)
    chunked = _run_in_waves(core, reqs, (len(reqs),))
    assert max(t for _, t, _ in shapes.steps) <= budget < min(lengths)
    assert shapes.mixed() > 0, shapes.steps
    assert_same(chunked, rig.alone_all(reqs), f"chunked vs whole prefill ({rig.mode})")
