"""Constrained generation through radixd's gRPC with the real model: every output matches its constraint.

Each constraint kind is asked through the Python client's options (which fill the proto's `oneof
constraint`), through a session turn, and through radixctl's flags; outputs are checked by an
independent judge (`re.fullmatch`, `json.loads`, the `jsonschema` library), never by the engine's own
matcher. A constraint the library cannot compile is INVALID_ARGUMENT carrying the library's message on
both radixd's wire and the vLLM servicer's, and the daemon keeps serving.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
from e2e_kit import RunningDaemon
from radixd_client.cli import main as radixctl
from radixd_client.types import Completion
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

pytestmark = pytest.mark.slow
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "colour"],
    "additionalProperties": False,
}
ASK_PERSON = [{"role": "user", "content": "Describe a person as JSON with name, age and favourite colour."}]
PHONE = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"
LARK = 'start: answer " because " reason\nanswer: "yes" | "no"\nreason: /[a-z ]{3,30}/ "."\n'
LARK_OUT = r"(yes|no) because [a-z ]{3,30}\."
GBNF = 'root ::= "The answer is " digit digit "."\ndigit ::= [0-9]\n'
GBNF_OUT = r"The answer is [0-9]{2}\."


def _done(out: Completion) -> None:
    """A constrained output ends because its grammar did (not cut short by max_tokens)."""
    assert out.finish_reason == "stop", (out.finish_reason, out.text)


def test_regex_choice_and_grammars_through_the_client(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        assert "structured_outputs" in c.model_info().features
        phone = c.complete("My office phone number is", regex=PHONE, max_tokens=32, temperature=0.0)
        assert re.fullmatch(PHONE, phone.text), phone.text
        _done(phone)
        colours = ("crimson red", "forest green", "sky blue")
        for seed in range(3):  # sampled, not only greedy: the mask holds whatever the draw
            pick = c.complete("My favourite colour is", choice=colours, max_tokens=16, seed=seed)
            assert pick.text in colours, pick.text
            _done(pick)
        lark = c.complete([{"role": "user", "content": "Is the sky blue?"}], grammar=LARK, max_tokens=48)
        assert re.fullmatch(LARK_OUT, lark.text), lark.text
        _done(lark)
        gbnf = c.complete("What is six times seven?", grammar=GBNF, max_tokens=16, temperature=0.0)
        assert re.fullmatch(GBNF_OUT, gbnf.text), gbnf.text
        _done(gbnf)


def test_json_schema_and_json_object_outputs_are_valid(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        for schema in (PERSON, json.dumps(PERSON)):  # a dict or JSON text
            out = c.complete(ASK_PERSON, json_schema=schema, max_tokens=160, temperature=0.0)
            _done(out)
            jsonschema.validate(json.loads(out.text), PERSON)
        sampled = c.complete(ASK_PERSON, json_schema=PERSON, max_tokens=160, n=3, seed=11, temperature=0.8)
        for i in range(3):
            assert sampled.ends[i].finish_reason == "stop", sampled.texts[i]
            jsonschema.validate(json.loads(sampled.texts[i]), PERSON)
        obj = c.complete(ASK_PERSON, json_object=True, max_tokens=160, temperature=0.0)
        _done(obj)
        assert isinstance(json.loads(obj.text), dict), obj.text


def test_a_session_turn_is_constrained_and_the_next_turn_reuses_its_tokens(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        session = c.create_session("You are a helpful assistant that answers in JSON.")
        try:
            first = Completion()
            for event in session.send(ASK_PERSON, json_schema=PERSON, max_tokens=160, temperature=0.0):
                first.add(event)
            _done(first)
            jsonschema.validate(json.loads(first.text), PERSON)
            second = Completion()
            for event in session.send("Is that person older than 30?", choice=["yes", "no"], max_tokens=4):
                second.add(event)
            assert second.text in ("yes", "no")
            # the constrained reply is in the session's context and was cached like any other turn
            block = c.model_info().block_size  # the cache matches whole blocks
            assert second.cached_tokens >= first.prompt_tokens + first.completion_tokens - block
        finally:
            c.close_session(session.id)


def test_radixctl_constraint_flags(
    daemon: RunningDaemon, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = ["--address", daemon.address, "generate", "--temperature", "0", "--max-tokens", "160"]
    schema = tmp_path / "person.schema.json"
    schema.write_text(json.dumps(PERSON))
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text(GBNF)
    cases: list[tuple[list[str], Any]] = [
        (["A colour:", "--choice", "red,green,blue"], lambda t: t in ("red", "green", "blue")),
        (["Call me at", "--regex", PHONE], lambda t: re.fullmatch(PHONE, t)),
        (["Six times seven?", "--grammar", str(grammar)], lambda t: re.fullmatch(GBNF_OUT, t)),
        (
            ["A person as JSON:", "--json-schema", str(schema)],
            lambda t: jsonschema.validate(json.loads(t), PERSON) is None,
        ),
        (["A JSON object:", "--json-object"], lambda t: isinstance(json.loads(t), dict)),
    ]
    for argv, valid in cases:
        assert radixctl([*base, "--json", *argv]) == 0
        # --json: one JSON line per event (the in-process daemon's log lines share stdout)
        lines = capsys.readouterr().out.splitlines()
        events = [json.loads(line) for line in lines if line.startswith('{"type"')]
        text = "".join(e["text"] for e in events if e["type"] == "chunk")
        assert [e["finish_reason"] for e in events if e["type"] == "end"] == ["stop"], (argv, events)
        assert valid(text), (argv, text)
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object",')
    assert radixctl([*base, "A person:", "--json-schema", str(bad)]) == 2
    assert "INVALID_ARGUMENT: sampling.json_schema is not valid JSON" in capsys.readouterr().err


# (constraint, a phrase of the library's own message)
UNCOMPILABLE: list[tuple[dict[str, Any], str]] = [
    ({"regex": "("}, "unclosed group"),
    ({"grammar": "start: missing_rule\n"}, "unknown name"),
    ({"grammar": "root ::= missing-rule\n"}, "missing-rule"),
    ({"json_schema": '{"type": "bogus"}'}, "bogus"),
]


@pytest.mark.parametrize(("sampling", "needle"), UNCOMPILABLE, ids=[s for c, _ in UNCOMPILABLE for s in c])
def test_a_constraint_the_library_cannot_compile_is_invalid_argument_with_its_message(
    daemon: RunningDaemon, sampling: dict[str, Any], needle: str
) -> None:
    with daemon.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete("Hello", max_tokens=4, **sampling)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert needle in (err.value.details() or ""), err.value.details()
        session = c.create_session("You are terse.")
        try:
            with pytest.raises(grpc.RpcError) as serr:
                list(session.send("Hello", max_tokens=4, **sampling))
            assert serr.value.code() == grpc.StatusCode.INVALID_ARGUMENT, serr.value.details()
            assert needle in (serr.value.details() or ""), serr.value.details()
            # the refused turn left the session as it was: the next turn runs
            assert session.send("Hello", max_tokens=2, temperature=0.0).collect().completion_tokens == 2
        finally:
            c.close_session(session.id)
        with grpc.insecure_channel(daemon.address) as channel:
            req = vllm_pb.GenerateRequest(
                request_id="uncompilable",
                tokenized=vllm_pb.TokenizedInput(input_ids=c.tokenize("Hello")),
                sampling_params=vllm_pb.SamplingParams(max_tokens=4, **sampling),
            )
            with pytest.raises(grpc.RpcError) as verr:
                list(vllm_engine_pb2_grpc.VllmEngineStub(channel).Generate(req, timeout=60))
        assert verr.value.code() == grpc.StatusCode.INVALID_ARGUMENT, verr.value.details()
        assert needle in (verr.value.details() or ""), verr.value.details()
        assert c.complete("Hello", max_tokens=2, temperature=0.0).completion_tokens == 2
