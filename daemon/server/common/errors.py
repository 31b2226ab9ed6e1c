"""Map failures to gRPC status codes with messages that say what to fix (unexpected ones: INTERNAL)."""

from __future__ import annotations

import grpc

from radixd.radix.errors import NotPinned, OutOfBlocks, PinBudgetExceeded, RadixError

CODES: dict[str, grpc.StatusCode] = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "deadline_exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
    "internal": grpc.StatusCode.INTERNAL,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
    "cancelled": grpc.StatusCode.CANCELLED,
}


class RpcFailure(Exception):
    """Raised inside handlers; the handler wrapper aborts the RPC with `code` and the message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def bad_request(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message for an exception raised while handling an RPC."""
    if isinstance(exc, RpcFailure):
        return exc.code, exc.message
    code_name = getattr(exc, "code", None)
    if isinstance(code_name, str) and code_name in CODES:
        return CODES[code_name], str(exc)
    code = getattr(exc, "code", None)
    if isinstance(code, grpc.StatusCode):
        return code, str(exc)
    if isinstance(exc, PinBudgetExceeded | OutOfBlocks):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, NotPinned):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, RadixError) and not isinstance(exc, ValueError):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc) or "the operation timed out"
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def status_for_code_name(code_name: str | None) -> grpc.StatusCode:
    """The status for an `error_code` string reported through a RequestOutput."""
    return CODES.get(code_name or "internal", grpc.StatusCode.INTERNAL)
