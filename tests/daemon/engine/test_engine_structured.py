"""Grammar-constrained generation on the real model: every constraint kind's output is valid, finishes
with "stop" when the grammar is complete, survives forks, beams, preemption and aborts, and leaves
unconstrained rows exactly as they are alone."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
from engine_kit import Collector, assert_all_free, make_core, run, sampled, step_until
from structured_kit import (
    ANSWERS,
    GBNF,
    LARK,
    LOG_LINE,
    PERSON,
    chat,
    constrained,
    is_expression,
    is_log_line,
    person,
)

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.errors import InvalidRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.structured.spec import Constraint

pytestmark = pytest.mark.slow


def test_every_kind_yields_valid_output_and_stops(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    reqs = [
        GenerateRequest("json", chat(smollm, "Describe a person as JSON."), constrained(person())),
        GenerateRequest(
            "obj",
            chat(smollm, 'Reply with the JSON object {"ok": true} and nothing else.'),
            constrained(Constraint("json_object")),
        ),
        GenerateRequest("re", chat(smollm, "Write a log line."), constrained(Constraint("regex", LOG_LINE))),
        GenerateRequest(
            "choice", chat(smollm, "Is the sky blue?"), constrained(Constraint("choice", choices=ANSWERS))
        ),
        GenerateRequest(
            "lark", chat(smollm, "An arithmetic expression:"), constrained(Constraint("grammar", LARK))
        ),
        GenerateRequest(
            "gbnf", chat(smollm, "An arithmetic expression:"), constrained(Constraint("grammar", GBNF))
        ),
    ]
    col = run(core, reqs)
    for r in reqs:
        out = col.final(r.request_id)
        assert out.finish_reason == "stop", (r.request_id, out.finish_reason, col.text(r.request_id))
        assert out.matched_stop is None
    jsonschema.validate(json.loads(col.text("json")), PERSON)
    assert isinstance(json.loads(col.text("obj")), dict)
    assert is_log_line(col.text("re")), col.text("re")
    assert col.text("choice") in ANSWERS
    assert is_expression(col.text("lark")), col.text("lark")
    assert is_expression(col.text("gbnf")), col.text("gbnf")
    # A complete grammar allows only an end of turn, which closes the output as usual.
    for r in reqs:
        assert col.tokens(r.request_id)[-1] in core.eos_token_ids
    assert "<|im_end|>" not in col.text("json")
    assert_all_free(core)


def test_n4_forks_each_walk_their_own_grammar(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    prompt = chat(smollm, "Describe a person as JSON.")
    col = run(core, [GenerateRequest("n4", prompt, constrained(person(), temperature=1.0, seed=3, n=4))])
    docs = [json.loads(col.text("n4", i)) for i in range(4)]
    for d in docs:
        jsonschema.validate(d, PERSON)
    assert len({json.dumps(d) for d in docs}) > 1  # really sampled apart
    assert_all_free(core)


def test_beam_search_keeps_to_the_grammar(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    params = SamplingParams(max_tokens=8, n=2, constraint=Constraint("choice", choices=ANSWERS))
    col = run(core, [GenerateRequest("beam", chat(smollm, "Is water wet?"), params, beam_width=3)])
    texts = {smollm.tokenizer.decode(col.tokens("beam", i), skip_special_tokens=True) for i in range(2)}
    assert texts <= set(ANSWERS) and len(texts) == 2
    assert_all_free(core)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_constrained_requests_equal_unpreempted(smollm: LoadedModel, mode: str) -> None:
    questions = ["a chef", "a pilot", "a child", "a painter", "a doctor", "a farmer"]
    reqs = [
        GenerateRequest(f"p{i}", chat(smollm, f"Describe {q} as JSON."), constrained(person()))
        for i, q in enumerate(questions)
    ]
    reqs.append(
        GenerateRequest("re", chat(smollm, "Write a log line."), constrained(Constraint("regex", LOG_LINE)))
    )
    big = make_core(smollm, num_blocks=512)
    ref = run(big, reqs)
    extra = {"preemption_mode": "swap", "num_host_blocks": 24} if mode == "swap" else {}
    small = make_core(smollm, num_blocks=16, **extra)
    col = run(small, reqs)
    assert small.stats().preemptions > 0
    if mode == "swap":
        assert small.stats().preemptions_swap > 0
    for r in reqs[:-1]:
        assert col.tokens(r.request_id) == ref.tokens(r.request_id), r.request_id
        jsonschema.validate(json.loads(col.text(r.request_id)), PERSON)
    assert col.text("re") == ref.text("re") and is_log_line(col.text("re"))
    assert_all_free(small)
    assert_all_free(big)


def test_abort_mid_grammar_leaks_nothing(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    col = Collector()
    # NOTE: the schema cannot complete in fewer than ~10 tokens, so "cut" is still inside its grammar
    # at 5 tokens whatever the mode's greedy choices (a bare json_object may close as "{}" at once).
    many = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 8}},
        "required": ["items"],
    }
    obj = constrained(Constraint("json_schema", json.dumps(many)), max_tokens=200)
    core.requests.add(GenerateRequest("cut", chat(smollm, "A big JSON object."), obj), col)
    core.requests.add(GenerateRequest("json", chat(smollm, "A person as JSON."), constrained(person())), col)
    step_until(core, lambda: len(col.tokens("cut")) >= 5)
    assert core.requests.abort("cut")
    assert col.final("cut").finish_reason == "abort"
    core.run_until_idle()
    jsonschema.validate(json.loads(col.text("json")), PERSON)
    assert_all_free(core)


def test_unconstrained_rows_sample_as_they_do_alone(smollm: LoadedModel) -> None:
    prompt = chat(smollm, "Tell me about the sea.")
    plain = [
        GenerateRequest("greedy", prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)),
        GenerateRequest("seeded", prompt, sampled(seed=11, max_tokens=16)),
        GenerateRequest(
            "lp", prompt, SamplingParams(max_tokens=16, temperature=0.0, logprobs=3, ignore_eos=True)
        ),
    ]
    alone = run(make_core(smollm), plain)
    mixed_reqs = [
        GenerateRequest("c1", chat(smollm, "A person as JSON."), constrained(person())),
        *plain,
        GenerateRequest(
            "c2", chat(smollm, 'Reply with {"ok": true}.'), constrained(Constraint("json_object"), seed=5)
        ),
    ]
    core = make_core(smollm)
    mixed = run(core, mixed_reqs)
    for r in plain:
        assert mixed.tokens(r.request_id) == alone.tokens(r.request_id), r.request_id
    # NOTE: the forward's matmuls round differently at other batch sizes, so logprobs agree to float
    # rounding, not bit for bit (as for any two batch compositions).
    lp_alone = [x for o in alone.outs[("lp", 0)] for x in o.logprobs or []]
    lp_mixed = [x for o in mixed.outs[("lp", 0)] for x in o.logprobs or []]
    assert [x.token_id for x in lp_mixed] == [x.token_id for x in lp_alone]
    assert [x.logprob for x in lp_mixed] == pytest.approx([x.logprob for x in lp_alone], abs=1e-4)
    jsonschema.validate(json.loads(mixed.text("c1")), PERSON)
    assert_all_free(core)


def test_logprobs_describe_the_masked_distribution(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    params = constrained(Constraint("choice", choices=ANSWERS), logprobs=20)
    col = run(core, [GenerateRequest("lp", chat(smollm, "Is the sky blue?"), params)])
    first = col.outs[("lp", 0)][0].logprobs
    assert first
    allowed = [lp for _, lp in first[0].top if lp > -1e29]
    # Only the grammar's first tokens are possible, and they hold the whole probability.
    assert 1 <= len(allowed) < 20
    assert math.isclose(sum(math.exp(lp) for lp in allowed), 1.0, rel_tol=1e-4)
    assert first[0].logprob > -1e29


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (Constraint("json_schema", '{"type": "object", "properties": {"a": {"type": "strin"}}}'), "strin"),
        (Constraint("json_schema", '{"type": "array", "uniqueItems": true}'), "uniqueItems"),
        (Constraint("json_schema", '{"type": '), "not valid JSON"),
        (Constraint("regex", "(ab"), "unclosed group"),
        (Constraint("grammar", 'start: "a" foo'), "foo"),
        (Constraint("grammar", 'root ::= "a" missing'), "missing"),
        (Constraint("structural_tag", '{"type": "structural_tag", "format": {}}'), "structures"),
    ],
)
def test_bad_constraints_end_with_invalid_argument(
    smollm: LoadedModel, constraint: Constraint, message: str
) -> None:
    core = make_core(smollm, num_blocks=64)
    col = run(core, [GenerateRequest("bad", chat(smollm, "hi"), constrained(constraint))])
    out = col.final("bad")
    assert out.finish_reason == "error" and out.error_code == "invalid_argument"
    assert out.error is not None and message in out.error, out.error
    assert not out.new_token_ids and len(col.outs[("bad", 0)]) == 1
    assert_all_free(core)


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 2}])
def test_constraint_with_ignore_eos_or_min_tokens_is_refused(
    smollm: LoadedModel, extra: dict[str, object]
) -> None:
    core = make_core(smollm, num_blocks=64)
    req = GenerateRequest("r", chat(smollm, "hi"), constrained(person(), **extra))
    with pytest.raises(InvalidRequest, match=next(iter(extra))):
        core.validator.validate(req)


def test_resent_schema_hits_the_compile_cache(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    cache = core.grammars
    spaced = json.dumps(PERSON, indent=2)  # the same schema, other whitespace: one canonical form
    before = (cache.counts.hits, cache.counts.misses)
    for i, text in enumerate([json.dumps(PERSON), spaced, json.dumps(PERSON)]):
        c = Constraint("json_schema", text)
        col = run(core, [GenerateRequest(f"t{i}", chat(smollm, "A person as JSON."), constrained(c))])
        jsonschema.validate(json.loads(col.text(f"t{i}")), PERSON)
    hits, misses = cache.counts.hits - before[0], cache.counts.misses - before[1]
    assert misses <= 1 and hits >= 2
    assert_all_free(core)


def test_a_constrained_turn_is_cached_for_the_next(smollm: LoadedModel) -> None:
    core = make_core(smollm)
    core.sessions.create("chat", tokens=[])
    turn1 = chat(smollm, "Describe a person as JSON.")
    col = run(core, [GenerateRequest("t1", turn1, constrained(person()), session_id="chat")])
    out1 = col.tokens("t1")
    jsonschema.validate(json.loads(col.text("t1")), PERSON)
    assert list(core.sessions.get("chat").tokens) == turn1 + out1
    turn2 = smollm.tokenizer.encode("<|im_start|>user\nAnd another?<|im_end|>\n<|im_start|>assistant\n")
    col = run(core, [GenerateRequest("t2", turn2, constrained(person()), session_id="chat")], col)
    assert col.final("t2").cached_tokens == len(turn1) + len(out1) - 1
    jsonschema.validate(json.loads(col.text("t2")), PERSON)
    core.sessions.close("chat", keep_cached=False)
    assert_all_free(core)
