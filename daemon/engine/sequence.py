"""Requests and sequences on the engine thread, and their state machine.

A request owns one sequence, or (n > 1, beams) a root that prefills all but the last prompt token and
forks into copy-on-write children. WAITING -> RUNNING -> FINISHED; preemption sends RUNNING back to
WAITING (recompute) or to SWAPPED. NOTE: `tokens[:num_computed]` have KV in `table`; tokens are only
appended, never dropped (preemption drops only KV)."""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixd.daemon.engine.types import FinishReason, GenerateRequest, Sink, TokenLogprob
from radixd.radix import TOKEN_BYTES, TokenKey

if TYPE_CHECKING:
    from radixd.daemon.engine.textstream import TextStream
    from radixd.daemon.executor.prompt_logprobs import PromptLogprobs
    from radixd.daemon.executor.sampling import SamplingState
    from radixd.daemon.structured.matcher import CompiledGrammar
    from radixd.radix import BlockTable, Lease, SlidingTable


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


class SeqIds:
    """Sequence ids, unique within one engine (the components that create sequences share one)."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        self._last += 1
        return self._last


@dataclass
class Hypothesis:
    """A finished beam-search hypothesis: its summed logprob, generated tokens and finish reason."""

    score: float
    tokens: list[int]
    reason: FinishReason


@dataclass
class BeamState:
    """A beam-search request's search state (see beam.py)."""

    width: int
    candidates: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # seq_id -> top-2k
    finished: list[Hypothesis] = field(default_factory=list)


@dataclass(eq=False)
class Sequence:
    """One stream of tokens with its own KV block table (identity-compared)."""

    seq_id: int
    request: RequestState
    index: int  # output index within the request; -1 for a root that will fork
    tokens: list[int]
    sampling: SamplingState | None  # None for a root (it never samples)
    text: TextStream | None = None
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0
    table: BlockTable | None = None
    lease: Lease | None = None
    window: SlidingTable | None = None  # windowed KV layout: the sliding layers' pages
    window_marks: list[int] = field(default_factory=list)  # branch points to keep the window at, once past
    window_from: bytes | None = None  # the packed prefix of the kept window it resumed from
    inserted_blocks: int = 0  # full blocks of `tokens` already inserted in the tree by this sequence
    host_blocks: list[int] = field(default_factory=list)  # swap: host copies of table blocks
    preemptions: int = 0
    finish_reason: FinishReason | None = None
    accepted_draft_tokens: int = 0  # generated tokens that were accepted speculative drafts
    # Beam search: cumulative logprob of the generated tokens.
    score: float = 0.0
    # Tokens/logprobs (and their text) produced since the last output to the sink.
    pending_tokens: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    pending_text: str = ""
    # `tokens` packed as the radix tree's key (native int32), each token encoded once: see `key`.
    packed: bytearray = field(default_factory=bytearray, repr=False)

    def key(self, n: int | None = None) -> TokenKey:
        """The first `n` tokens as a radix key; `tokens` only grow, so only new ones are encoded."""
        packed = self.packed
        have = len(packed) // TOKEN_BYTES
        if have < len(self.tokens):
            packed += array("i", self.tokens[have:]).tobytes()
        end = len(self.tokens) if n is None else n
        with memoryview(packed) as mv:
            return TokenKey(mv[: end * TOKEN_BYTES].tobytes())

    def sampling_at(self, end: int) -> SamplingState | None:
        """The state to sample with once tokens up to `end` are computed (the last only; never a root)."""
        return self.sampling if self.index >= 0 and end == len(self.tokens) else None

    @property
    def is_root(self) -> bool:
        return self.index < 0

    @property
    def target_len(self) -> int:
        """Tokens this sequence computes before it samples (a root stops one short of the prompt)."""
        return len(self.tokens) - 1 if self.is_root else len(self.tokens)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next sample (or before the fork, for a root)."""
        # `target_len` inlined, and no `max` call: read several times per sequence per step.
        r = len(self.tokens) - (self.index < 0) - self.num_computed
        return r if r > 0 else 0

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.request.prompt_len

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED


@dataclass(eq=False)
class RequestState:
    """A submitted request as the engine tracks it."""

    req: GenerateRequest
    sink: Sink
    prompt: list[int]  # full prompt (session tokens + the turn's tokens)
    arrival: float
    seqs: list[Sequence] = field(default_factory=list)
    cached_tokens: int | None = None  # set at first admission
    admitted_at: float | None = None
    first_token_at: float | None = None
    done: bool = False
    forked: bool = False
    beam: BeamState | None = None
    grammar: CompiledGrammar | None = None  # the constraint, compiled: each sequence walks a copy
    # Set when the request asks for prompt logprobs; None again once they went out (Outputs).
    prompt_logprobs: PromptLogprobs | None = None

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def n(self) -> int:
        return max(self.req.sampling.n, 1)

    @property
    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.finished]
