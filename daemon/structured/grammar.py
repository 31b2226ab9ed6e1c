"""A `Constraint` as llguidance grammar text, and its canonical form (the compile cache's key).

Every kind maps onto llguidance's Lark (GBNF recognized by `::=`); what cannot raises `GrammarError`.
Every JSON schema is read as `json_reading` says (closed objects, compact separators, bounded open ones).
"""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance

from radixd.daemon.structured.json_reading import ANY_OBJECT, default_reading
from radixd.daemon.structured.spec import Constraint

# A GBNF rule starts a line: `name ::= ...` (Lark writes `name: ...`).
_GBNF_RULE = re.compile(r"^\s*[A-Za-z_][\w.-]*\s*::=", re.MULTILINE)


class GrammarError(ValueError):
    """A constraint that does not compile (bad or over the limits); reported as an invalid argument."""


def _json(kind: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise GrammarError(f"the {kind} constraint is not valid JSON: {exc}") from None


def canonical(c: Constraint) -> str:
    """The constraint's cache key: equal for constraints that compile to the same grammar.
    NOTE: a schema keeps its key order (llguidance emits properties in that order)."""
    if c.kind == "json_schema":
        try:
            text = json.dumps(json.loads(c.text), separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            text = c.text  # compiling it reports the error
    elif c.kind == "choice":
        text = json.dumps(list(c.choices), ensure_ascii=False)
    else:
        text = c.text
    return f"{c.kind}\x00{text}"


def grammar_source(c: Constraint, tokenizer: llguidance.LLTokenizer) -> str:
    """The llguidance grammar of `c`; raises GrammarError when `c` cannot be expressed as one."""
    kind = c.kind
    try:
        if kind == "json_schema":
            schema = _json(kind, c.text)
            if not isinstance(schema, dict):
                raise GrammarError("a json_schema constraint must be a JSON object (a JSON Schema document)")
            return str(llguidance.LLMatcher.grammar_from_json_schema(default_reading(schema)))
        if kind == "json_object":
            return str(llguidance.LLMatcher.grammar_from_json_schema(default_reading(ANY_OBJECT)))
        if kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(c.text))
        if kind == "choice":
            alternatives = " | ".join(json.dumps(choice, ensure_ascii=False) for choice in c.choices)
            return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}"))
        if kind == "grammar":
            if _GBNF_RULE.search(c.text):
                return str(llguidance.grammar_from("gbnf", c.text))
            return str(llguidance.LLMatcher.grammar_from_lark(c.text))
        return _structural_tag(c.text, tokenizer)
    except GrammarError:
        raise
    except (ValueError, TypeError, AssertionError) as exc:
        raise GrammarError(f"invalid {kind} constraint: {exc}") from None


def _structural_tag(text: str, tokenizer: llguidance.LLTokenizer) -> str:
    """vLLM's structural tag: free text until a trigger, then `begin`, `schema`, `end`; repeated."""
    spec = _json("structural_tag", text)
    if not isinstance(spec, dict) or not isinstance(spec.get("structures"), list):
        raise GrammarError(
            'a structural_tag constraint must be a JSON object {"structures": [{"begin": ..., "schema": '
            '..., "end": ...}], "triggers": [...]} (vLLM\'s shape); other shapes are not supported'
        )
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise GrammarError("a structural_tag constraint needs a non-empty list of non-empty trigger strings")
    tags: list[llguidance.StructTag] = []
    for i, s in enumerate(spec["structures"]):
        if (
            not isinstance(s, dict)
            or not isinstance(s.get("begin"), str)
            or not isinstance(s.get("end"), str)
        ):
            raise GrammarError(f"structural_tag structure {i} needs string 'begin' and 'end' and a 'schema'")
        schema = s.get("schema", {})
        if not isinstance(schema, dict):
            raise GrammarError(f"structural_tag structure {i}: 'schema' must be a JSON Schema object")
        trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
        if trigger is None:
            raise GrammarError(
                f"structural_tag structure {i}: its begin {s['begin']!r} starts with no trigger"
            )
        tags.append(
            llguidance.StructTag(
                trigger=trigger, begin=s["begin"], grammar=default_reading(schema), end=s["end"]
            )
        )
    if not tags:
        raise GrammarError("a structural_tag constraint needs at least one structure")
    # A `<...>` trigger is a special token only where the vocabulary has it as one.
    special = all(_is_special(t, tokenizer) for t in triggers if t.startswith("<") and t.endswith(">"))
    return llguidance.StructTag.to_grammar(tags, assume_special=special)


def _is_special(text: str, tokenizer: llguidance.LLTokenizer) -> bool:
    ids = tokenizer.tokenize_str(text, parse_special=True)
    return len(ids) == 1 and tokenizer.is_special_token(ids[0])
