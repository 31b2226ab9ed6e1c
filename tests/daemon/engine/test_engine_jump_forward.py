"""Jump-forward on the real model: a constrained sequence appends the tokens its grammar forces and
computes them as one chunk, in fewer steps, with exactly the tokens step-by-step decoding gives at
temperature 0 (several schemas, a cut at max_tokens, a stop string inside forced text, n > 1 seeded
sampling, preemption under a small pool)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from engine_kit import Collector, assert_all_free, make_core, run
from structured_kit import ANSWERS, PERSON, chat, constrained, person

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.structured.spec import Constraint

pytestmark = pytest.mark.slow

# Long fixed keys: most of the document is forced.
ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 99999},
        "is_priority_delivery_requested": {"type": "boolean"},
        "preferred_delivery_time_window": {"type": "string", "enum": ["morning", "afternoon"]},
    },
    "required": [
        "customer_identification_number",
        "is_priority_delivery_requested",
        "preferred_delivery_time_window",
    ],
    "additionalProperties": False,
}


def _both(
    lm: LoadedModel, reqs: list[GenerateRequest], **config: Any
) -> tuple[Collector, Collector, int, int, int]:
    """Run `reqs` with jump-forward off then on; -> both collectors, both step counts and the
    preemptions with it on."""
    out = []
    for jf in (False, True):
        core = make_core(lm, jump_forward=jf, **config)
        col = run(core, reqs)
        stats = core.stats()
        out.append((col, core.steps, core.jump_forward.forced_tokens, stats.preemptions_recompute))
        assert_all_free(core)
    (off, off_steps, off_forced, _), (on, on_steps, _, preempted) = out
    assert off_forced == 0
    return off, on, off_steps, on_steps, preempted


def _same(off: Collector, on: Collector, reqs: list[GenerateRequest]) -> None:
    for r in reqs:
        for i in range(r.sampling.n):
            assert on.tokens(r.request_id, i) == off.tokens(r.request_id, i), (r.request_id, i)
            assert on.text(r.request_id, i) == off.text(r.request_id, i)
            a, b = on.final(r.request_id, i), off.final(r.request_id, i)
            assert (a.finish_reason, a.matched_stop) == (b.finish_reason, b.matched_stop)


def test_same_tokens_in_fewer_steps_on_several_constraints(smollm: LoadedModel) -> None:
    reqs = [
        GenerateRequest(
            "order",
            chat(smollm, "Write a delivery order as JSON."),
            constrained(Constraint("json_schema", json.dumps(ORDER)), max_tokens=96),
        ),
        GenerateRequest("person", chat(smollm, "Describe a person as JSON."), constrained(person())),
        GenerateRequest(
            "choice", chat(smollm, "Is the sky blue?"), constrained(Constraint("choice", choices=ANSWERS))
        ),
        GenerateRequest(
            "obj",
            chat(smollm, "A JSON object with a key."),
            constrained(Constraint("json_object"), max_tokens=32),
        ),
    ]
    off, on, off_steps, on_steps, _ = _both(smollm, reqs)
    _same(off, on, reqs)
    jsonschema.validate(json.loads(on.text("order")), ORDER)
    jsonschema.validate(json.loads(on.text("person")), PERSON)
    assert on_steps < off_steps, (on_steps, off_steps)


def test_alone_the_forced_keys_save_most_steps(smollm: LoadedModel) -> None:
    req = GenerateRequest(
        "order",
        chat(smollm, "Write a delivery order as JSON."),
        constrained(Constraint("json_schema", json.dumps(ORDER)), max_tokens=96),
    )
    core = make_core(smollm)
    col = run(core, [req])
    n = len(col.tokens("order"))
    assert core.jump_forward.forced_tokens >= n // 3, (core.jump_forward.forced_tokens, n)  # 23 of 48
    assert core.steps <= n - core.jump_forward.forced_tokens + 2  # the prefill, then one step per sample
    assert_all_free(core)


@pytest.mark.parametrize("max_tokens", [3, 7, 12])
def test_max_tokens_cuts_a_forced_run_where_step_by_step_does(smollm: LoadedModel, max_tokens: int) -> None:
    reqs = [
        GenerateRequest(
            "cut",
            chat(smollm, "Write a delivery order as JSON."),
            constrained(Constraint("json_schema", json.dumps(ORDER)), max_tokens=max_tokens),
        )
    ]
    off, on, _, _, _ = _both(smollm, reqs)
    _same(off, on, reqs)
    assert len(on.tokens("cut")) == max_tokens and on.final("cut").finish_reason == "length"


def test_a_stop_string_inside_forced_text_stops_as_step_by_step(smollm: LoadedModel) -> None:
    reqs = [
        GenerateRequest(
            "stop",
            chat(smollm, "Write a delivery order as JSON."),
            constrained(Constraint("json_schema", json.dumps(ORDER)), max_tokens=96, stop=("delivery_time",)),
        )
    ]
    off, on, _, _, _ = _both(smollm, reqs)
    _same(off, on, reqs)
    assert on.final("stop").matched_stop == "delivery_time"


def test_seeded_n2_forks_and_preemption_keep_the_same_tokens(smollm: LoadedModel) -> None:
    """Sampled rows draw for their forced tokens as the sampler would, so seeded n > 1 is unchanged;
    a pool too small for all rows preempts (recompute) mid-document."""
    reqs = [
        GenerateRequest(
            f"s{i}",
            chat(smollm, f"Delivery order number {i} as JSON."),
            constrained(
                Constraint("json_schema", json.dumps(ORDER)), max_tokens=80, temperature=0.8, seed=7 + i, n=2
            ),
        )
        for i in range(3)
    ]
    off, on, _, _, preempted = _both(smollm, reqs, num_blocks=16, max_num_batched_tokens=64)
    assert preempted > 0  # the pool really was too small
    _same(off, on, reqs)
    for r in reqs:
        for i in range(2):
            jsonschema.validate(json.loads(on.text(r.request_id, i)), ORDER)


def test_logprobs_requests_decode_step_by_step(smollm: LoadedModel) -> None:
    """A request asking for logprobs gets the model's logprob for every token: no forced tokens."""
    core = make_core(smollm)
    req = GenerateRequest(
        "lp",
        chat(smollm, "Write a delivery order as JSON."),
        constrained(Constraint("json_schema", json.dumps(ORDER)), max_tokens=30, logprobs=1),
    )
    col = run(core, [req])
    assert core.jump_forward.forced_tokens == 0
    lps = [lp for o in col.outs[("lp", 0)] for lp in (o.logprobs or [])]
    assert len(lps) == len(col.tokens("lp")) == 30
    assert_all_free(core)
