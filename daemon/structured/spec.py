"""What a request asks its output to match: the one definition of a constraint (at most one per
request), from every wire to the engine; it holds the text as the client sent it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

ConstraintKind = Literal["json_schema", "json_object", "regex", "grammar", "choice", "structural_tag"]
CONSTRAINT_KINDS: tuple[ConstraintKind, ...] = get_args(ConstraintKind)


@dataclass(frozen=True)
class Constraint:
    """One output constraint: `kind` json_schema, regex, grammar (Lark or GBNF) or structural_tag
    carry `text`; json_object has none; choice carries `choices`."""

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
