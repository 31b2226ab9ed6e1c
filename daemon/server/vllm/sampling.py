"""vLLM `SamplingParams` -> the engine's `SamplingParams`, refusing what radixd cannot honour.

Unsupported fields set to non-neutral values are refused, never ignored; detokenization options are
accepted (the gateway detokenizes). `grammar_from_first_token` changes nothing: with no reasoning
parser every constraint starts at the first token. As in vLLM's servicer, `top_p` 0 and
`repetition_penalty` 0 mean unset and `n` 0 means 1 (proto3 cannot tell unset from 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from smg_grpc_proto.generated import vllm_engine_pb2

from radixd.daemon.server.common.constraint import wire_constraint
from radixd.daemon.server.common.errors import bad_request
from radixd.daemon.server.common.sampling import engine_sampling

if TYPE_CHECKING:
    from radixd.daemon.executor.sampling import SamplingParams
    from radixd.daemon.server.common.state import Limits

MAX_LOGPROBS = 20


def _refuse(field: str, why: str) -> None:
    raise bad_request(f"sampling_params.{field} is not supported by radixd: {why}")


def _refuse_unsupported(msg: vllm_engine_pb2.SamplingParams) -> None:
    for name in ("logprobs", "prompt_logprobs"):
        if msg.HasField(name) and getattr(msg, name) < 0:
            _refuse(name, f"-1 (every token) is not served; ask for at most {MAX_LOGPROBS}")


def sampling_from_vllm(msg: vllm_engine_pb2.SamplingParams, limits: Limits) -> SamplingParams:
    """The engine's SamplingParams for a vLLM request, after refusing what radixd cannot honour."""
    _refuse_unsupported(msg)
    return engine_sampling(
        limits,
        "sampling_params",
        n=msg.n or 1,
        max_tokens=msg.max_tokens if msg.HasField("max_tokens") else None,
        stop=msg.stop,
        stop_token_ids=msg.stop_token_ids,
        min_tokens=msg.min_tokens,
        temperature=msg.temperature if msg.HasField("temperature") else 1.0,
        top_k=msg.top_k,
        top_p=msg.top_p or 1.0,
        min_p=msg.min_p,
        repetition_penalty=msg.repetition_penalty or 1.0,
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        seed=msg.seed if msg.HasField("seed") else None,
        ignore_eos=msg.ignore_eos,
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        constraint=wire_constraint(msg, "sampling_params"),
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
        logit_bias=msg.logit_bias,
    )


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
