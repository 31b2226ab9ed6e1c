"""Speculative decoding under memory pressure and across session turns, on the real model: requests
whose drafts are verified while a small KV pool preempts them (their KV recomputed, or swapped out to
host memory and back), n > 1 forks among them, answer exactly what speculation off answers; a session's
second turn, which restates its first, drafts from it (in the sequence's own tokens, and from the tree
when a second session repeats the conversation) and answers what speculation off answers.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_kit import Collector, assert_all_free, fixed_cost, make_core, run
from invariance_kit import Answer, Rig, answer, ask, assert_same, text_tokens

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams

pytestmark = pytest.mark.slow


def _answers(col: Collector, reqs: list[GenerateRequest]) -> dict[str, Answer]:
    return {f"{r.request_id}/{i}": answer(col, r.request_id, i) for r in reqs for i in range(r.sampling.n)}


@pytest.mark.parametrize("rig", ["float32"], indirect=True)
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preempted_drafted_requests_answer_what_speculation_off_answers(rig: Rig, preemption: str) -> None:
    # Each prompt says its phrase twice, so the model goes on repeating it: drafts from its own tokens.
    ids = text_tokens(rig.lm)
    max_tokens = 40
    reqs = [GenerateRequest(f"p{i}", ids[10 * i : 10 * i + 20] * 2, ask(max_tokens)) for i in range(4)]
    two = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0, n=2)
    reqs.append(GenerateRequest("n2", ids[50:70] * 2, two))
    extra: dict[str, Any] = {"preemption_mode": "swap", "num_host_blocks": 64} if preemption == "swap" else {}
    blocks = 16  # 16-token blocks, the null one included: too few for all rows at once
    off = make_core(rig.lm, num_blocks=blocks, speculative_tokens=0, **extra)
    on = fixed_cost(make_core(rig.lm, num_blocks=blocks, speculative_tokens=6, **extra))
    need = sum(on.kv.blocks_for(len(r.prompt_token_ids) + max_tokens) * r.sampling.n for r in reqs)
    assert need > blocks
    want = _answers(run(off, reqs), reqs)
    col = run(on, reqs)
    stats = on.stats()
    preempted = stats.preemptions_swap if preemption == "swap" else stats.preemptions_recompute
    assert preempted > 0, stats
    assert on.speculator.accepted_tokens > 0 and stats.drafted_tokens > 0
    assert_same(_answers(col, reqs), want, f"preempted by {preemption}, speculation on vs off ({rig.mode})")
    assert_all_free(on)
    assert_all_free(off)


def _conversation(core: EngineCore, session: str, turns: list[list[int]], max_tokens: int) -> list[Answer]:
    """Run `turns` as one session's turns on `core`, one after the other; -> each turn's answer."""
    core.sessions.create(session)
    out = []
    for i, turn in enumerate(turns):
        rid = f"{session}-t{i}"
        col = run(core, [GenerateRequest(rid, turn, ask(max_tokens), session_id=session)], Collector())
        out.append(answer(col, rid))
    core.sessions.close(session)
    return out


@pytest.mark.parametrize("rig", ["float32"], indirect=True)
def test_a_session_turn_drafts_from_the_previous_turn(rig: Rig) -> None:
    tok = rig.lm.tokenizer
    story = tok.encode("User: Tell me a short story about a lighthouse keeper and a storm.\nAssistant:")
    again = tok.encode("\nUser: Say that story again, word for word.\nAssistant:")
    turns, max_tokens = [story, again], 24
    off = make_core(rig.lm, num_blocks=128, speculative_tokens=0)
    on = fixed_cost(make_core(rig.lm, num_blocks=128, speculative_tokens=6))
    want = _conversation(off, "s", turns, max_tokens)
    spec = on.speculator
    got = _conversation(on, "s", turns, max_tokens)
    assert_same(
        {"t0": got[0], "t1": got[1]}, {"t0": want[0], "t1": want[1]}, "session, speculation on vs off"
    )
    assert spec.accepted_tokens > 0
    # The same conversation in a second session: both turns draft what the first session's turns
    # left in the tree.
    tree, accepted = spec.drafter.from_tree, spec.accepted_tokens
    again_got = _conversation(on, "s2", turns, max_tokens)
    assert again_got == got
    assert spec.drafter.from_tree > tree and spec.accepted_tokens - accepted >= max_tokens
    assert_all_free(on)
    assert_all_free(off)
