"""The engine: requests, continuous-batching scheduler over the radix cache, sessions, admin.

Public API: `Engine` (`submit`, `abort`, `execute(command)`, `flush`), types.py, `EngineConfig`,
`build_engine`. `submit` raises on stateless checks; later failures arrive as an output with
finish_reason "error" and `error_code`. Commands (commands.py) run on the engine thread through one
table; the engine never runs caller code. A turn advances its session only on "stop"/"length".
`cached_tokens` excludes the last prompt token (always computed) and the previous turn's last token.
"""

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.types import (
    FLUSH_MODES,
    EngineError,
    EngineFault,
    EngineStopped,
    EngineTimeout,
    FlushMode,
    FlushRefused,
    GenerateRequest,
    InvalidRequest,
    QueueFull,
    RequestOutput,
    RequestTooLarge,
    Sink,
    TokenLogprob,
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
