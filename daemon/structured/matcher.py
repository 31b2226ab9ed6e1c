"""Compiled constraints and the per-sequence matcher that walks one.

A compiled grammar is a pristine `LLMatcher` (first mask computed); each sequence walks a deep copy.
"""

from __future__ import annotations

import llguidance
import torch

from radixd.daemon.structured.grammar import GrammarError, grammar_source
from radixd.daemon.structured.spec import Constraint

# llguidance's default limits bound a hostile grammar's build and every mask step (over them: that
# request fails alone). Short errors: the long form dumps parser state.
LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class GrammarRefused(Exception):
    """A sampled token the matcher refused; fails the request only (`client_fault`: invalid argument,
    else internal)."""

    def __init__(self, message: str, client_fault: bool = False) -> None:
        super().__init__(message)
        self.client_fault = client_fault


class Matcher:
    """One sequence's position in its grammar (part of its `SamplingState`)."""

    __slots__ = ("_grammar", "_tokens", "raw")

    def __init__(self, raw: llguidance.LLMatcher, grammar: CompiledGrammar, tokens: list[int]) -> None:
        self.raw = raw  # what the step's batch mask fill reads (masks.py)
        self._grammar = grammar
        self._tokens = tokens  # consumed so far (replayed only to explain a refusal)

    def consume(self, token_id: int) -> None:
        """Advance by one sampled token; raises GrammarRefused if refused or the matcher is in error."""
        raw = self.raw
        if not raw.consume_token(token_id) or raw.is_error():
            error = raw.get_error()
            why = self._grammar.dead_end(self._tokens)
            if why is not None:
                raise GrammarRefused(why, client_fault=True)
            raise GrammarRefused(f"token {token_id} violates the output constraint: {error}")
        self._tokens.append(token_id)

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here, possibly none (read-only)."""
        raw = self.raw
        if raw.is_error() or raw.is_stopped():
            return []
        return list(raw.compute_ff_tokens())

    def admitted(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order, the grammar admits from here (read-only).
        NOTE: stops before an end of turn, which the rollback history would not hold."""
        raw = self.raw
        if not tokens or raw.is_error() or raw.is_stopped():
            return 0
        n = int(raw.validate_tokens(tokens))
        ends = self._grammar.ends
        return next((i for i, t in enumerate(tokens[:n]) if t in ends), n)

    @property
    def stopped(self) -> bool:
        """The grammar is complete: its next mask allows only ends of turn."""
        return bool(self.raw.is_stopped())

    def fork(self) -> Matcher:
        """An independent copy at the same position (n > 1, beams)."""
        return Matcher(self.raw.deep_copy(), self._grammar, list(self._tokens))


class CompiledGrammar:
    """A compiled constraint: a pristine matcher, copied for each sequence. Immutable once built."""

    __slots__ = ("_ends", "_pristine", "_tokenizer")

    def __init__(self, pristine: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer) -> None:
        self._pristine = pristine
        self._tokenizer = tokenizer
        self._ends: frozenset[int] | None = None

    @property
    def ends(self) -> frozenset[int]:
        """The end-of-turn tokens (what a finished grammar allows)."""
        if self._ends is None:
            self._ends = frozenset(self._tokenizer.eos_tokens)
        return self._ends

    def matcher(self) -> Matcher:
        """A fresh matcher at the grammar's start."""
        return Matcher(self._pristine.deep_copy(), self, [])

    def dead_end(self, tokens: list[int]) -> str | None:
        """Why the grammar cannot go on after `tokens` here, or None (then a refusal is a bug)."""
        m = self._pristine.deep_copy()
        if not m.consume_tokens(tokens) or m.is_error():
            return None
        why = unproducible(m, self._tokenizer)
        if why is not None:
            return why
        error = next_mask_error(m, self._tokenizer)
        if error is not None:
            return f"the output constraint cannot go on after {len(tokens)} tokens: {error}"
        return None


def next_mask_error(m: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer) -> str | None:
    """Compute `m`'s next mask (into scratch); -> the error it left `m` in (some show only there)."""
    import llguidance.torch  # not at start-up: see executor/masks.py

    scratch = torch.empty((1, (tokenizer.vocab_size + 31) // 32), dtype=torch.int32)
    llguidance.torch.fill_next_token_bitmask(m, scratch, 0)
    return str(m.get_error()) if m.is_error() else None


def unproducible(m: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer) -> str | None:
    """A message when the bytes `m`'s grammar forces next cannot be spelled by the vocabulary (the mask
    would allow what consume refuses): the client's fault, not an internal error."""
    ff = bytes(m.compute_ff_bytes())
    if not ff or tokenizer.decode_bytes(tokenizer.tokenize_bytes(ff)) == ff:
        return None
    return (
        f"the output constraint forces the bytes {ff[:64]!r} next, which this model's vocabulary "
        "cannot produce (it has no token for some of them); change the constraint to allow other text"
    )


def compile_constraint(
    c: Constraint, tokenizer: llguidance.LLTokenizer, limits: llguidance.LLParserLimits = LIMITS
) -> CompiledGrammar:
    """Build `c`'s matcher and first mask; raises GrammarError. Blocking (drops the GIL): off-thread."""
    m = llguidance.LLMatcher(tokenizer, grammar_source(c, tokenizer), log_level=0, limits=limits)
    if m.is_error():
        raise GrammarError(f"invalid {c.kind} constraint: {m.get_error()}")
    why = unproducible(m, tokenizer)
    if why is not None:
        raise GrammarError(f"invalid {c.kind} constraint: {why}")
    error = next_mask_error(m, tokenizer)
    if error is not None:
        raise GrammarError(f"invalid {c.kind} constraint: {error}")
    return CompiledGrammar(m, tokenizer)
