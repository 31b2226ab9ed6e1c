"""A wire's `oneof constraint` -> the engine's `Constraint`, after the bounds (radixd and vLLM spell
it alike). Whether it compiles is the engine's to say.
"""

from __future__ import annotations

from typing import Protocol

from radixd.daemon.server.common.bounds import check_choices, check_constraint_text, check_json_schema
from radixd.daemon.structured.spec import Constraint


class _HasConstraint(Protocol):
    """A message with a `oneof constraint` spelled as vLLM spells it."""

    def WhichOneof(self, oneof_group: str, /) -> str | None: ...


def wire_constraint(msg: _HasConstraint, what: str) -> Constraint | None:
    """The constraint a sampling message carries, or None (`json_object: false` is none)."""
    field = msg.WhichOneof("constraint")
    if field is None:
        return None
    name = f"{what}.{field}"
    value = getattr(msg, field)
    if field == "json_object":
        return Constraint("json_object") if value else None
    if field == "choice":
        return Constraint("choice", choices=check_choices(f"{name}.choices", list(value.choices)))
    if field == "json_schema":
        return Constraint("json_schema", check_json_schema(name, value))
    if field == "regex":
        return Constraint("regex", check_constraint_text(name, value))
    if field == "grammar":
        return Constraint("grammar", check_constraint_text(name, value))
    if field == "structural_tag":
        return Constraint("structural_tag", check_constraint_text(name, value))
    raise AssertionError(f"unknown constraint field {field!r}")  # a proto change not mapped here
