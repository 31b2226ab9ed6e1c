"""radixd's default reading of a JSON schema (json_reading): closed, compact, bounded where it declares
nothing; what the schema says explicitly wins."""

from __future__ import annotations

from typing import Any

import llguidance

from radixd.daemon.structured.json_reading import ANY_OBJECT, JSON_OPTIONS, MAX_KEYS, default_reading

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a"],
}


def test_objects_that_declare_properties_are_closed_at_every_depth() -> None:
    # smg's shape for tool_choice "required": an array of {name, parameters} alternatives
    calls = {"type": "array", "items": {"type": "object", "anyOf": [{"properties": {"parameters": ADD}}]}}
    read = default_reading(calls)
    branch = read["items"]["anyOf"][0]
    assert branch["additionalProperties"] is False
    assert branch["properties"]["parameters"]["additionalProperties"] is False
    assert "additionalProperties" not in read["items"]  # combined with anyOf: left as written
    assert "additionalProperties" not in ADD  # the caller's schema is not modified
    assert read["x-guidance"] == JSON_OPTIONS  # compact: no whitespace, "," and ":"


def test_an_explicit_reading_wins() -> None:
    assert default_reading({**ADD, "additionalProperties": True})["additionalProperties"] is True
    extra: dict[str, Any] = {"type": "string"}
    assert default_reading({**ADD, "additionalProperties": extra})["additionalProperties"] == extra
    own = default_reading({**ADD, "x-guidance": {"whitespace_flexible": True}})["x-guidance"]
    assert own == {**JSON_OPTIONS, "whitespace_flexible": True}
    # allOf members stay open: closing one would forbid the keys its siblings declare
    both = default_reading({"allOf": [ADD, {"properties": {"c": {"type": "string"}}}]})
    assert all("additionalProperties" not in m for m in both["allOf"])


def test_an_object_that_declares_nothing_is_bounded() -> None:
    read = default_reading(ANY_OBJECT)
    assert read["maxProperties"] == MAX_KEYS and read["additionalProperties"] is False
    nested = default_reading({"type": "object", "properties": {"meta": {"type": "object", "title": "m"}}})
    assert nested["properties"]["meta"]["maxProperties"] == MAX_KEYS
    assert nested["properties"]["meta"]["title"] == "m"


def test_every_reading_compiles() -> None:
    for schema in (
        ADD,
        ANY_OBJECT,
        {"type": "array", "items": ANY_OBJECT},
        {**ADD, "additionalProperties": True},
    ):
        grammar = llguidance.LLMatcher.grammar_from_json_schema(default_reading(schema))
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        assert not is_error, messages
