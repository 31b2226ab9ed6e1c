"""gRPC server reflection as both `grpc.reflection.v1` and `v1alpha` (wire-identical), with comments.

Served from `make proto`'s descriptors (comments kept); each port resolves only its own services.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
V1 = "grpc.reflection.v1.ServerReflection"
REFLECTION_SERVICES = (V1, V1ALPHA)
_METHOD = "ServerReflectionInfo"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _v1_reflection_file() -> descriptor_pb2.FileDescriptorProto:
    """The v1 reflection file, derived from v1alpha's (same messages, renamed package)."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(reflection_pb2.DESCRIPTOR.serialized_pb)
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    proto.name = _V1_FILE
    proto.package = "grpc.reflection.v1"
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name.removeprefix(old)
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type.removeprefix(old)
            method.output_type = new + method.output_type.removeprefix(old)
    return proto


def radixd_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """The radixd.v1 files with their comments, as `make proto` wrote them beside the stubs."""
    resource = importlib.resources.files("radixd_client._pb") / "descriptors.binpb"
    try:
        data = resource.read_bytes()
    except FileNotFoundError as exc:
        raise RuntimeError(
            f"{resource} is missing: run `make proto` (or reinstall radixd-client, which ships it)"
        ) from exc
    return descriptor_pb2.FileDescriptorSet.FromString(data)


class DescriptorFiles:
    """Files reflection can serve: their serialized FileDescriptorProtos and a pool to find symbols in."""

    def __init__(self, files: Iterable[descriptor_pb2.FileDescriptorProto]) -> None:
        self._protos: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        self._bytes: dict[str, bytes] = {}
        self.pool = descriptor_pool.DescriptorPool()
        for proto in files:  # dependencies first: the pool refuses a file whose imports it lacks
            data = proto.SerializeToString(deterministic=True)
            self.pool.AddSerializedFile(data)
            self._protos[proto.name] = proto
            self._bytes[proto.name] = data

    @classmethod
    def load(cls) -> DescriptorFiles:
        """radixd.v1 (with comments), grpc.health.v1, and both reflection versions."""
        extra = (health_pb2.DESCRIPTOR.serialized_pb, reflection_pb2.DESCRIPTOR.serialized_pb)
        protos = [descriptor_pb2.FileDescriptorProto.FromString(data) for data in extra]
        return cls([*radixd_descriptor_set().file, *protos, _v1_reflection_file()])

    def serialized(self, name: str) -> bytes:
        """The FileDescriptorProto of file `name`, serialized (KeyError if unknown)."""
        return self._bytes[name]

    def closure(self, name: str) -> list[str]:
        """`name` first, then every file it imports, directly or not (each once)."""
        order: list[str] = []
        pending = [name]
        while pending:
            current = pending.pop()
            if current in order:
                continue
            order.append(current)
            pending.extend(reversed(self._protos[current].dependency))
        return order

    def file_of_symbol(self, symbol: str) -> str:
        """The file declaring a fully qualified symbol (service, method, message, enum, field)."""
        return str(self.pool.FindFileContainingSymbol(symbol).name)


class ReflectionServicer:
    """ServerReflectionInfo for one port: lists `services` and the reflection service itself."""

    def __init__(self, files: DescriptorFiles, services: Sequence[str]) -> None:
        self._files = files
        self._services = tuple(sorted({*services, *REFLECTION_SERVICES}))
        visible: set[str] = set()
        for service in self._services:
            try:
                visible.update(files.closure(files.file_of_symbol(service)))
            except KeyError as exc:
                raise ValueError(f"no descriptor declares service {service!r}; run `make proto`") from exc
        self._visible = frozenset(visible)

    @property
    def services(self) -> tuple[str, ...]:
        """The service names `list_services` answers with."""
        return self._services

    async def ServerReflectionInfo(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The bidirectional reflection stream: one response per request, in order."""
        async for request in requests:
            yield self.answer(request)

    def answer(self, request: Any) -> Any:
        """The ServerReflectionResponse to one ServerReflectionRequest."""
        kind = request.WhichOneof("message_request")
        response: Any
        if kind == "list_services":
            services = [reflection_pb2.ServiceResponse(name=name) for name in self._services]
            response = reflection_pb2.ServerReflectionResponse(
                list_services_response=reflection_pb2.ListServiceResponse(service=services)
            )
        elif kind == "file_by_filename":
            response = self._files_response(request.file_by_filename, f"file {request.file_by_filename!r}")
        elif kind == "file_containing_symbol":
            symbol = request.file_containing_symbol
            try:
                name = self._files.file_of_symbol(symbol)
            except KeyError:
                name = ""
            response = self._files_response(name, f"symbol {symbol!r}")
        elif kind == "file_containing_extension":
            ext = request.file_containing_extension
            try:
                message = self._files.pool.FindMessageTypeByName(ext.containing_type)
                extension = self._files.pool.FindExtensionByNumber(message, ext.extension_number)
                name = self._files.file_of_symbol(extension.full_name)
            except KeyError:
                name = ""
            what = f"extension {ext.extension_number} of {ext.containing_type!r}"
            response = self._files_response(name, what)
        elif kind == "all_extension_numbers_of_type":
            response = self._extension_numbers(request.all_extension_numbers_of_type)
        else:
            response = _error(grpc.StatusCode.INVALID_ARGUMENT, "the request sets no message_request field")
        response.original_request.CopyFrom(request)
        response.valid_host = request.host
        return response

    def _files_response(self, name: str, what: str) -> Any:
        if name not in self._visible:
            return _error(
                grpc.StatusCode.NOT_FOUND,
                f"{what} is not served on this port; list_services names the services here",
            )
        files = [self._files.serialized(f) for f in self._files.closure(name)]
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(file_descriptor_proto=files)
        )

    def _extension_numbers(self, type_name: str) -> Any:
        try:
            message = self._files.pool.FindMessageTypeByName(type_name)
        except KeyError:
            message = None
        if message is None or message.file.name not in self._visible:
            return _error(grpc.StatusCode.NOT_FOUND, f"message type {type_name!r} is not served on this port")
        numbers = sorted(ext.number for ext in self._files.pool.FindAllExtensions(message))
        return reflection_pb2.ServerReflectionResponse(
            all_extension_numbers_response=reflection_pb2.ExtensionNumberResponse(
                base_type_name=message.full_name, extension_number=numbers
            )
        )


def _error(code: grpc.StatusCode, message: str) -> Any:
    return reflection_pb2.ServerReflectionResponse(
        error_response=reflection_pb2.ErrorResponse(error_code=code.value[0], error_message=message)
    )


def add_reflection(server: grpc.aio.Server, files: DescriptorFiles, services: Sequence[str]) -> None:
    """Serve reflection v1 and v1alpha on `server`, listing `services` (plus reflection itself)."""
    servicer = ReflectionServicer(files, services)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        tuple(grpc.method_handlers_generic_handler(name, {_METHOD: handler}) for name in REFLECTION_SERVICES)
    )
