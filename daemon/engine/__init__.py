"""The engine: requests, continuous-batching scheduler over the radix cache, sessions, admin.

Public API (the server calls only this): `Engine` (engine.py) with `start`, `shutdown`, `submit`,
`abort`, `execute` (a command from `commands.py`), `flush`; request/response types, `Sink`,
`FlushMode` and errors in `types.py`; `EngineConfig` in `config.py`; `build_engine` (factory.py)
builds model, runner, tokenizer and core from a model path.

Semantics callers rely on:
- `submit` raises `InvalidRequest` / `RequestTooLarge` (never fits: context limit or pool size),
  `QueueFull`, `EngineStopped`; later failures (unknown session: code "not_found", a session busy
  with another turn: "failed_precondition") arrive as a finished output with finish_reason "error"
  and `error_code`. Every error class has a `code` naming its gRPC status class.
- Outputs: one `RequestOutput` per step per running output index (n > 1: indexes 0..n-1; beam search:
  the n best hypotheses once, at the end); the request is complete when every index has finished.
- `cached_tokens`: prompt tokens supplied by the prefix cache at first admission. The last prompt
  token is always computed (for logits); a previous turn's last generated token has no KV (it was
  never fed back), so turn 2 of a conversation reports turn 1's prompt + output - 1.
- Session turns: with `session_id`, `prompt_token_ids` are the new turn's tokens; the prompt is the
  session's tokens + them; a turn that ends with "stop"/"length" advances the session (an abort or
  error leaves it unchanged).
- Unexpected errors inside the engine (`EngineFault`, code "internal") fail only the requests they
  touched, as a finished output with finish_reason "error"; the engine goes on. Should its thread
  die anyway, every request in flight fails the same way and `Engine.on_fatal(error)` is called:
  the owner must stop serving (the daemon exits 1).
- Requests, admin and sessions are typed commands (commands.py) applied on the engine thread through
  one table: `submit` / `abort` queue `Submit` / `Abort`; `engine.execute(Evict(64))` returns a
  `concurrent.futures.Future[int]`; likewise `EvictPrefix`, `EvictSession`, `Flush(mode, timeout_s)`
  (also `engine.flush(mode, timeout_s)`), `Pin`, `Unpin`, `LookupPrefix`, `GetStats` (the one stats
  record, `EngineStats` in stats.py), `CreateSession`, `GetSession`, `ListSessions`, `ForkSession`,
  `CloseSession`. Anything else is refused with `InvalidRequest`. The engine never runs caller code.
- Flush modes are the wire's: "evict_unlocked" (now), "refuse_if_busy" (`FlushRefused` while requests
  are in flight), "wait_for_idle" (`EngineTimeout` after `timeout_s`); each keeps leased and pinned
  blocks.

Inside, `EngineCore` (core.py) is composed of components with explicit dependencies, each the one
owner of its state: `KVManager` (kv.py, the only module that calls the radix tree and the device block
pool), `Scheduler`, `SessionManager`, `Forker` (forks.py), `BeamSearch` (beam.py), `Requests` (the
requests in flight: admission, aborts, endings, failures), `Outputs`, `Admin`, `Validator` and
`Watchdog`; dispatch.py is the command table. Tests and the offline CLI may drive a core on their own
thread through them.
"""

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
