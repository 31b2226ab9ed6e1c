"""Plain Python views of what the daemon streams back, and the conversions to and from the wire.

A generation stream is one `Start`, then `Chunk`s, then one `End` per completion index; `Completion` is
what `collect()` makes of a whole stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from radixd_client._pb import common_pb2

_FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
    common_pb2.FINISH_REASON_ERROR: "error",
}

# A prompt: text, token ids, or chat messages ({"role": ..., "content": ...} mappings).
PromptLike = str | Sequence[int] | Sequence[Mapping[str, str]]


class SamplingOptions(TypedDict, total=False):
    """Sampling keyword arguments of every generate call (unset = daemon default). At most one constraint
    (``json_schema``, ``json_object``, ``regex``, ``grammar``, ``choice``, ``structural_tag``; two raise
    ValueError before anything is sent): see docs/structured-outputs.md."""

    # Length and stopping.
    max_tokens: int
    min_tokens: int
    stop: Sequence[str]
    stop_token_ids: Sequence[int]
    ignore_eos: bool
    n: int
    # Sampling.
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int
    # Penalties; logit_bias maps a token id to a bias in [-100, 100] (at most 300 entries).
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    logit_bias: Mapping[int, float]
    # Logprobs of the output tokens, and of the prompt tokens (0 = their own only): see Start.
    logprobs: int
    prompt_logprobs: int
    # Constraints (at most one).
    json_schema: Mapping[str, Any] | str
    json_object: bool
    regex: str
    grammar: str
    choice: Sequence[str]
    structural_tag: str


# (token_id, logprob, [(top_token_id, logprob), ...]): one token's logprob and its top alternatives.
TokenLogprobs = tuple[int, float, list[tuple[int, float]]]


@dataclass(frozen=True)
class Start:
    request_id: str
    prompt_tokens: int
    cached_tokens: int
    session_id: str = ""
    # With prompt_logprobs: prompt tokens 2 .. prompt_tokens (the first has no logprob), in order.
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass(frozen=True)
class Chunk:
    index: int
    token_ids: list[int]
    text: str
    # One entry per token when logprobs were requested.
    logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass(frozen=True)
class End:
    index: int
    finish_reason: str
    error: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_s: float
    ttft_s: float
    total_s: float


Event = Start | Chunk | End


@dataclass
class Completion:
    """A whole stream, collected. With n > 1, `texts[i]` / `token_ids[i]` hold completion i."""

    request_id: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    texts: dict[int, str] = field(default_factory=dict)
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    ends: dict[int, End] = field(default_factory=dict)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.texts.get(0, "")

    @property
    def finish_reason(self) -> str:
        end = self.ends.get(0)
        return end.finish_reason if end else ""

    @property
    def completion_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids.values())

    def add(self, event: Event) -> None:
        if isinstance(event, Start):
            self.request_id = event.request_id
            self.prompt_tokens = event.prompt_tokens
            self.cached_tokens = event.cached_tokens
            self.prompt_logprobs = event.prompt_logprobs
        elif isinstance(event, Chunk):
            self.texts[event.index] = self.texts.get(event.index, "") + event.text
            self.token_ids.setdefault(event.index, []).extend(event.token_ids)
        else:
            self.ends[event.index] = event


def collect(events: Iterable[Event]) -> Completion:
    """Drain a stream into a `Completion`."""
    out = Completion()
    for event in events:
        out.add(event)
    return out


def to_prompt(prompt: PromptLike) -> common_pb2.Prompt:
    """Build the wire `Prompt`: a str is text, ints are token ids, mappings are chat messages."""
    if isinstance(prompt, str):
        return common_pb2.Prompt(text=prompt)
    items = list(prompt)
    if items and all(isinstance(m, Mapping) for m in items):
        messages = [common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in items]  # type: ignore[index]
        return common_pb2.Prompt(chat=common_pb2.ChatMessages(messages=messages, add_generation_prompt=True))
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=items))  # type: ignore[arg-type]
    raise TypeError(
        "prompt must be a str, a sequence of token ids, or a sequence of {role, content} mappings"
    )


# The constraint options (the proto's `oneof constraint`), in the order error messages list them.
CONSTRAINT_OPTIONS = ("json_schema", "json_object", "regex", "grammar", "choice", "structural_tag")


def to_sampling(options: SamplingOptions) -> common_pb2.SamplingParams:
    """Build the wire `SamplingParams`, leaving unset options unset (ValueError for two constraints)."""
    msg = common_pb2.SamplingParams()
    for key, value in options.items():
        if value is None or key in CONSTRAINT_OPTIONS:
            continue
        if key in ("stop", "stop_token_ids"):
            getattr(msg, key).extend(value)
        elif key == "logit_bias":
            msg.logit_bias.update(cast("Mapping[int, float]", value))
        else:
            setattr(msg, key, value)
    _set_constraint(msg, options)
    return msg


def _set_constraint(msg: common_pb2.SamplingParams, options: SamplingOptions) -> None:
    given = [k for k in CONSTRAINT_OPTIONS if options.get(k) is not None and options.get(k) is not False]
    if len(given) > 1:
        raise ValueError(
            f"set at most one constraint ({', '.join(CONSTRAINT_OPTIONS)}); got {' and '.join(given)}"
        )
    schema = options.get("json_schema")
    choice = options.get("choice")
    if schema is not None:
        msg.json_schema = schema if isinstance(schema, str) else json.dumps(schema)
    elif choice is not None:
        if isinstance(choice, str):
            raise TypeError("choice must be a sequence of strings, not one string")
        msg.choice.choices.extend(choice)
    elif given:
        setattr(msg, given[0], options[given[0]])  # type: ignore[literal-required]


def _logprobs(entries: Iterable[common_pb2.Logprobs]) -> list[TokenLogprobs]:
    return [(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top]) for lp in entries]


def from_response(
    msg: object,
) -> Event:
    """Convert a GenerateResponse / SessionServiceGenerateResponse into an `Event`."""
    kind = msg.WhichOneof("event")  # type: ignore[attr-defined]
    if kind == "start":
        s = msg.start  # type: ignore[attr-defined]
        return Start(
            s.request_id, s.prompt_tokens, s.cached_tokens, s.session_id, _logprobs(s.prompt_logprobs)
        )
    if kind == "chunk":
        c = msg.chunk  # type: ignore[attr-defined]
        return Chunk(c.index, list(c.token_ids), c.text, _logprobs(c.logprobs))
    if kind == "end":
        e = msg.end  # type: ignore[attr-defined]
        return End(
            index=e.index,
            finish_reason=_FINISH.get(e.finish_reason, "unspecified"),
            error=e.error,
            prompt_tokens=e.usage.prompt_tokens,
            cached_tokens=e.usage.cached_tokens,
            completion_tokens=e.usage.completion_tokens,
            queue_s=e.timings.queue_s,
            ttft_s=e.timings.ttft_s,
            total_s=e.timings.total_s,
        )
    raise ValueError(f"unexpected stream message without an event: {msg!r}")
