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

# NOTE: the one flush vocabulary from the wire (`FLUSH_MODE_EVICT_UNLOCKED`, ...) to the engine; the
# client library and the server use these names too. Every mode keeps leased and pinned blocks.
FlushMode = Literal["evict_unlocked", "refuse_if_busy", "wait_for_idle"]
FLUSH_MODES: tuple[FlushMode, ...] = get_args(FlushMode)


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request.

    `prompt_token_ids`: the prompt. With `session_id` set, they are the new turn's tokens, appended to
    the session's tokens (prompt + every earlier output), and the session advances when the request
    ends. `namespace` isolates cache sharing (different namespaces never share a block); the server sets
    it from authenticated metadata. `priority`: larger is more important; under memory pressure the
    lowest priority (then the newest) running sequence is preempted first. `beam_width` > 0 runs beam
    search of that width (greedy scoring by summed logprobs; `sampling.n` outputs are returned, n <=
    beam_width) instead of sampling. `arrival_time` (`time.monotonic()`, default: when this object
    was built) is when the request arrived; queue time and TTFT are measured from it, and FCFS order
    follows it. `detokenize=False` (a reader that takes token ids only) skips the incremental
    detokenizer: outputs carry no text, unless stop strings needed the text to be matched on.
    """

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

    `prompt_tokens` counts the full prompt (session tokens included); `cached_tokens` how many of them
    came from the prefix cache at first admission. The last output of an index has `finished=True` and a
    `finish_reason`; the request is complete when every index has finished. `error_code` mirrors
    `EngineError.code` when `finish_reason == "error"`. `matched_stop`: what ended an output whose
    `finish_reason` is "stop" (the stop string or the stop token id; None for EOS, as in vLLM).
    `prompt_logprobs` (requests with `SamplingParams.prompt_logprobs` set): on the request's first
    output only (whichever index), one entry per prompt token (the full prompt, session tokens
    included), None for the first token, which has no logprob.

    NOTE: not frozen: one is built per sequence per decode step, and a frozen dataclass's
    field-by-field `object.__setattr__` costs 3.3x a plain slotted one (3.6 vs 1.1 us here). The
    engine never reads an output back once emitted, so a sink that changed one would only see its own
    change.
    """

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
