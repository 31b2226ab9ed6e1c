"""Speculative drafts under a grammar (engine/speculative.py, executor/masks.py): a draft is cut before
the first token its grammar forbids (`Matcher.admitted`, read-only), and a drafted row's verification
masks are, position by position, the masks plain constrained decoding computes after the draft tokens
before it, with the matcher back where it started."""

from __future__ import annotations

import json

import llguidance
import pytest
import torch
from structured_kit import LOG_LINE, PERSON

from radixd.daemon.executor.masks import StepMasks
from radixd.daemon.executor.sampling import MASKED_LOGIT, SamplingParams, SamplingState
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.structured.matcher import CompiledGrammar, GrammarRefused, Matcher, compile_constraint
from radixd.daemon.structured.spec import Constraint
from radixd.daemon.structured.tokenizer import llg_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llg(smollm: LoadedModel) -> llguidance.LLTokenizer:
    tok = smollm.tokenizer
    return llg_tokenizer(tok, smollm.config.vocab_size, tuple(tok.eos_token_ids))


def _first_refused(m: Matcher, tokens: list[int], ends: frozenset[int]) -> int:
    """Where step-by-step consumption (plain decoding's) of `tokens` on a copy of `m` first fails,
    counting an end of turn as a stop; len(tokens) when it takes them all."""
    probe = m.fork()
    for i, t in enumerate(tokens):
        if t in ends:
            return i
        try:
            probe.consume(t)
        except GrammarRefused:
            return i
    return len(tokens)


def _person(llg: llguidance.LLTokenizer) -> CompiledGrammar:
    return compile_constraint(Constraint("json_schema", json.dumps(PERSON)), llg)


def test_a_draft_is_cut_before_the_first_token_the_grammar_forbids(llg: llguidance.LLTokenizer) -> None:
    person = _person(llg)
    ends = person.ends
    assert ends == frozenset(llg.eos_tokens) and ends
    eos = min(ends)
    good = llg.tokenize_str('{"name":"Ann","age":30,"city":"Paris"}')
    # "Rome" is not in the city enum: the cut falls where the two documents part.
    bad = llg.tokenize_str('{"name":"Ann","age":30,"city":"Rome"}')
    part = next(i for i, (a, b) in enumerate(zip(good, bad, strict=False)) if a != b)
    m = person.matcher()
    assert m.admitted(good) == len(good) == _first_refused(m, good, ends)
    assert m.admitted(bad) == _first_refused(m, bad, ends) == part
    assert 0 < part < len(bad)
    # A draft that closes the document stops before the end of turn (see `Matcher.admitted`).
    assert m.admitted([*good, eos]) == len(good)
    assert m.admitted([eos]) == 0 and m.admitted([]) == 0
    # Read-only: the matcher still takes the whole document, then nothing but the end of turn.
    for t in good:
        m.consume(t)
    assert m.stopped and m.admitted([*good[:1]]) == 0 and m.admitted([eos]) == 0
    # Mid-document: the cut counts from the matcher's position.
    mid = person.matcher()
    for t in good[:part]:
        mid.consume(t)
    assert mid.admitted(good[part:]) == len(good) - part and mid.admitted(bad[part:]) == 0
    # A regex: letters where it wants digits.
    log = compile_constraint(Constraint("regex", LOG_LINE), llg)
    line = llg.tokenize_str("ERR-404: not found.")
    wrong = llg.tokenize_str("ERR-4x4: not found.")
    lm = log.matcher()
    assert lm.admitted(line) == len(line)
    assert 0 < lm.admitted(wrong) == _first_refused(lm, wrong, log.ends) < len(wrong)


def _plain_masks(m: Matcher, draft: list[int], vocab: int) -> torch.Tensor:
    """The masks plain decoding computes at each of the draft's positions: one step at a time, each
    token consumed after its step's mask (on a copy of `m`)."""
    probe = m.fork()
    masks = StepMasks(vocab)
    rows = []
    for i in range(len(draft) + 1):
        st = SamplingState(SamplingParams())
        st.grammar = probe
        pending = masks.start([st])
        assert pending is not None
        rows.append(pending.apply(torch.zeros(1, vocab))[0])
        if i < len(draft):
            probe.consume(draft[i])
    return torch.stack(rows)


def test_drafted_rows_are_masked_as_plain_decoding_masks_each_position(llg: llguidance.LLTokenizer) -> None:
    vocab = llg.vocab_size
    person = _person(llg)
    doc = llg.tokenize_str('{"name":"Ann","age":30,"city":"Paris"}')
    plain_row = SamplingState(SamplingParams())  # a constrained row decoding plainly in the same step
    plain_row.grammar = person.matcher()
    drafted = SamplingState(SamplingParams())
    drafted.grammar = person.matcher()
    for t in doc[:3]:
        drafted.grammar.consume(t)
    draft = doc[3:9]
    free = SamplingState(SamplingParams())  # an unconstrained drafted row: its logits untouched
    free_draft = [5, 6]
    closing = SamplingState(SamplingParams())  # a draft that completes the document
    closing.grammar = person.matcher()
    for t in doc[:-2]:
        closing.grammar.consume(t)
    closing_draft = doc[-2:]
    before = (drafted.grammar.admitted(draft), closing.grammar.admitted(closing_draft))
    assert before == (len(draft), len(closing_draft))
    pending = StepMasks(vocab).start(
        [None, plain_row], [(free, free_draft), (drafted, draft), (closing, closing_draft)]
    )
    assert pending is not None and pending.rows == [0]
    rows = len(free_draft) + 1 + len(draft) + 1 + len(closing_draft) + 1
    logits = torch.randn(rows, vocab)
    raw = logits.clone()
    out = pending.apply_drafts(logits)
    a, b = len(free_draft) + 1, len(free_draft) + 1 + len(draft) + 1
    assert torch.equal(out[:a], raw[:a])
    for got, want_rows in ((out[a:b], (drafted.grammar, draft)), (out[b:], (closing.grammar, closing_draft))):
        m, d = want_rows
        want = _plain_masks(m, d, vocab) == MASKED_LOGIT
        assert torch.equal(got == MASKED_LOGIT, want)
    # The last position after the closing draft allows only the ends of turn.
    allowed = (out[-1] > MASKED_LOGIT / 2).nonzero().flatten().tolist()
    assert set(allowed) == set(person.ends)
    first = pending.apply(torch.zeros(1, vocab))
    assert torch.equal(first == MASKED_LOGIT, _plain_masks(plain_row.grammar, [], vocab) == MASKED_LOGIT)
    # Rolled back: each drafted matcher is where it was (the same cut, the same next mask).
    assert (drafted.grammar.admitted(draft), closing.grammar.admitted(closing_draft)) == before
    assert torch.equal(
        _plain_masks(drafted.grammar, [], vocab)[0], _plain_masks(person.matcher(), doc[:3], vocab)[3]
    )
