"""The engine: requests, continuous-batching scheduler over the radix cache, sessions, admin.

Public API (the server calls only this): `Engine` (engine.py) with `start`, `shutdown`, `submit`,
`abort`, `call`, `flush`; request/response types and errors in `types.py`; `EngineConfig` in
`config.py`; `build_engine` (factory.py) builds model, runner, tokenizer and core from a model path.
"""

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.types import (
    EngineError,
    EngineStopped,
    EngineTimeout,
    FlushRefused,
    GenerateRequest,
    InvalidRequest,
    QueueFull,
    RequestOutput,
    RequestTooLarge,
    TokenLogprob,
    UnknownSession,
)

__all__ = [
    "EngineConfig",
    "EngineError",
    "EngineStopped",
    "EngineTimeout",
    "FlushRefused",
    "GenerateRequest",
    "InvalidRequest",
    "QueueFull",
    "RequestOutput",
    "RequestTooLarge",
    "TokenLogprob",
    "UnknownSession",
]
