"""How radixd reads a JSON schema by default: the one definition every wire's JSON constraint gets
(`json_schema`, `json_object`, a structural tag's schemas; radixd's gRPC and the vLLM worker protocol).

- compact: no whitespace between tokens, `,` and `:` separators (llguidance's `x-guidance` options);
  a schema's own root `x-guidance` wins (`{"whitespace_flexible": true}` allows free whitespace);
- closed: an object schema that declares `properties` admits no other key unless it says so itself
  (`additionalProperties`, `patternProperties`, `unevaluatedProperties`), as OpenAI's strict mode and
  xgrammar's default; an object combined with `allOf`/`anyOf`/`oneOf`/`$ref` is left as written
  (closing it would forbid the keys its combined schemas declare), its members are read alike;
- bounded: an object that declares nothing (`{"type": "object"}`, what `json_object` means) is any
  JSON object within the `MAX_*` bounds below, so a small model's output closes.

NOTE: the reading is a pure function of the schema text, so the compile cache's key stays the text.
"""

from __future__ import annotations

from typing import Any, Final

JSON_OPTIONS: Final[dict[str, Any]] = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
}
MAX_KEYS: Final = 8
MAX_KEY_CHARS: Final = 32
MAX_STRING_CHARS: Final = 128
MAX_ITEMS: Final = 8
MAX_DEPTH: Final = 3  # nested objects/arrays in an undeclared object, itself included

ANY_OBJECT: Final[dict[str, Any]] = {"type": "object"}

# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE = (
    *("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else"),
    *("unevaluatedProperties", "unevaluatedItems", "propertyNames"),
)
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPENS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_COMBINES = ("allOf", "anyOf", "oneOf", "$ref")
# What an object that "declares nothing" may still carry: annotations only.
_ANNOTATIONS = {"type", "title", "description", "$schema", "$id", "$comment", "default", "examples"}


def _any_value(depth: int) -> dict[str, Any]:
    scalars: list[dict[str, Any]] = [
        {"type": "string", "maxLength": MAX_STRING_CHARS},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
    ]
    if depth > 0:
        scalars.append({"type": "array", "maxItems": MAX_ITEMS, "items": _any_value(depth - 1)})
        scalars.append(_any_object(depth))
    return {"anyOf": scalars}


def _any_object(depth: int) -> dict[str, Any]:
    key = f'^[^"\\\\\\x00-\\x1f]{{1,{MAX_KEY_CHARS}}}$'
    return {
        "type": "object",
        "maxProperties": MAX_KEYS,
        "patternProperties": {key: _any_value(depth - 1)},
        "additionalProperties": False,
    }


def _declares_nothing(node: dict[str, Any]) -> bool:
    return node.get("type") == "object" and set(node) <= _ANNOTATIONS


def _read(node: Any, close: bool = True) -> Any:
    if not isinstance(node, dict):
        return node  # a boolean schema
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _MAP and isinstance(value, dict):
            out[key] = {name: _read(sub) for name, sub in value.items()}
        elif key in _LIST and isinstance(value, list):
            out[key] = [_read(sub, close=key != "allOf") for sub in value]
        elif key in _ONE:
            out[key] = [_read(sub) for sub in value] if isinstance(value, list) else _read(value)
        else:
            out[key] = value
    if close and _declares_nothing(out):
        return {**out, **_any_object(MAX_DEPTH)}
    if close and "properties" in out and not any(k in out for k in _OPENS + _COMBINES):
        out["additionalProperties"] = False
    return out


def default_reading(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as radixd compiles it: closed, bounded where it declares nothing, compact unless its
    root `x-guidance` says otherwise."""
    out: dict[str, Any] = _read(schema)
    own = schema.get("x-guidance")
    out["x-guidance"] = {**JSON_OPTIONS, **(own if isinstance(own, dict) else {})}
    return out
