"""Shared server state: the engine, its tokenizer, auth, metrics, limits, and the drain switch."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from radixd.daemon.engine.config import DEFAULT_BLOCK_SIZE
from radixd.daemon.server.common.auth import Authenticator, AuthError
from radixd.daemon.server.common.bounds import DEFAULT_MAX_SESSIONS
from radixd.daemon.server.common.errors import RpcFailure
from radixd.daemon.server.common.events import CacheEvents
from radixd.daemon.server.common.metrics import Metrics

if TYPE_CHECKING:
    from radixd.daemon.engine.engine import Engine
    from radixd.daemon.server.common.handover import OutputHandover


class Tokenizing(Protocol):
    """What the server needs from the model's tokenizer (`radixd.daemon.text.tokenizer.TextTokenizer`)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def longest_token_chars(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def id_to_token(self, token_id: int) -> str | None: ...

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str: ...


@dataclass(frozen=True)
class Limits:
    """Model- and pool-dependent request limits (fixed ones are in `bounds.py`), checked before the engine."""

    context_length: int
    default_max_tokens: int = 256
    stream_buffer: int = 1024
    max_sessions_page: int = 1000
    max_prompt_chars: int = 1 << 20
    vocab_size: int = 1 << 31
    total_blocks: int = 1 << 31
    max_sessions: int = DEFAULT_MAX_SESSIONS


def _lower_priority() -> None:
    # Per-thread nice 19 (Linux): a long prompt's tokenization takes only CPU nobody else wants.
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def tokenize_pool() -> concurrent.futures.ThreadPoolExecutor:
    """One low-priority thread for long prompts; the tokenizer runs serially on it and releases the GIL."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix="radixd-tokenize", initializer=_lower_priority
    )


@dataclass
class ServerState:
    engine: Engine
    tokenizer: Tokenizing
    auth: Authenticator
    metrics: Metrics
    limits: Limits
    events: CacheEvents
    model_name: str = ""
    block_size: int = DEFAULT_BLOCK_SIZE
    eos_token_ids: tuple[int, ...] = ()
    draining: bool = False
    active_streams: int = 0
    started_at: float = field(default_factory=time.time)
    # Long prompts are tokenized here, one at a time and at low CPU priority (see `tokenize_pool`).
    tokenize_pool: concurrent.futures.ThreadPoolExecutor = field(default_factory=lambda: tokenize_pool())
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # The streams' outputs cross from the engine thread to the loop through this (handover.py).
    handover: OutputHandover | None = None

    def namespace(self, context: Any) -> str:
        """The caller's cache namespace; aborts UNAUTHENTICATED for a missing or unknown API key."""
        try:
            return self.auth.namespace(context.invocation_metadata())
        except AuthError as exc:
            raise RpcFailure(exc.code, str(exc)) from exc

    def check_admin(self, context: Any) -> None:
        try:
            self.auth.check_admin(context.invocation_metadata())
        except AuthError as exc:
            raise RpcFailure(exc.code, str(exc)) from exc

    def new_work_namespace(self, context: Any) -> str:
        """`namespace`, for a call that starts new work: refused UNAVAILABLE while the daemon drains."""
        if self.draining:
            raise RpcFailure(
                grpc.StatusCode.UNAVAILABLE,
                "the daemon is shutting down and accepts no new work; retry elsewhere",
            )
        return self.namespace(context)

    @contextlib.contextmanager
    def stream_slot(self) -> Iterator[None]:
        """Count an in-flight generation stream (the SIGTERM drain waits for the count to reach 0)."""
        self.active_streams += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.active_streams -= 1
            if self.active_streams == 0:
                self.idle.set()
