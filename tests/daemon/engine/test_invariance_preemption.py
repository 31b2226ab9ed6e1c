"""Preemption invariance (docs/batch-invariance.md), in every mode `auto` can pick: greedy requests
that a small KV pool preempts (their KV recomputed, or swapped out to host memory and back) answer
bitwise what each answers alone, and so do the requests that were never preempted."""

from __future__ import annotations

from typing import Any

import pytest
from engine_kit import assert_all_free, make_core, run
from invariance_kit import Rig, answer, ask, assert_same, text_tokens

from radixd.daemon.engine.types import GenerateRequest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preempted_vs_alone(rig: Rig, preemption: str) -> None:
    ids = text_tokens(rig.lm)
    # (requests, shortest prompt, prompt step, new tokens, pool blocks of 16 tokens incl. the null one)
    n, shortest, step, max_tokens, blocks = (4, 10, 3, 6, 3) if rig.small else (5, 16, 5, 8, 6)
    reqs = [
        GenerateRequest(f"p{i}", ids[7 * i : 7 * i + shortest + step * i], ask(max_tokens)) for i in range(n)
    ]
    extra: dict[str, Any] = {"preemption_mode": "swap", "num_host_blocks": 24} if preemption == "swap" else {}
    core = make_core(rig.lm, num_blocks=blocks, **extra)
    need = sum(core.kv.blocks_for(len(r.prompt_token_ids) + max_tokens) for r in reqs)
    assert need > blocks
    col = run(core, reqs)
    stats = core.stats()
    assert (stats.preemptions_swap if preemption == "swap" else stats.preemptions_recompute) > 0, stats
    got = {r.request_id: answer(col, r.request_id) for r in reqs}
    assert_same(got, rig.alone_all(reqs), f"preempted by {preemption} vs alone ({rig.mode})")
    assert_all_free(core)
