"""The engine: requests, continuous-batching scheduler over the radix cache, sessions, admin.

Public API: `Engine` (`submit`, `abort`, `execute(command)`, `flush`), types.py, `EngineConfig`,
`build_engine`. `submit` raises on stateless checks; later failures arrive as an "error" output. A turn
advances its session only on "stop"/"length". `cached_tokens` never counts the last prompt token
(always computed) nor the previous turn's last token (it has no KV)."""

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.types import (
    FLUSH_MODES,
    FlushMode,
    GenerateRequest,
    RequestOutput,
    Sink,
    TokenLogprob,
)
from radixd.daemon.errors import (
    EngineError,
    EngineFault,
    EngineStopped,
    EngineTimeout,
    FlushRefused,
    InvalidRequest,
    QueueFull,
    RequestTooLarge,
    TooManySessions,
    UnknownSession,
)

__all__ = [
    "FLUSH_MODES",
    "EngineConfig",
    "EngineError",
    "EngineFault",
    "EngineStopped",
    "EngineTimeout",
    "FlushMode",
    "FlushRefused",
    "GenerateRequest",
    "InvalidRequest",
    "QueueFull",
    "RequestOutput",
    "RequestTooLarge",
    "Sink",
    "TokenLogprob",
    "TooManySessions",
    "UnknownSession",
]
