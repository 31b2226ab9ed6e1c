"""What a request asks its output to match: the one name and definition of a constraint, from every
wire to the engine.

A wire turns its fields into one `Constraint` (at most one per request, as vLLM's guided decoding
and OpenAI's `response_format` / `tools`); the engine compiles it off its thread and masks every token
the constraint forbids. `Constraint` holds the text as the client sent it: sizes are checked by the
server's bounds before anything is built, syntax by the compiler (a bad schema, regex or grammar is an
`InvalidRequest` carrying the library's message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

ConstraintKind = Literal["json_schema", "json_object", "regex", "grammar", "choice", "structural_tag"]
CONSTRAINT_KINDS: tuple[ConstraintKind, ...] = get_args(ConstraintKind)


@dataclass(frozen=True)
class Constraint:
    """One output constraint.

    - ``json_schema``: `text` is a JSON Schema document (JSON text);
    - ``json_object``: any JSON object; `text` is empty;
    - ``regex``: `text` is a regular expression the whole output must match;
    - ``grammar``: `text` is a context-free grammar, Lark (llguidance's dialect) or GBNF (llama.cpp's,
      recognized by its `::=` rules);
    - ``choice``: the output is exactly one of `choices`; `text` is empty;
    - ``structural_tag``: `text` is a structural-tag JSON document (vLLM's / OpenAI's tool-call
      tags: free text until a trigger, then the tag's schema).
    """

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            kinds = ", ".join(CONSTRAINT_KINDS)
            raise ValueError(f"unknown constraint kind {self.kind!r} (choose from {kinds})")
        object.__setattr__(self, "choices", tuple(self.choices))
        if self.kind == "choice":
            if not self.choices or not all(isinstance(c, str) and c for c in self.choices):
                raise ValueError("a choice constraint needs at least one non-empty string")
        elif self.choices:
            raise ValueError(f"a {self.kind} constraint takes no choices")
        if self.kind in ("json_object", "choice"):
            if self.text:
                raise ValueError(f"a {self.kind} constraint takes no text")
        elif not self.text:
            raise ValueError(f"a {self.kind} constraint needs its text (it is empty)")
