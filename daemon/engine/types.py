"""Public engine types: what callers submit (`GenerateRequest`) and what they get back (`RequestOutput`);
the errors the engine raises or reports are in `radixd.daemon.errors`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from radixd.daemon.executor.sampling import SamplingParams

FinishReason = Literal["stop", "length", "abort", "error"]

# The wire's flush modes, shared by client and server; every mode keeps leased and pinned blocks.
FlushMode = Literal["evict_unlocked", "refuse_if_busy", "wait_for_idle"]
FLUSH_MODES: tuple[FlushMode, ...] = get_args(FlushMode)


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request. With `session_id`, `prompt_token_ids` is the new turn. `namespace`: cache
    isolation. `priority`: larger preempted last. `arrival_time`: queue time, TTFT and FCFS order."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    namespace: str = ""
    session_id: str | None = None
    priority: int = 0
    beam_width: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    detokenize: bool = True


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob of one generated token and the top-n alternatives (token_id, logprob)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class RequestOutput:
    """One increment of one output of a request (`index` < n), delivered to the request's sink.

    `matched_stop`: the stop string or id (None for EOS). `prompt_logprobs`: on the first output only.
    Not frozen (built per token, frozen init is slow); the engine never reads one back."""

    request_id: str
    index: int
    new_token_ids: list[int]
    text_delta: str
    logprobs: list[TokenLogprob] | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finished: bool
    finish_reason: FinishReason | None
    error: str | None = None
    queue_time_s: float | None = None
    ttft_s: float | None = None
    error_code: str | None = None
    session_id: str | None = None
    matched_stop: str | int | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    accepted_draft_tokens: int = 0  # of completion_tokens, those that were accepted speculative drafts


Sink = Callable[[RequestOutput], None]
"""Where a request's outputs go; called on the engine thread, one `RequestOutput` at a time."""
