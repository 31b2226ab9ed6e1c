"""Constraints the structured-output engine tests share, with the checks their outputs must pass."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.structured.spec import Constraint

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
LOG_LINE = r"(ERR|WARN|INFO)-[0-9]{3}: [a-z]+( [a-z]+){0,4}\."
ANSWERS = ("yes", "no", "not sure")
# One arithmetic language in both dialects (Python's parser checks the outputs).
LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /[1-9][0-9]{0,2}/
"""
GBNF = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [1-9] [0-9]? [0-9]?
"""


def person() -> Constraint:
    return Constraint("json_schema", json.dumps(PERSON))


def chat(lm: LoadedModel, question: str) -> list[int]:
    return lm.tokenizer.encode_chat([{"role": "user", "content": question}])


def constrained(c: Constraint, max_tokens: int = 64, **kw: Any) -> SamplingParams:
    kw.setdefault("temperature", 0.0)
    return SamplingParams(max_tokens=max_tokens, constraint=c, **kw)


def is_expression(text: str) -> bool:
    if not text or set(text) - set("0123456789+-*/()"):
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)
    return all(isinstance(n, allowed) for n in ast.walk(tree))


def is_log_line(text: str) -> bool:
    return re.fullmatch(LOG_LINE, text) is not None
