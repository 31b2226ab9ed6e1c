"""Wire messages <-> engine types: prompts to token ids, SamplingParams, outputs to stream messages.

Every check here raises `RpcFailure(INVALID_ARGUMENT)` with a message naming the field and the fix.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from radixd_client._pb import common_pb2

from radixd.daemon.executor.limits import check_token_ids
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.server.common.bounds import INLINE_TOKENIZE_CHARS, MAX_CHAT_MESSAGES, check_count
from radixd.daemon.server.common.constraint import wire_constraint
from radixd.daemon.server.common.errors import bad_request
from radixd.daemon.server.common.sampling import engine_sampling

if TYPE_CHECKING:
    from radixd.daemon.engine.types import RequestOutput, TokenLogprob
    from radixd.daemon.server.common.state import Limits, ServerState, Tokenizing

FINISH = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
    "error": common_pb2.FINISH_REASON_ERROR,
}
_SCALAR_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "max_tokens",
    "min_tokens",
    "logprobs",
    "n",
    "prompt_logprobs",
)
# A neutral first message for rendering chat deltas (see `prompt_ids`): it keeps templates from
# injecting their default system prompt into every turn.
_DELTA_BASE = [{"role": "system", "content": ""}]


def sampling_params(msg: common_pb2.SamplingParams, limits: Limits) -> SamplingParams:
    """Engine SamplingParams from the wire message; unset fields take the defaults."""
    values = {name: getattr(msg, name) for name in _SCALAR_FIELDS if msg.HasField(name)}
    if values.get("logprobs") == 0:  # on this wire, 0 asks for no logprobs
        values["logprobs"] = None
    return engine_sampling(
        limits,
        "sampling",
        stop=msg.stop,
        stop_token_ids=msg.stop_token_ids,
        ignore_eos=msg.ignore_eos,
        constraint=wire_constraint(msg, "sampling"),
        logit_bias=msg.logit_bias,
        **values,
    )


def check_prompt(prompt: common_pb2.Prompt, limits: Limits, what: str = "prompt") -> None:
    """Refuse a prompt that could never fit the context, before tokenizing: O(1), O(messages) for chat."""
    kind = prompt.WhichOneof("kind")
    ctx = limits.context_length
    if kind == "text":
        chars = len(prompt.text)
    elif kind == "token_ids":
        n = len(prompt.token_ids.ids)
        if n > ctx:
            raise bad_request(
                f"{what}.token_ids has {n} ids; the context length is {ctx} tokens: shorten the prompt"
            )
        return
    elif kind == "chat":
        messages = prompt.chat.messages
        check_count(f"{what}.chat.messages", messages, MAX_CHAT_MESSAGES)
        chars = sum(len(m.content) + len(m.role) for m in messages)
    else:
        return
    if chars > limits.max_prompt_chars:
        raise bad_request(
            f"{what} has {chars} characters; no text longer than {limits.max_prompt_chars} characters fits"
            f" the context of {ctx} tokens: shorten the prompt"
        )


async def prompt_tokens(
    state: ServerState,
    prompt: common_pb2.Prompt,
    what: str = "prompt",
    continuation: bool = False,
    generation_prompt: bool | None = None,
    context_tail: str = "",
) -> list[int]:
    """`prompt_ids` after the size bounds; long texts go to the single tokenizer thread (GIL released)."""
    check_prompt(prompt, state.limits, what)
    kind = prompt.WhichOneof("kind")
    size = len(prompt.text) if kind == "text" else sum(len(m.content) for m in prompt.chat.messages)
    tok = state.tokenizer

    def run() -> list[int]:
        return prompt_ids(prompt, tok, continuation, generation_prompt, context_tail)

    if kind == "token_ids" or size <= INLINE_TOKENIZE_CHARS:
        return run()
    return await asyncio.get_running_loop().run_in_executor(state.tokenize_pool, run)


def prompt_ids(
    prompt: common_pb2.Prompt,
    tok: Tokenizing,
    continuation: bool = False,
    generation_prompt: bool | None = None,
    context_tail: str = "",
) -> list[int]:
    """Token ids of a wire prompt (call `prompt_tokens`, which checks its size first). continuation=True
    (a session turn): no BOS, chat renders only the new messages after `context_tail`."""
    kind = prompt.WhichOneof("kind")
    if kind is None:
        raise bad_request("prompt is empty: set prompt.text, prompt.token_ids or prompt.chat")
    if kind == "text":
        if not prompt.text:
            raise bad_request("prompt.text is empty; send at least one character")
        return tok.encode(prompt.text, add_special_tokens=not continuation)
    if kind == "token_ids":
        if not prompt.token_ids.ids:
            raise bad_request("prompt.token_ids is empty; send at least one token id")
        return check_token_ids(prompt.token_ids.ids, tok.vocab_size)
    chat = prompt.chat
    if not chat.messages:
        raise bad_request("prompt.chat has no messages; send at least one {role, content}")
    messages = [{"role": m.role, "content": m.content} for m in chat.messages]
    for i, m in enumerate(messages):
        if m["role"] not in ("system", "user", "assistant", "tool"):
            raise bad_request(
                f"prompt.chat.messages[{i}].role {m['role'][:32]!r} must be system, user, assistant or tool"
            )
    add_gen = chat.add_generation_prompt if generation_prompt is None else generation_prompt
    try:
        if continuation:
            text = _chat_delta(tok, messages, add_gen, context_tail)
        else:
            text = tok.apply_chat_template(messages, add_generation_prompt=add_gen)
    except ValueError as exc:
        raise bad_request(str(exc)) from exc
    ids = tok.encode(text, add_special_tokens=False)
    if not ids:
        raise bad_request("the rendered chat prompt is empty")
    return ids


def _chat_delta(tok: Tokenizing, messages: list[dict[str, str]], add_gen: bool, context_tail: str) -> str:
    """The template text of `messages` continuing a conversation: (neutral base + messages) minus base,
    after whatever the context lacks of the previous message's ending."""
    base = tok.apply_chat_template(_DELTA_BASE, add_generation_prompt=False)
    full = tok.apply_chat_template(_DELTA_BASE + messages, add_generation_prompt=add_gen)
    if not full.startswith(base):
        raise bad_request("this model's chat template cannot render a turn on its own; send prompt.text")
    delta = full[len(base) :]
    for eos_id in tok.eos_token_ids:
        eos_text = tok.id_to_token(eos_id)
        if eos_text and eos_text in base:
            ending = base[base.rindex(eos_text) :]
            for cut in range(len(ending), 0, -1):
                if context_tail.endswith(ending[:cut]):
                    return ending[cut:] + delta
            return ending + delta
    return delta


def start_message(request_id: str, out: RequestOutput, session_id: str = "") -> common_pb2.GenerationStart:
    start = common_pb2.GenerationStart(
        request_id=request_id,
        prompt_tokens=out.prompt_tokens,
        cached_tokens=out.cached_tokens,
        session_id=session_id,
    )
    if out.prompt_logprobs:
        # The first prompt token has no logprob (None): the wire's list starts at the second.
        _add_logprobs(start.prompt_logprobs, [lp for lp in out.prompt_logprobs if lp is not None])
    return start


def _add_logprobs(field: Any, logprobs: Iterable[TokenLogprob]) -> None:
    """Append `logprobs` to a repeated `Logprobs` field."""
    for lp in logprobs:
        entry = field.add(token_id=lp.token_id, logprob=lp.logprob)
        for tid, value in lp.top:
            entry.top.add(token_id=tid, logprob=value)


def chunk_message(out: RequestOutput) -> common_pb2.GenerationChunk:
    chunk = common_pb2.GenerationChunk(index=out.index, token_ids=out.new_token_ids, text=out.text_delta)
    if out.logprobs:
        _add_logprobs(chunk.logprobs, out.logprobs)
    return chunk


def end_message(out: RequestOutput, total_s: float) -> common_pb2.GenerationEnd:
    return common_pb2.GenerationEnd(
        index=out.index,
        finish_reason=FINISH.get(out.finish_reason or "", common_pb2.FINISH_REASON_UNSPECIFIED),
        error=out.error or "",
        usage=common_pb2.Usage(
            prompt_tokens=out.prompt_tokens,
            cached_tokens=out.cached_tokens,
            completion_tokens=out.completion_tokens,
            accepted_draft_tokens=out.accepted_draft_tokens,
        ),
        timings=common_pb2.Timings(
            queue_s=out.queue_time_s or 0.0, ttft_s=out.ttft_s or 0.0, total_s=total_s
        ),
    )
