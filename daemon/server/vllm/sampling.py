"""vLLM `SamplingParams` -> the engine's `SamplingParams`, refusing what radixd cannot honour.

Every field the engine supports is passed on; every other one, when set to anything but its neutral
value, is refused with INVALID_ARGUMENT naming the field, never silently ignored. Detokenization
options (`skip_special_tokens`, `spaces_between_special_tokens`, `include_stop_str_in_output`) are
accepted: the worker returns token ids, and the gateway detokenizes and applies them itself.

NOTE: proto3 scalars cannot tell "unset" from 0, so `top_p` 0 and `repetition_penalty` 0 (never valid
values) mean "unset" here, as in vLLM's own servicer, and `n` 0 means 1.
"""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import vllm_engine_pb2

from radixd.daemon.engine.limits import check_token_ids
from radixd.daemon.sampling import SamplingParams
from radixd.daemon.server.bounds import (
    MAX_N,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    check_count,
    check_range,
)
from radixd.daemon.server.errors import bad_request
from radixd.daemon.server.state import Limits

MAX_LOGPROBS = 20
_CONSTRAINTS = ("json_schema", "regex", "grammar", "structural_tag", "json_object", "choice")


def _refuse(field: str, why: str) -> None:
    raise bad_request(f"sampling_params.{field} is not supported by radixd: {why}")


def _refuse_unsupported(msg: vllm_engine_pb2.SamplingParams) -> None:
    constraint = msg.WhichOneof("constraint")
    if constraint is not None:
        _refuse(constraint, "structured outputs are not implemented; leave the constraint unset")
    if msg.logit_bias:
        _refuse("logit_bias", "per-token logit biases are not implemented; send the request without it")
    if msg.HasField("prompt_logprobs"):
        _refuse("prompt_logprobs", "prompt logprobs are not computed; leave it unset")
    if msg.HasField("logprobs") and msg.logprobs < 0:
        _refuse("logprobs", f"-1 (every token) is not served; ask for at most {MAX_LOGPROBS}")


def sampling_from_vllm(msg: vllm_engine_pb2.SamplingParams, limits: Limits) -> SamplingParams:
    """The engine's SamplingParams for a vLLM request (sizes bounded before anything is built)."""
    _refuse_unsupported(msg)
    n = msg.n or 1
    check_range("sampling_params.n", n, 1, MAX_N, "; ask for fewer completions per request")
    check_count("sampling_params.stop", msg.stop, MAX_STOP_STRINGS)
    for i, stop in enumerate(msg.stop):
        if not stop or len(stop) > MAX_STOP_CHARS:
            raise bad_request(
                f"sampling_params.stop[{i}] has {len(stop)} characters; it needs 1 to {MAX_STOP_CHARS}"
            )
    check_count("sampling_params.stop_token_ids", msg.stop_token_ids, MAX_STOP_TOKEN_IDS)
    check_token_ids(msg.stop_token_ids, limits.vocab_size, what="sampling_params.stop_token_ids")
    max_tokens = limits.default_max_tokens
    if msg.HasField("max_tokens"):
        max_tokens = check_range(
            "sampling_params.max_tokens",
            msg.max_tokens,
            1,
            limits.context_length,
            f" (prompt + max_tokens must fit the context length of {limits.context_length} tokens)",
        )
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": msg.min_tokens,
        "temperature": float(msg.temperature) if msg.HasField("temperature") else 1.0,
        "top_k": msg.top_k,
        "top_p": float(msg.top_p) if msg.top_p else 1.0,
        "min_p": float(msg.min_p),
        "repetition_penalty": float(msg.repetition_penalty) if msg.repetition_penalty else 1.0,
        "presence_penalty": float(msg.presence_penalty),
        "frequency_penalty": float(msg.frequency_penalty),
        "seed": msg.seed if msg.HasField("seed") else None,
        "stop": tuple(msg.stop),
        "stop_token_ids": tuple(msg.stop_token_ids),
        "ignore_eos": msg.ignore_eos,
        "logprobs": msg.logprobs if msg.HasField("logprobs") else None,
        "n": n,
    }
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as exc:
        raise bad_request(f"invalid sampling_params: {exc}") from exc


def truncate_prompt(ids: list[int], msg: vllm_engine_pb2.SamplingParams, limits: Limits) -> list[int]:
    """Apply `truncate_prompt_tokens` (keep the last k tokens; -1 = the context length)."""
    if not msg.HasField("truncate_prompt_tokens"):
        return ids
    k = msg.truncate_prompt_tokens
    if k == -1:
        k = limits.context_length
    if k < 1:
        raise bad_request(f"sampling_params.truncate_prompt_tokens must be -1 or >= 1, got {k}")
    return ids[-k:]
