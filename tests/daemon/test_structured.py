"""Structured outputs below the engine: constraint -> grammar, the compile cache, the matcher."""

from __future__ import annotations

import functools
import json
import threading
import time

import llguidance
import pytest
import torch

from radixd.daemon.executor.masks import StepMasks
from radixd.daemon.executor.sampling import MASKED_LOGIT, SamplingParams, SamplingState
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.structured.cache import GrammarCache
from radixd.daemon.structured.grammar import GrammarError, canonical
from radixd.daemon.structured.matcher import CompiledGrammar, GrammarRefused, compile_constraint
from radixd.daemon.structured.spec import Constraint
from radixd.daemon.structured.tokenizer import llg_tokenizer


def _never_tokenizer() -> llguidance.LLTokenizer:
    raise AssertionError("the fake compiles below never read the tokenizer")


class _Counting:
    """A fake compile: counts calls, optionally waits on a gate, fails on constraints marked 'bad'."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls = 0
        self.gate = gate

    def __call__(self, c: Constraint, tok: object) -> CompiledGrammar:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(10.0)
        if "bad" in c.text:
            raise GrammarError(f"invalid {c.kind} constraint: bad")
        return CompiledGrammar(None, None)  # type: ignore[arg-type]


def _cache(compile: _Counting, **kw: object) -> GrammarCache:
    return GrammarCache(lambda: None, compile=compile, **kw)  # type: ignore[arg-type, return-value]


def test_canonical_form_ignores_whitespace_but_keeps_key_order() -> None:
    a = Constraint("json_schema", '{"type": "object", "properties": {"a": {}, "b": {}}}')
    same = Constraint("json_schema", '{"type":"object",\n "properties":{"a":{},"b":{}}}')
    reordered = Constraint("json_schema", '{"type": "object", "properties": {"b": {}, "a": {}}}')
    assert canonical(a) == canonical(same)
    # llguidance emits properties in schema order: another order is another grammar.
    assert canonical(a) != canonical(reordered)
    assert canonical(Constraint("regex", "a+")) != canonical(Constraint("grammar", "a+"))
    assert canonical(Constraint("choice", choices=("a", "b"))) != canonical(
        Constraint("choice", choices=("b", "a"))
    )


def test_concurrent_misses_share_one_compile_and_hits_are_done_at_once() -> None:
    gate = threading.Event()
    compile = _Counting(gate)
    cache = _cache(compile)
    c = Constraint("regex", "[0-9]+")
    first, second = cache.get(c), cache.get(Constraint("regex", "[0-9]+"))
    assert first is second and not first.done()
    gate.set()
    first.result(5.0)
    assert cache.get(c).done() and compile.calls == 1
    assert (cache.counts.hits, cache.counts.misses) == (2, 1)
    cache.shutdown()


def test_failures_are_kept_briefly_then_recompiled() -> None:
    compile = _Counting()
    cache = _cache(compile, error_ttl_s=0.2)
    bad = Constraint("regex", "bad")
    with pytest.raises(GrammarError, match="bad"):
        cache.get(bad).result(5.0)
    with pytest.raises(GrammarError):
        cache.get(bad).result(5.0)
    assert compile.calls == 1
    time.sleep(0.3)
    with pytest.raises(GrammarError):
        cache.get(bad).result(5.0)
    assert compile.calls == 2
    cache.shutdown()


def test_the_lru_is_bounded() -> None:
    compile = _Counting()
    cache = _cache(compile, max_entries=3)
    for i in range(5):
        cache.get(Constraint("regex", f"x{i}")).result(5.0)
    assert len(cache) == 3
    cache.get(Constraint("regex", "x4")).result(5.0)  # recent: kept
    cache.get(Constraint("regex", "x0")).result(5.0)  # evicted: compiled again
    assert compile.calls == 6
    cache.shutdown()


@pytest.fixture(scope="module")
def llg(smollm: LoadedModel) -> llguidance.LLTokenizer:
    tok = smollm.tokenizer
    return llg_tokenizer(tok, smollm.config.vocab_size, tuple(tok.eos_token_ids))


@pytest.mark.slow
def test_the_tokenizer_is_built_once_per_model(smollm: LoadedModel, llg: llguidance.LLTokenizer) -> None:
    tok = smollm.tokenizer
    again = llg_tokenizer(tok, smollm.config.vocab_size, tuple(tok.eos_token_ids))
    assert again is llg and llg.vocab_size == smollm.config.vocab_size


@pytest.mark.slow
def test_structural_tag_in_vllms_shape(smollm: LoadedModel, llg: llguidance.LLTokenizer) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    spec = {
        "type": "structural_tag",
        "structures": [{"begin": "<function=weather>", "schema": schema, "end": "</function>"}],
        "triggers": ["<function="],
    }
    compiled = compile_constraint(Constraint("structural_tag", json.dumps(spec)), llg)
    encode = functools.partial(smollm.tokenizer.encode, add_special_tokens=False)
    ok = compiled.matcher()
    for t in encode('Let me check. <function=weather>{"city":"Paris"}</function>'):
        ok.consume(t)
    bad = compiled.matcher()
    with pytest.raises(GrammarRefused):
        for t in encode('Let me check. <function=weather>{"town": 1}'):
            bad.consume(t)


@pytest.mark.slow
def test_matcher_forks_walk_apart_and_the_state_tracks_its_history(llg: llguidance.LLTokenizer) -> None:
    choice = Constraint("choice", choices=("yes", "no"))
    compiled = compile_constraint(choice, llg)
    yes, no = llg.tokenize_str("yes"), llg.tokenize_str("no")
    state = SamplingState(SamplingParams(max_tokens=8, constraint=choice), eos_token_ids=(2,))
    state.grammar = compiled.matcher()
    child = state.fork(seed=1)
    for t in yes:
        state.append(t)
    assert state.grammar.stopped and state.finish_reason(yes[-1]) is None  # the end of turn comes next
    probe = state.fork(seed=2)  # a refused token breaks its matcher: probe on a copy
    with pytest.raises(GrammarRefused):
        probe.append(no[0])
    assert probe.output_token_ids == yes  # a refused token is not recorded
    state.append(2)
    assert state.finish_reason(2) == "stop"
    for t in no:
        child.append(t)
    assert child.output_token_ids == no and child.grammar is not None and child.grammar.stopped
    # Complete exactly at max_tokens: a whole document, so "stop" rather than "length".
    short = SamplingState(SamplingParams(max_tokens=len(no), constraint=choice), eos_token_ids=(2,))
    short.grammar = compiled.matcher()
    for t in no:
        short.append(t)
    assert short.finish_reason(no[-1]) == "stop"


@pytest.mark.slow
def test_masks_touch_only_constrained_rows(llg: llguidance.LLTokenizer) -> None:
    compiled = compile_constraint(Constraint("choice", choices=("yes", "no")), llg)
    vocab = llg.vocab_size
    states: list[SamplingState | None] = [
        SamplingState(SamplingParams()),
        None,  # a row that does not sample: not a logits row
        SamplingState(SamplingParams()),
        SamplingState(SamplingParams()),
    ]
    states[2].grammar = compiled.matcher()  # type: ignore[union-attr]
    logits = torch.randn(3, vocab)
    before = logits.clone()
    assert StepMasks(vocab).start([SamplingState(SamplingParams())]) is None
    pending = StepMasks(vocab).start(states)
    assert pending is not None and pending.rows == [1]
    out = pending.apply(logits)
    assert torch.equal(out[0], before[0]) and torch.equal(out[2], before[2])
    allowed = (out[1] > MASKED_LOGIT / 2).nonzero().flatten().tolist()
    assert set(llg.tokenize_str("yes")[:1] + llg.tokenize_str("no")[:1]) <= set(allowed)
    assert 2 <= len(allowed) < 10
    assert torch.equal(out[1][allowed], before[1][allowed])
