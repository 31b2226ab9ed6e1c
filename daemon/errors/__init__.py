"""The errors the engine raises or reports, in a package below the engine and the executor (whose step
guard raises them too). Each class's `code` names the gRPC status class it maps to, so the server
translates without knowing the classes ("invalid_argument", "not_found", "resource_exhausted",
"failed_precondition", "unavailable", "deadline_exceeded", "internal").
"""

from __future__ import annotations

from radixd.radix import errors as radix_errors


class EngineError(Exception):
    """Base of every error the engine raises or reports through a sink."""

    code: str = "internal"


class InvalidRequest(EngineError, radix_errors.InvalidRequest):
    """The request itself is malformed (empty prompt, bad ids, bad sampling values, duplicate id); also a
    `radixd.radix.errors.InvalidRequest`, so one `except` catches a malformed argument wherever found."""

    code = "invalid_argument"


class RequestTooLarge(InvalidRequest):
    """The request can never fit: prompt + max_tokens exceeds the context limit or the KV pool."""


class UnknownSession(EngineError):
    """No open session has this id (never created, closed, or expired)."""

    code = "not_found"


class TooManySessions(EngineError):
    """Opening more sessions would exceed the daemon's limit; close some or retry later."""

    code = "resource_exhausted"


class QueueFull(EngineError):
    """Too many requests are waiting; retry later."""

    code = "resource_exhausted"


class EngineStopped(EngineError):
    """The engine is draining or stopped and accepts no new work."""

    code = "unavailable"


class EngineFault(EngineError):
    """An unexpected error inside the engine (a bug): the requests it touched end with this error and
    the engine goes on serving. Report it with the log line carrying the request id."""

    code = "internal"


class FlushRefused(EngineError):
    """A flush in mode "refuse_if_busy" found requests in flight."""

    code = "failed_precondition"


class EngineTimeout(EngineError):
    """A wait (flush "wait_for_idle", drain) ran out of time."""

    code = "deadline_exceeded"
