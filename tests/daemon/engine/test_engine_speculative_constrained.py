"""Speculative decoding of constrained requests (engine/speculative.py, executor/masks.py) on the real
model: greedy JSON-schema and regex requests with drafts give token for token (and logprob for logprob)
what they give with speculation off, with drafts really verified for them; a draft the grammar forbids
is cut before verification; jump-forward keeps appending forced tokens after an accepted draft; a dead
end found right after an accepted draft fails its request alone, as without drafts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from engine_kit import Collector, assert_all_free, fixed_cost, make_core, run
from invariance_kit import AUTO_AND_REFERENCE, Rig
from structured_kit import LOG_LINE, PERSON, chat, constrained, is_log_line, person

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.structured.spec import Constraint

pytestmark = pytest.mark.slow

DOC = {"name": "Ann", "age": 30, "city": "Paris"}
# Repetitive: the answer the schema wants is quoted in the prompt, so the model copies it (drafts from
# the sequence's own tokens; quoted compact, as the schema reading emits it), and a second ask drafts the
# first answer from the tree.
COPY_JSON = f"Repeat this JSON object exactly, nothing else: {json.dumps(DOC, separators=(',', ':'))}"
COPY_LOG = "Repeat this log line exactly: ERR-404: page not found here. Again: ERR-404: page not"


class Pair:
    """Speculation off (the reference) and on, over one mode's model."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.off = make_core(rig.lm, num_blocks=128, speculative_tokens=0)
        self.on = fixed_cost(make_core(rig.lm, num_blocks=128, speculative_tokens=6))


@pytest.fixture(scope="module")
def pair(rig: Rig) -> Iterator[Pair]:
    yield Pair(rig)


def _outputs(col: Collector, reqs: list[GenerateRequest]) -> dict[tuple[str, int], Any]:
    """Each output's tokens, logprobs, text and ending."""
    out: dict[tuple[str, int], Any] = {}
    for r in reqs:
        for i in range(r.sampling.n):
            final = col.final(r.request_id, i)
            lps = [(lp.token_id, lp.logprob) for o in col.outs[(r.request_id, i)] for lp in o.logprobs or []]
            out[(r.request_id, i)] = (
                col.tokens(r.request_id, i),
                lps,
                col.text(r.request_id, i),
                final.finish_reason,
                final.matched_stop,
            )
    return out


def _same(pair: Pair, reqs: list[GenerateRequest], what: str) -> Collector:
    """Run `reqs` on both cores: the same outputs; -> speculation on's collector."""
    col_off = run(pair.off, reqs, Collector())
    col_on = run(pair.on, reqs, Collector())
    got, want = _outputs(col_on, reqs), _outputs(col_off, reqs)
    bad = [k for k in want if got[k] != want[k]]
    assert not bad, f"speculation on vs off differ for {bad} ({what}): {[(got[k], want[k]) for k in bad]}"
    return col_on


@pytest.mark.parametrize("rig", AUTO_AND_REFERENCE, indirect=True)
def test_constrained_greedy_output_is_speculation_offs(pair: Pair) -> None:
    """JSON schema (with and without logprobs, so with and without jump-forward) and regex requests,
    alone and batched with a plain row: speculation off's outputs, drafts accepted for each."""
    lm = pair.rig.lm
    log = Constraint("regex", LOG_LINE)
    reqs = [
        GenerateRequest("json", chat(lm, COPY_JSON), constrained(person())),
        GenerateRequest("json-lp", chat(lm, COPY_JSON), constrained(person(), logprobs=0)),
        GenerateRequest("log", lm.tokenizer.encode(COPY_LOG), constrained(log, max_tokens=24, logprobs=1)),
        GenerateRequest("plain", lm.tokenizer.encode(COPY_LOG), constrained(None, max_tokens=12)),
    ]
    spec = pair.on.speculator
    for attempt in ("first", "again"):  # again: the first answers are in the tree
        accepted = spec.accepted_tokens
        col = _same(pair, reqs, f"{attempt}, {pair.rig.mode}")
        for rid in ("json", "json-lp", "log"):
            assert col.final(rid).accepted_draft_tokens > 0, (attempt, rid)
        assert spec.accepted_tokens > accepted
        jsonschema.validate(json.loads(col.text("json")), PERSON)
        assert col.text("json") == col.text("json-lp")
        assert is_log_line(col.text("log")), col.text("log")
    # Drafts did not get in the way of jump-forward (the request without logprobs jumped its keys).
    assert pair.on.jump_forward.forced_tokens > 0
    assert_all_free(pair.on)
    assert_all_free(pair.off)


@pytest.mark.parametrize("rig", ["float32"], indirect=True)
def test_a_draft_the_grammar_forbids_is_cut(pair: Pair) -> None:
    """The tree holds a free-text answer to the prompt; asked again under a regex that text breaks, the
    tree's draft is cut where the grammar forbids it, and the output is still speculation off's.
    Sampled (unseeded) constrained rows verify their drafts by rejection sampling, within the grammar."""
    lm = pair.rig.lm
    prompt = lm.tokenizer.encode(COPY_LOG)
    free = GenerateRequest("free", prompt, constrained(None, max_tokens=16, ignore_eos=True))
    run(pair.on, [free])
    spec = pair.on.speculator
    cut, tree = spec.grammar_cut_tokens, spec.drafter.from_tree
    digits = Constraint("regex", r"[0-9]{3}( [0-9]{3}){4}")  # the free text has no such thing
    _same(pair, [GenerateRequest("digits", prompt, constrained(digits, max_tokens=24))], "a cut draft")
    assert spec.drafter.from_tree > tree and spec.grammar_cut_tokens > cut
    # Sampled: no seed (a seeded row is not drafted for), n = 2; every output within the grammar.
    drafted = spec.drafted_tokens
    sampled = GenerateRequest(
        "sampled", chat(lm, COPY_JSON), constrained(person(), max_tokens=48, temperature=0.7, n=2)
    )
    col = run(pair.on, [sampled])
    assert spec.drafted_tokens > drafted
    for i in range(2):
        jsonschema.validate(json.loads(col.text("sampled", i)), PERSON)
    assert_all_free(pair.on)


@pytest.mark.parametrize("rig", ["float32"], indirect=True)
def test_a_dead_end_right_after_an_accepted_draft_fails_its_request_alone(pair: Pair) -> None:
    """A constraint forcing a byte the vocabulary cannot spell (tests/daemon/engine/
    test_engine_structured_dead_ends.py), reached right after a verified draft: the request ends with
    INVALID_ARGUMENT after the same tokens as with speculation off, and the row beside it goes on."""
    lm = pair.rig.lm
    history = [
        {"role": "user", "content": "Greet me."},
        {"role": "assistant", "content": "hello world"},
        {"role": "user", "content": "Greet me again."},
    ]
    prompt = lm.tokenizer.encode_chat(history)  # the earlier answer is drafted from the context
    dead = constrained(Constraint("regex", "(hello|hi) world\\x160"), max_tokens=12, logprobs=0)
    reqs = [GenerateRequest("dead", prompt, dead), GenerateRequest("plain", prompt, constrained(None))]
    outs = []
    for core in (pair.off, pair.on):
        col = run(core, reqs, Collector())
        final = col.final("dead")
        assert final.finish_reason == "error" and final.error_code == "invalid_argument", final.error
        assert col.final("plain").finish_reason in ("stop", "length")
        assert core.stats().errors == 0
        outs.append((col.tokens("dead"), final.error, col.tokens("plain"), final.accepted_draft_tokens))
    (off_dead, off_error, off_plain, _), (on_dead, on_error, on_plain, accepted) = outs
    assert (on_dead, on_error, on_plain) == (off_dead, off_error, off_plain)
    assert accepted > 0  # the refused token was the model's pick right after an accepted draft
    assert_all_free(pair.on)
