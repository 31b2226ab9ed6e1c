"""Compiling a constraint never stalls the engine: its request waits off the schedule, holding nothing,
while others step; a request whose grammar goes wrong mid-generation fails alone."""

from __future__ import annotations

import functools
import json
import threading
import time

import jsonschema
import llguidance
import pytest
from engine_kit import Collector, assert_all_free, run
from structured_kit import PERSON, chat, constrained, person

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.engine import Engine
from radixd.daemon.engine.factory import build_core
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.structured.cache import CompileFn, GrammarCache
from radixd.daemon.structured.matcher import CompiledGrammar, compile_constraint
from radixd.daemon.structured.spec import Constraint
from radixd.daemon.structured.tokenizer import llg_tokenizer

pytestmark = pytest.mark.slow


def _core(lm: LoadedModel, compile: CompileFn, num_blocks: int = 256) -> EngineCore:
    eos = tuple(lm.tokenizer.eos_token_ids)
    tokenizer = functools.partial(llg_tokenizer, lm.tokenizer, lm.config.vocab_size, eos)
    return build_core(
        lm, EngineConfig(), num_blocks=num_blocks, grammars=GrammarCache(tokenizer, compile=compile)
    )


def _gated(gate: threading.Event) -> CompileFn:
    def compile(c: Constraint, tok: llguidance.LLTokenizer) -> CompiledGrammar:
        assert gate.wait(30.0)
        return compile_constraint(c, tok)

    return compile


def test_a_compiling_request_holds_nothing_while_others_run(smollm: LoadedModel) -> None:
    gate = threading.Event()
    core = _core(smollm, _gated(gate))
    col = Collector()
    core.requests.add(GenerateRequest("json", chat(smollm, "A person as JSON."), constrained(person())), col)
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    core.requests.add(GenerateRequest("plain", chat(smollm, "Hello!"), plain), col)
    while not col.finished("plain"):
        assert core.step()
    assert len(col.tokens("plain")) == 6
    # The constrained request waited: never scheduled, no sequence, no block; still in flight.
    assert not col.outs[("json", 0)]
    assert not core.scheduler.has_work() and core.has_work()
    assert core.stats().requests_in_flight == 1 and core.admin.active_blocks() == 0
    gate.set()
    core.run_until_idle()
    jsonschema.validate(json.loads(col.text("json")), PERSON)
    assert_all_free(core)


def test_abort_while_compiling(smollm: LoadedModel) -> None:
    gate = threading.Event()
    core = _core(smollm, _gated(gate), num_blocks=64)
    col = Collector()
    core.requests.add(GenerateRequest("json", chat(smollm, "A person as JSON."), constrained(person())), col)
    assert core.requests.abort("json")
    assert col.final("json").finish_reason == "abort"
    gate.set()
    core.run_until_idle()
    assert len(col.outs[("json", 0)]) == 1
    assert_all_free(core)


def test_a_two_second_compile_delays_only_its_own_request(smollm: LoadedModel) -> None:
    compiled_at: list[float] = []

    def slow(c: Constraint, tok: llguidance.LLTokenizer) -> CompiledGrammar:
        time.sleep(2.0)
        compiled_at.append(time.monotonic())
        return compile_constraint(c, tok)

    engine = Engine(_core(smollm, slow))
    engine.start()
    try:
        done: dict[str, float] = {}
        finished = threading.Event()

        def sink(out: RequestOutput) -> None:
            if out.finished:
                done[out.request_id] = time.monotonic()
                if len(done) == 2:
                    finished.set()

        engine.submit(GenerateRequest("json", chat(smollm, "A person as JSON."), constrained(person())), sink)
        plain = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        engine.submit(GenerateRequest("plain", chat(smollm, "Hello!"), plain), sink)
        assert finished.wait(60.0)
        assert done["plain"] < compiled_at[0] < done["json"]
    finally:
        engine.shutdown(drain_timeout_s=5.0)


def test_a_refused_token_fails_its_request_alone(smollm: LoadedModel) -> None:
    """A grammar that refuses what its own mask allowed (a bug, simulated by a compile that hands out
    a matcher already in its error state) fails that request with INTERNAL; the batch goes on."""

    def broken(c: Constraint, tok: llguidance.LLTokenizer) -> CompiledGrammar:
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_regex("[0-9]+"), log_level=0)
        m.consume_token(tok.tokenize_str("x")[0])
        assert m.is_error()
        return CompiledGrammar(m, tok)

    core = _core(smollm, broken)
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    reqs = [
        GenerateRequest("bad", chat(smollm, "A number:"), constrained(Constraint("regex", "[0-9]+"))),
        GenerateRequest("plain", chat(smollm, "Hello!"), plain),
    ]
    col = run(core, reqs)
    bad = col.final("bad")
    assert bad.finish_reason == "error" and bad.error_code == "internal"
    assert bad.error is not None and "violates the output constraint" in bad.error
    assert col.final("plain").finish_reason == "length" and len(col.tokens("plain")) == 6
    assert core.stats().errors == 1
    assert_all_free(core)
