"""Structured-output constraints on every gRPC wire: the bounds refuse before anything is compiled.

radixd's GenerationService and SessionService (`sampling.*`) and the vLLM-protocol servicer smg talks
to (`sampling_params.*`) share one mapping and one set of bounds: constraint text at most 64 KiB,
choice 1 to 256 non-empty entries of at most 1 KiB, a JSON schema that parses, is an object and nests
at most 32 deep. Each refusal is INVALID_ARGUMENT naming the field as the client spelled it, and the
daemon keeps serving. What the engine makes of a constraint that passes is test_structured_outputs.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from e2e_kit import RunningDaemon
from radixd_client._pb import common_pb2, generation_pb2, generation_pb2_grpc, session_pb2, session_pb2_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

from radixd.daemon.server.common import bounds

pytestmark = pytest.mark.slow
PROMPT = "Answer yes or no:"
KIB = bounds.MAX_CONSTRAINT_BYTES


def _nested(depth: int) -> str:
    """A schema document whose objects nest `depth` deep."""
    doc: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        doc = {"items": doc}
    return json.dumps(doc)


# (constraint fields as keyword arguments of SamplingParams, what the message must say)
BAD: list[tuple[dict[str, Any], str]] = [
    ({"regex": "a" * (KIB + 1)}, f"regex is {KIB + 1} bytes; at most {KIB} (64 KiB)"),
    # 2-byte characters: under the bound in characters, over it in bytes
    ({"grammar": "é" * (KIB // 2 + 1)}, f"grammar is {KIB + 2} bytes"),
    ({"structural_tag": "x" * (KIB + 1)}, "structural_tag is"),
    ({"json_schema": json.dumps({"description": "d" * KIB})}, "json_schema is"),
    ({"regex": ""}, "regex is empty"),
    (
        {"json_schema": '{"type": "object",\n "properties": {"a": }}'},
        "is not valid JSON: Expecting value at line 2",
    ),
    ({"json_schema": "[1, 2]"}, "json_schema must be a JSON object"),
    ({"json_schema": '"object"'}, "got a JSON string"),
    ({"json_schema": _nested(bounds.MAX_SCHEMA_DEPTH + 1)}, f"deeper than {bounds.MAX_SCHEMA_DEPTH} levels"),
    ({"json_schema": "[" * 60_000}, "deeper than"),
    ({"choice": {}}, "choice.choices is empty"),
    ({"choice": {"choices": ["a"] * (bounds.MAX_CHOICES + 1)}}, f"at most {bounds.MAX_CHOICES} are allowed"),
    ({"choice": {"choices": ["yes", ""]}}, "choice.choices[1] is empty"),
    ({"choice": {"choices": ["no", "é" * 513]}}, "choice.choices[1] is 1026 bytes; at most 1024"),
]


@pytest.fixture(scope="module")
def channel(daemon: RunningDaemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.address) as ch:
        yield ch


def _radixd_generate(channel: grpc.Channel, **sampling: Any) -> list[Any]:
    stub = generation_pb2_grpc.GenerationServiceStub(channel)
    req = generation_pb2.GenerateRequest(
        prompt=common_pb2.Prompt(text=PROMPT), sampling=common_pb2.SamplingParams(max_tokens=2, **sampling)
    )
    return list(stub.Generate(req, timeout=60))


def _session_generate(channel: grpc.Channel, **sampling: Any) -> list[Any]:
    stub = session_pb2_grpc.SessionServiceStub(channel)
    sid = stub.CreateSession(
        session_pb2.CreateSessionRequest(context=common_pb2.Prompt(text="You are terse."))
    ).session.session_id
    try:
        req = session_pb2.SessionServiceGenerateRequest(
            session_id=sid,
            prompt=common_pb2.Prompt(text=PROMPT),
            sampling=common_pb2.SamplingParams(max_tokens=2, **sampling),
        )
        return list(stub.Generate(req, timeout=60))
    finally:
        stub.CloseSession(session_pb2.CloseSessionRequest(session_id=sid))


def _vllm_generate(channel: grpc.Channel, **sampling: Any) -> list[Any]:
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    if "choice" in sampling:
        sampling = {**sampling, "choice": vllm_pb.ChoiceConstraint(**sampling["choice"])}
    req = vllm_pb.GenerateRequest(
        request_id="structured",
        tokenized=vllm_pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=vllm_pb.SamplingParams(max_tokens=2, **sampling),
    )
    return list(stub.Generate(req, timeout=60))


WIRES: dict[str, tuple[Callable[..., list[Any]], str]] = {
    "radixd": (_radixd_generate, "sampling"),
    "session": (_session_generate, "sampling"),
    "vllm": (_vllm_generate, "sampling_params"),
}


@pytest.mark.parametrize("wire", sorted(WIRES))
@pytest.mark.parametrize(
    ("sampling", "needle"), BAD, ids=[f"{next(iter(s))}-{i}" for i, (s, _) in enumerate(BAD)]
)
def test_bad_constraints_are_refused_naming_the_field(
    channel: grpc.Channel, wire: str, sampling: dict[str, Any], needle: str
) -> None:
    call, what = WIRES[wire]
    field = next(iter(sampling))
    with pytest.raises(grpc.RpcError) as err:
        call(channel, **sampling)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    details = err.value.details() or ""
    assert f"{what}.{field}" in details and needle in details, details


def test_the_daemon_serves_after_refusals_and_accepts_constraints_at_the_bounds(
    channel: grpc.Channel,
) -> None:
    for wire in sorted(WIRES):
        call, _ = WIRES[wire]
        with pytest.raises(grpc.RpcError):
            call(channel, json_schema="{")
        # The largest choice list the bounds allow: 256 distinct entries of exactly 1 KiB each.
        choices = [f"{i:03d}" + "z" * (bounds.MAX_CHOICE_BYTES - 3) for i in range(bounds.MAX_CHOICES)]
        events = call(channel, choice={"choices": choices})
        assert events, wire
        # A schema nested exactly as deep as allowed passes the bounds (the compiler then reads it).
        assert call(channel, json_schema=_nested(bounds.MAX_SCHEMA_DEPTH)), wire
        # json_object false is no constraint at all: free text.
        assert call(channel, json_object=False), wire


@pytest.mark.parametrize("wire", sorted(WIRES))
def test_ignore_eos_or_min_tokens_with_a_constraint_are_refused(channel: grpc.Channel, wire: str) -> None:
    call, _ = WIRES[wire]
    for extra, needle in (
        ({"ignore_eos": True}, "ignore_eos cannot"),
        ({"min_tokens": 1}, "min_tokens cannot"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call(channel, regex="[0-9]+", **extra)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert needle in (err.value.details() or ""), err.value.details()
