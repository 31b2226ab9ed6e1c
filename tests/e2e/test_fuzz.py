"""Property-based fuzzing of the whole gRPC surface against a real daemon.

Request messages for every RPC of every service (public and admin) are built from the message
descriptors with extreme values: negative, huge, NaN and infinite numbers, unknown enum numbers, empty
and oversized strings and lists, and ids of objects that exist. Each call must answer within its
deadline with a code from `ALLOWED` (never UNKNOWN or INTERNAL). Afterwards a greedy request returns
the same tokens as before, and once idle no block is held by anything but the cache.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from e2e_kit import ADMIN_TOKEN, RunningDaemon, serve_args, start_daemon, stop_daemon, wait_until
from google.protobuf import descriptor as pbd
from google.protobuf import message as pbm
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radixd_client._pb import (
    cache_admin_pb2,
    cache_admin_pb2_grpc,
    common_pb2,
    generation_pb2,
    generation_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from smg_grpc_proto.generated import vllm_engine_pb2

from radixd.daemon.loaders import LoadedModel

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
ADMIN_MD = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
UNARY_DEADLINE_S = 10.0
# Streams that are accepted may run long (a request for 8,192 tokens); reading them for this long
# shows they were accepted and serving, and the deadline then cancels them.
STREAM_DEADLINE_S = 1.5
EXAMPLES_PER_RPC = 80
GREEDY_PROMPT = "The three primary colors are"

INT32 = [0, 1, 2, 7, -1, -(2**31), 2**31 - 1, 64, 65, 4096, 8192, 10**6]
UINT32 = [0, 1, 2, 3, 64, 65, 1000, 10**6, 2**32 - 1]
UINT64 = [0, 1, 5, 10**6, 2**63 - 1, 2**63, 2**64 - 1]
FLOATS = [0.0, -0.0, 0.5, 1.0, 2.0, -1.0, 1e-45, 1e30, -1e30, math.nan, math.inf, -math.inf]
# Texts include the largest that can fit (tokenized, then refused for length) and one beyond every
# bound the daemon sets (refused without tokenizing), plus one over the gRPC message limit.
TEXTS = ["", "a", "Hello there.", "\x00\ud7ff", "🙂" * 50, "x" * 300, "word " * 40_000]


# Structured-output constraints (the `oneof constraint` of both wires' SamplingParams, by field name):
# documents that compile, that do not, that are unsatisfiable or expensive, and ones at and over the
# bounds. A string field of these names draws from these as well as from the texts above.
_KIB = 64 * 1024
_DEEP = '{"items": ' * 40 + '{"type": "string"}' + "}" * 40
CONSTRAINT_TEXTS: dict[str, list[str]] = {
    "json_schema": [
        '{"type": "object"}',
        '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},'
        ' "required": ["a", "b"], "additionalProperties": false}',
        '{"type": "string", "maxLength": 3}',
        '{"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}',
        '{"enum": []}',
        '{"type": "bogus"}',
        '{"$ref": "#/$defs/missing"}',
        '{"type": "string", "pattern": "("}',
        "{",
        "[]",
        "null",
        _DEEP,
        "[" * 50_000,
        '{"description": "' + "d" * _KIB + '"}',
    ],
    "regex": ["[0-9]{3}", "(yes|no)", ".*", "(a*)*b", "a{1000000}", "(", "\\p{Greek}+", "x" * (_KIB + 1)],
    "grammar": [
        'start: "yes" | "no"',
        'start: start "a" | "a"',
        'root ::= "a" root | "b"',
        "root ::= missing",
        "start: missing",
        "start: /(/",
        "%%% not a grammar",
        "y" * (_KIB + 1),
    ],
    "structural_tag": ["{}", "not json", '{"type": "structural_tag"}'],
    "choices": ["yes", "no", "é" * 600, "z" * 1025],
}


def _sized_texts(daemon: RunningDaemon) -> list[str]:
    limit = daemon.state.limits.max_prompt_chars
    return ["b" * limit, "c" * (limit + 1), "d" * (17 << 20)]


def message_strategy(desc: pbd.Descriptor, strings: list[str], depth: int = 0) -> st.SearchStrategy[Any]:
    """Messages of type `desc` with extreme values in any subset of their fields."""
    cls = message_factory.GetMessageClass(desc)
    fields = {f.name: _field_strategy(f, strings, depth) for f in desc.fields}

    @st.composite
    def build(draw: st.DrawFn) -> pbm.Message:
        msg = cls()
        for oneof in desc.oneofs:
            choice = draw(st.sampled_from([None, *oneof.fields]))
            if choice is not None:
                _set(msg, choice, draw(fields[choice.name]))
        for f in desc.fields:
            if f.containing_oneof is None and draw(st.booleans()):
                _set(msg, f, draw(fields[f.name]))
        return msg

    return build()


def _scalar(f: pbd.FieldDescriptor, strings: list[str], depth: int) -> st.SearchStrategy[Any]:
    t = f.type
    if t == f.TYPE_MESSAGE:
        if depth > 3:
            return st.none()
        return message_strategy(f.message_type, strings, depth + 1)
    if t == f.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return st.sampled_from([*known, 99, -1, 2**31 - 1])
    if t in (f.TYPE_INT32, f.TYPE_SINT32, f.TYPE_SFIXED32, f.TYPE_INT64):
        return st.sampled_from(INT32) | st.integers(-(2**31), 2**31 - 1)
    if t in (f.TYPE_UINT32, f.TYPE_FIXED32):
        return st.sampled_from(UINT32) | st.integers(0, 2**32 - 1)
    if t in (f.TYPE_UINT64, f.TYPE_FIXED64):
        return st.sampled_from(UINT64)
    if t in (f.TYPE_FLOAT, f.TYPE_DOUBLE):
        return st.sampled_from(FLOATS) | st.floats(allow_nan=True, allow_infinity=True, width=32)
    if t == f.TYPE_BOOL:
        return st.booleans()
    if t == f.TYPE_STRING:
        texts = st.sampled_from(strings) | st.text(max_size=20)
        special = CONSTRAINT_TEXTS.get(f.name)
        return st.sampled_from(special) | texts if special else texts
    if t == f.TYPE_BYTES:
        return st.binary(max_size=64)
    raise AssertionError(f"no strategy for field {f.full_name} of type {t}")


def _field_strategy(f: pbd.FieldDescriptor, strings: list[str], depth: int) -> st.SearchStrategy[Any]:
    one = _scalar(f, strings, depth)
    if not f.is_repeated:
        return one
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        # Small maps of extreme keys and values (ids out of the vocabulary, NaN biases), or one far
        # beyond its bound (a logit_bias of 100,000 entries).
        key = _scalar(f.message_type.fields_by_name["key"], strings, depth)
        value = _scalar(f.message_type.fields_by_name["value"], strings, depth)
        huge = (
            f.message_type.fields_by_name["key"].type == f.TYPE_INT32
            and f.message_type.fields_by_name["value"].type != f.TYPE_MESSAGE
        )
        return st.dictionaries(key, value, max_size=6) | st.just(
            dict.fromkeys(range(100_000 if huge else 0), 1)
        )
    # Short lists of extreme values, or one huge list (a prompt of 300,000 ids).
    huge = st.just([1] * 300_000) if f.type in (f.TYPE_INT32, f.TYPE_UINT32) else st.just([])
    return st.lists(one, max_size=6) | huge


def _set(msg: pbm.Message, f: pbd.FieldDescriptor, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, dict):  # a map field
        container = getattr(msg, f.name)
        if f.message_type.fields_by_name["value"].type == f.TYPE_MESSAGE:
            # NOTE: a map of messages cannot be assigned to: each entry is created, then filled.
            for k, v in value.items():
                entry = container[k]
                if v is not None:
                    entry.CopyFrom(v)
        else:
            container.update(value)
    elif f.is_repeated:
        container = getattr(msg, f.name)
        if f.type == f.TYPE_MESSAGE:
            for v in value:
                if v is not None:
                    container.add().CopyFrom(v)
        else:
            container.extend(value)
    elif f.type == f.TYPE_MESSAGE:
        getattr(msg, f.name).CopyFrom(value)
    else:
        setattr(msg, f.name, value)


SERVICES = [
    (generation_pb2.DESCRIPTOR.services_by_name["GenerationService"], generation_pb2_grpc, False),
    (session_pb2.DESCRIPTOR.services_by_name["SessionService"], session_pb2_grpc, False),
    (cache_admin_pb2.DESCRIPTOR.services_by_name["CacheAdminService"], cache_admin_pb2_grpc, True),
]
# The vLLM-protocol servicer's Generate (smg's wire, with its own spelling of the sampling fields and
# constraints) on the public port.
VLLM = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"]
METHODS = [(svc, m, admin) for svc, _mod, admin in SERVICES for m in svc.methods]
METHODS.append((VLLM, VLLM.methods_by_name["Generate"], False))
CODES: collections.Counter[str] = collections.Counter()
CALLS: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module")
def fuzz_daemon(
    loaded_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningDaemon]:
    d = start_daemon(loaded_model, serve_args(tmp_path_factory.mktemp("fuzz")))
    try:
        yield d
    finally:
        stop_daemon(d)


@pytest.fixture(scope="module")
def channels(fuzz_daemon: RunningDaemon) -> Iterator[tuple[grpc.Channel, grpc.Channel]]:
    with (
        grpc.insecure_channel(fuzz_daemon.address) as pub,
        grpc.insecure_channel(fuzz_daemon.admin_address) as adm,
    ):
        yield pub, adm


def greedy_tokens(d: RunningDaemon) -> list[int]:
    with d.client() as c:
        return c.complete(GREEDY_PROMPT, max_tokens=12, temperature=0.0).token_ids


@pytest.fixture(scope="module")
def baseline(fuzz_daemon: RunningDaemon) -> list[int]:
    return greedy_tokens(fuzz_daemon)


@pytest.fixture(scope="module")
def known_ids(fuzz_daemon: RunningDaemon) -> list[str]:
    """Ids of objects that exist, so fuzzed calls also reach past NOT_FOUND."""
    with fuzz_daemon.client() as c:
        s = c.create_session("You are terse.")
    return [s.id]


def call(
    channel: grpc.Channel, svc: pbd.ServiceDescriptor, method: pbd.MethodDescriptor, request: Any, admin: bool
) -> grpc.StatusCode:
    path = f"/{svc.full_name}/{method.name}"
    out_cls = message_factory.GetMessageClass(method.output_type)
    md = ADMIN_MD if admin else None
    if method.server_streaming:
        stream = channel.unary_stream(
            path, request_serializer=type(request).SerializeToString, response_deserializer=out_cls.FromString
        )
        try:
            for _ in stream(request, timeout=STREAM_DEADLINE_S, metadata=md):
                pass
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK
    unary = channel.unary_unary(
        path, request_serializer=type(request).SerializeToString, response_deserializer=out_cls.FromString
    )
    try:
        unary(request, timeout=UNARY_DEADLINE_S, metadata=md)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.slow
@pytest.mark.parametrize(
    ("svc", "method", "admin"), METHODS, ids=[f"{s.name}.{m.name}" for s, m, _ in METHODS]
)
def test_fuzz_rpc(
    fuzz_daemon: RunningDaemon,
    channels: tuple[grpc.Channel, grpc.Channel],
    baseline: list[int],
    known_ids: list[str],
    svc: pbd.ServiceDescriptor,
    method: pbd.MethodDescriptor,
    admin: bool,
) -> None:
    channel = channels[1] if admin else channels[0]
    strings = [*TEXTS, *known_ids, *_sized_texts(fuzz_daemon)]

    @settings(
        max_examples=EXAMPLES_PER_RPC,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(request=message_strategy(method.input_type, strings))
    def check(request: Any) -> None:
        code = call(channel, svc, method, request, admin)
        CALLS[f"{svc.name}.{method.name}"] += 1
        CODES[code.name] += 1
        assert code in ALLOWED, f"{method.name}({str(request)[:300]}) -> {code}"

    check()


CONSTRAINED: collections.Counter[str] = collections.Counter()


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["radixd", "vllm"])
def test_fuzz_constraints(
    fuzz_daemon: RunningDaemon, channels: tuple[grpc.Channel, grpc.Channel], baseline: list[int], wire: str
) -> None:
    """A valid prompt with any one constraint from CONSTRAINT_TEXTS (or any text), so every request
    reaches the bounds and most reach the compiler and the engine's masking."""
    pub = channels[0]
    fields = ["json_schema", "regex", "grammar", "structural_tag", "choice", "json_object"]
    texts = st.sampled_from([t for v in CONSTRAINT_TEXTS.values() for t in v]) | st.text(max_size=20)
    ids = [1, 504, 3575, 282]

    @settings(max_examples=EXAMPLES_PER_RPC, deadline=None, derandomize=True, database=None)
    @given(
        field=st.sampled_from(fields), text=texts, choices=st.lists(texts, max_size=4), n=st.integers(1, 4)
    )
    def check(field: str, text: str, choices: list[str], n: int) -> None:
        constraint: dict[str, Any] = {field: text}
        if field == "json_object":
            constraint = {field: bool(text)}
        if wire == "radixd":
            if field == "choice":
                constraint = {field: common_pb2.ChoiceConstraint(choices=choices)}
            sampling = common_pb2.SamplingParams(max_tokens=8, n=n, seed=n, **constraint)
            svc = generation_pb2.DESCRIPTOR.services_by_name["GenerationService"]
            request: Any = generation_pb2.GenerateRequest(
                prompt=common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=ids)), sampling=sampling
            )
        else:
            if field == "choice":
                constraint = {field: vllm_engine_pb2.ChoiceConstraint(choices=choices)}
            svc = VLLM
            request = vllm_engine_pb2.GenerateRequest(
                request_id=f"fuzz-{CALLS['constraints']}",
                tokenized=vllm_engine_pb2.TokenizedInput(input_ids=ids),
                sampling_params=vllm_engine_pb2.SamplingParams(max_tokens=8, n=n, seed=n, **constraint),
            )
        code = call(pub, svc, svc.methods_by_name["Generate"], request, False)
        CALLS["constraints"] += 1
        CODES[code.name] += 1
        CONSTRAINED[code.name] += 1
        assert code in ALLOWED, f"{wire} {field}={str(constraint)[:300]} -> {code}"

    check()
    assert {"OK", "INVALID_ARGUMENT"} <= set(CONSTRAINED), CONSTRAINED


@pytest.mark.slow
def test_after_fuzzing_outputs_are_unchanged_and_nothing_is_held(
    fuzz_daemon: RunningDaemon, baseline: list[int]
) -> None:
    assert sum(CALLS.values()) > 0, "run with the fuzz cases"
    print(f"fuzz: {sum(CALLS.values())} calls over {len(CALLS)} RPCs; codes {dict(CODES)}")
    assert {"OK", "INVALID_ARGUMENT"} <= set(CODES)
    assert greedy_tokens(fuzz_daemon) == baseline
    with fuzz_daemon.client() as c:
        for s in list(c.list_sessions(page_size=1000)):
            c.close_session(s.session_id)
        wait_until(lambda: fuzz_daemon.state.active_streams == 0, what="every stream to end")
        wait_until(lambda: c.cache_stats().in_use_blocks == 0, what="no block held at idle")
        load = c.admin.GetLoad(cache_admin_pb2.GetLoadRequest(), metadata=ADMIN_MD)
        assert load.running_requests == load.waiting_requests == 0
