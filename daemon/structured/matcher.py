"""Compiled constraints and the per-sequence matcher that walks one.

llguidance has no compiled-grammar object: an `LLMatcher` is built from the grammar text (its lexer
lazily). `compile_constraint` builds one and computes its first mask (warming the lexer, and surfacing
errors that only show there); that pristine matcher is the `CompiledGrammar` the cache keeps, and each
sequence walks its own deep copy (`CompiledGrammar.matcher()`, 25-50 us).
"""

from __future__ import annotations

import llguidance
import llguidance.torch
import torch

from radixd.daemon.structured.grammar import GrammarError, grammar_source
from radixd.daemon.structured.spec import Constraint

# NOTE: llguidance's defaults bound a hostile grammar's build (fuel, states, size) and every mask step
# (lexer fuel, Earley items): a grammar over them fails to compile, a step over them puts the matcher
# in an error state that fails its request alone. Short errors: the long form dumps parser state.
LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class GrammarRefused(Exception):
    """A sampled token the matcher refused: the mask allowed it (a bug) or a step ran over the limits.
    Fails the sequence's request, not the batch."""


class Matcher:
    """One sequence's position in its grammar (part of its `SamplingState`)."""

    __slots__ = ("raw",)

    def __init__(self, raw: llguidance.LLMatcher) -> None:
        self.raw = raw  # what the step's batch mask fill reads (masks.py)

    def consume(self, token_id: int) -> None:
        """Advance by one sampled token; raises GrammarRefused when the grammar does not allow it, or
        when the matcher broke earlier (a mask step over the limits leaves it in its error state, where
        it still takes an end-of-turn token)."""
        raw = self.raw
        if not raw.consume_token(token_id) or raw.is_error():
            raise GrammarRefused(f"token {token_id} violates the output constraint: {raw.get_error()}")

    @property
    def stopped(self) -> bool:
        """The grammar is complete and admits nothing more: its next mask allows only the ends of turn,
        so the sequence ends with "stop" on the next token, which closes the turn as any output does."""
        return bool(self.raw.is_stopped())

    def fork(self) -> Matcher:
        """An independent copy at the same position (n > 1, beams)."""
        return Matcher(self.raw.deep_copy())


class CompiledGrammar:
    """A compiled constraint: a pristine matcher, copied for each sequence. Immutable once built."""

    __slots__ = ("_pristine",)

    def __init__(self, pristine: llguidance.LLMatcher) -> None:
        self._pristine = pristine

    def matcher(self) -> Matcher:
        """A fresh matcher at the grammar's start."""
        return Matcher(self._pristine.deep_copy())


def compile_constraint(
    c: Constraint, tokenizer: llguidance.LLTokenizer, limits: llguidance.LLParserLimits = LIMITS
) -> CompiledGrammar:
    """Build `c`'s matcher over `tokenizer` and compute its first mask; raises GrammarError with
    llguidance's message. Blocking (about 1-3 ms, bounded by `limits`; drops the GIL): call it off the
    engine thread."""
    m = llguidance.LLMatcher(tokenizer, grammar_source(c, tokenizer), log_level=0, limits=limits)
    if m.is_error():
        raise GrammarError(f"invalid {c.kind} constraint: {m.get_error()}")
    scratch = torch.empty((1, (tokenizer.vocab_size + 31) // 32), dtype=torch.int32)
    llguidance.torch.fill_next_token_bitmask(m, scratch, 0)
    if m.is_error():
        raise GrammarError(f"invalid {c.kind} constraint: {m.get_error()}")
    return CompiledGrammar(m)
