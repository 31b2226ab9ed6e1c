"""What a client in another language relies on, checked over real loopback gRPC with standard stubs only.

- reflection under `grpc.reflection.v1` (what grpcurl and Postman ask first) and `v1alpha`, one listing
  per port, with the .proto comments in the served descriptors;
- a call built from reflection alone (what grpcurl does), no generated radixd code;
- one grpc.health.v1 service per port that knows only that port's services, all NOT_SERVING on drain;
- CreateSession stores its context and the first turn computes it (as session.proto says).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from e2e_kit import ADMIN_TOKEN, RunningDaemon, serve_args, start_daemon, stop_daemon, wait_until
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as v1alpha_pb2_grpc
from radixd_client import Chunk, End

from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow
PUBLIC = {"radixd.v1.GenerationService", "radixd.v1.SessionService"}
ADMIN = {"radixd.v1.CacheAdminService"}
STANDARD = {
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}


class ReflectionV1:
    """A grpc.reflection.v1 client stub, built here from the v1 protocol's definition.

    grpcio-reflection ships only v1alpha. v1 is the same file under another package (the messages are
    wire-identical), so the client's message classes come from v1alpha's descriptor renamed to
    `grpc.reflection.v1`, in a pool of their own, and the stub calls the v1 method path.
    """

    def __init__(self, channel: grpc.Channel) -> None:
        proto = descriptor_pb2.FileDescriptorProto.FromString(v1alpha_pb2.DESCRIPTOR.serialized_pb)
        proto.name, proto.package = "grpc/reflection/v1/reflection.proto", "grpc.reflection.v1"
        del proto.service[:]  # the stub below names the v1 method itself; only the messages are needed
        for message in proto.message_type:
            for field in message.field:
                if field.type_name:
                    field.type_name = field.type_name.replace(".v1alpha.", ".v1.")
        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(proto.SerializeToString())
        self.Request: Any = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest")
        )
        self.Response: Any = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse")
        )
        self.ServerReflectionInfo = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=self.Request.SerializeToString,
            response_deserializer=self.Response.FromString,
        )

    def ask(self, **request: Any) -> Any:
        (response,) = list(self.ServerReflectionInfo(iter([self.Request(**request)]), timeout=10))
        return response

    def services(self) -> set[str]:
        return {s.name for s in self.ask(list_services="").list_services_response.service}

    def files(self, symbol: str) -> list[descriptor_pb2.FileDescriptorProto]:
        response = self.ask(file_containing_symbol=symbol)
        assert response.WhichOneof("message_response") == "file_descriptor_response", response
        raw = response.file_descriptor_response.file_descriptor_proto
        return [descriptor_pb2.FileDescriptorProto.FromString(b) for b in raw]


@contextlib.contextmanager
def _channels(d: RunningDaemon) -> Iterator[tuple[grpc.Channel, grpc.Channel]]:
    """Plain channels to the public and the admin port."""
    with grpc.insecure_channel(d.address) as public, grpc.insecure_channel(d.admin_address) as admin:
        yield public, admin


def _pool(files: list[descriptor_pb2.FileDescriptorProto]) -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    by_name = {f.name: f for f in files}

    def add(name: str) -> None:  # imports first, as a pool requires
        if name in added:
            return
        for dep in by_name[name].dependency:
            add(dep)
        pool.Add(by_name[name])
        added.add(name)

    for f in files:
        add(f.name)
    return pool


def _comment(files: list[descriptor_pb2.FileDescriptorProto], message: str, field: str | None = None) -> str:
    """The leading comment of message `message` (or of its field `field`), from source_code_info."""
    for f in files:
        for mi, m in enumerate(f.message_type):
            if m.name != message:
                continue
            path = [4, mi]  # FileDescriptorProto.message_type
            if field is not None:
                path += [2, next(i for i, x in enumerate(m.field) if x.name == field)]  # .field
            for loc in f.source_code_info.location:
                if list(loc.path) == path:
                    return loc.leading_comments
    raise AssertionError(f"no comment found for {message}.{field}")


def _service_comment(files: list[descriptor_pb2.FileDescriptorProto], service: str) -> str:
    for f in files:
        for si, s in enumerate(f.service):
            if s.name == service:
                for loc in f.source_code_info.location:
                    if list(loc.path) == [6, si]:  # FileDescriptorProto.service
                        return loc.leading_comments
    raise AssertionError(f"no comment found for service {service}")


@pytest.fixture(scope="module")
def tenants(loaded_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A daemon with API keys, so calls must carry `authorization: Bearer <key>` as a foreign client would."""
    d = start_daemon(loaded_model, serve_args(tmp_path_factory.mktemp("conv"), api_keys=True), "key-alice")
    try:
        yield d
    finally:
        stop_daemon(d)


def test_reflection_v1_lists_each_ports_services(tenants: RunningDaemon) -> None:
    with (
        grpc.insecure_channel(tenants.address) as public,
        grpc.insecure_channel(tenants.admin_address) as admin,
    ):
        assert ReflectionV1(public).services() == PUBLIC | STANDARD
        assert ReflectionV1(admin).services() == ADMIN | STANDARD
        # The older name answers the same, for tools that only know v1alpha.
        v1alpha = v1alpha_pb2_grpc.ServerReflectionStub(public)
        request = v1alpha_pb2.ServerReflectionRequest(list_services="")
        (response,) = list(v1alpha.ServerReflectionInfo(iter([request]), timeout=10))
        assert {s.name for s in response.list_services_response.service} == PUBLIC | STANDARD
        # A port does not describe the other port's service.
        missing = ReflectionV1(public).ask(file_containing_symbol="radixd.v1.CacheAdminService")
        assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
        assert "not served on this port" in missing.error_response.error_message
        # The reflection service can describe itself under the v1 name (grpcurl `describe`).
        (own,) = ReflectionV1(admin).files("grpc.reflection.v1.ServerReflection")
        assert own.package == "grpc.reflection.v1"
        assert own.service[0].method[0].input_type == ".grpc.reflection.v1.ServerReflectionRequest"


def test_reflection_serves_the_proto_comments(tenants: RunningDaemon) -> None:
    with (
        grpc.insecure_channel(tenants.address) as public,
        grpc.insecure_channel(tenants.admin_address) as admin,
    ):
        files = ReflectionV1(public).files("radixd.v1.GenerationService")
        assert {f.name for f in files} == {"radixd/v1/generation.proto", "radixd/v1/common.proto"}
        assert "0 = greedy" in _comment(files, "SamplingParams", "temperature")
        assert "authorization: Bearer <api key>" in _service_comment(files, "GenerationService")
        session_files = ReflectionV1(public).files("radixd.v1.CreateSessionRequest")
        assert "stored, not computed" in _comment(session_files, "CreateSessionRequest", "context")
        admin_files = ReflectionV1(admin).files("radixd.v1.CacheAdminService")
        assert "authorization: Bearer <admin token>" in _service_comment(admin_files, "CacheAdminService")


def test_a_call_built_from_reflection_alone(tenants: RunningDaemon) -> None:
    """What grpcurl does: descriptors from reflection, request from JSON, metadata by hand."""
    with grpc.insecure_channel(tenants.address) as channel:
        pool = _pool(ReflectionV1(channel).files("radixd.v1.GenerationService"))
        method = pool.FindServiceByName("radixd.v1.GenerationService").methods_by_name["Generate"]
        assert method.server_streaming
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        body = (
            '{"prompt": {"text": "The capital of France is"},'
            ' "sampling": {"max_tokens": 6, "temperature": 0}}'
        )
        request = json_format.Parse(body, request_cls())
        call = channel.unary_stream(
            "/radixd.v1.GenerationService/Generate",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        with pytest.raises(grpc.RpcError) as err:
            list(call(request, timeout=30))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "authorization: Bearer <key>" in err.value.details()
        events = [
            json_format.MessageToDict(m, preserving_proto_field_name=True)
            for m in call(request, metadata=[("authorization", "Bearer key-alice")], timeout=60)
        ]
    text = "".join(e["chunk"].get("text", "") for e in events if "chunk" in e)
    end = events[-1]["end"]
    assert end["finish_reason"] == "FINISH_REASON_LENGTH" and end["usage"]["completion_tokens"] == 6
    # The same request through the Python client gives the same greedy text.
    with tenants.client() as c:
        expected = c.complete("The capital of France is", max_tokens=6, temperature=0.0).text
    assert text == expected and text.strip()


def _check(channel: grpc.Channel, service: str) -> str:
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def test_health_per_port(tenants: RunningDaemon) -> None:
    with (
        grpc.insecure_channel(tenants.address) as public,
        grpc.insecure_channel(tenants.admin_address) as admin,
    ):
        for name in ("", *sorted(PUBLIC)):
            assert _check(public, name) == "SERVING", name
            assert _check(admin, name) == ("SERVING" if name == "" else "NOT_FOUND"), name
        for name in sorted(ADMIN):
            assert _check(admin, name) == "SERVING"
            assert _check(public, name) == "NOT_FOUND"


def test_drain_turns_both_ports_not_serving(loaded_model: LoadedModel, tmp_path: Path) -> None:
    d = start_daemon(loaded_model, serve_args(tmp_path, "--grace-period", "60"))
    drained: concurrent.futures.Future[None] | None = None
    try:
        with d.client() as c:
            stream = iter(c.generate("Count slowly:", max_tokens=40, ignore_eos=True, temperature=0.0))
            while not isinstance(next(stream), Chunk):
                pass
            # A stream is in flight, so the drain waits in its grace period with both servers up.
            drained = asyncio.run_coroutine_threadsafe(d.daemon.drain(), d.loop)
            with _channels(d) as (public, admin):

                def both_down() -> bool:
                    names = [(public, n) for n in ("", *PUBLIC)] + [(admin, n) for n in ("", *ADMIN)]
                    return all(_check(ch, n) == "NOT_SERVING" for ch, n in names)

                wait_until(both_down, timeout=10, what="every service on both ports NOT_SERVING")
            rest = list(stream)
        assert isinstance(rest[-1], End) and rest[-1].completion_tokens == 40
        assert drained is not None
        drained.result(60)
    finally:
        if drained is None:
            asyncio.run_coroutine_threadsafe(d.daemon.drain(), d.loop).result(60)
        d.loop.call_soon_threadsafe(d.loop.stop)
        d.thread.join(10)
        d.loop.close()


def test_create_session_stores_its_context_and_the_first_turn_computes_it(tenants: RunningDaemon) -> None:
    context = [{"role": "system", "content": "You answer in one word. Session context probe 7Q."}]
    with tenants.client(admin_token=ADMIN_TOKEN) as c:
        before = c.cache_stats()
        session = c.create_session(context)
        info = session.refresh()
        after = c.cache_stats()
        context_tokens = info.num_tokens
        assert context_tokens > 0
        # Stored only: nothing computed, nothing cached, no model step ran.
        assert (after.miss_tokens, after.hit_tokens) == (before.miss_tokens, before.hit_tokens)
        assert info.resident_tokens == 0
        events = list(session.send([{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0.0))
        end = events[-1]
        assert isinstance(end, End)
        # The first turn's prompt is the context plus the turn, and none of it came from the cache.
        assert end.prompt_tokens > context_tokens and end.cached_tokens == 0
        assert session.refresh().resident_tokens > 0
        session.close()
