"""The client's constraint options -> the wire's `oneof constraint`, and radixctl's constraint flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from radixd_client.cli import _sampling, build_parser
from radixd_client.types import CONSTRAINT_OPTIONS, to_sampling

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_each_option_sets_its_field_of_the_oneof() -> None:
    msg = to_sampling({"json_schema": SCHEMA, "max_tokens": 8})
    assert msg.WhichOneof("constraint") == "json_schema" and json.loads(msg.json_schema) == SCHEMA
    assert msg.max_tokens == 8
    assert to_sampling({"json_schema": '{"type": "object"}'}).json_schema == '{"type": "object"}'
    assert to_sampling({"regex": "[0-9]+"}).regex == "[0-9]+"
    assert to_sampling({"grammar": 'root ::= "a"'}).grammar == 'root ::= "a"'
    assert to_sampling({"structural_tag": "{}"}).WhichOneof("constraint") == "structural_tag"
    json_object = to_sampling({"json_object": True})
    assert json_object.WhichOneof("constraint") == "json_object" and json_object.json_object
    assert list(to_sampling({"choice": ("yes", "no")}).choice.choices) == ["yes", "no"]


def test_no_constraint_leaves_the_oneof_unset() -> None:
    assert to_sampling({"temperature": 0.0}).WhichOneof("constraint") is None
    # json_object=False asks for nothing, so it neither sets the field nor counts as a constraint
    assert to_sampling({"json_object": False}).WhichOneof("constraint") is None
    assert to_sampling({"json_object": False, "regex": "a"}).WhichOneof("constraint") == "regex"


@pytest.mark.parametrize(
    "options",
    [
        {"json_schema": SCHEMA, "regex": "a"},
        {"choice": ["a"], "json_object": True},
        {"grammar": "start: 'a'", "structural_tag": "{}"},
    ],
)
def test_two_constraints_are_a_clear_value_error(options: dict[str, object]) -> None:
    given = " and ".join(k for k in CONSTRAINT_OPTIONS if k in options)
    with pytest.raises(ValueError, match=f"set at most one constraint .*; got {given}$"):
        to_sampling(options)  # type: ignore[arg-type]


def test_choice_must_not_be_one_string() -> None:
    with pytest.raises(TypeError, match="sequence of strings"):
        to_sampling({"choice": "yes"})


def test_radixctl_constraint_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: "yes" | "no"\n')
    parse = build_parser().parse_args
    opts = _sampling(parse(["generate", "p", "--json-schema", str(schema)]))
    assert json.loads(str(opts["json_schema"])) == SCHEMA
    assert _sampling(parse(["generate", "p", "--grammar", str(grammar)]))["grammar"] == grammar.read_text()
    assert _sampling(parse(["generate", "p", "--regex", "[a-z]+"]))["regex"] == "[a-z]+"
    assert _sampling(parse(["generate", "p", "--choice", "red,green,blue"]))["choice"] == [
        "red",
        "green",
        "blue",
    ]
    assert _sampling(parse(["generate", "p", "--json-object"]))["json_object"] is True
    assert _sampling(parse(["chat", "--json-object"]))["json_object"] is True
    assert not set(CONSTRAINT_OPTIONS) & set(_sampling(parse(["generate", "p"])))
    for argv, why in [
        (["--regex", "a", "--json-object"], "not allowed with argument"),
        (["--choice", "a,,b"], "has an empty choice"),
        (["--json-schema", str(tmp_path / "missing.json")], "cannot read"),
    ]:
        with pytest.raises(SystemExit) as done:
            parse(["generate", "p", *argv])
        assert done.value.code == 2 and why in capsys.readouterr().err
