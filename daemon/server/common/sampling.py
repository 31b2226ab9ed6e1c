"""Any wire's sampling fields -> the engine's `SamplingParams`, with one set of bounds.

Sizes are checked first; `SamplingParams` checks the rest. Refusals (INVALID_ARGUMENT) name the field
as the client's message (`what`) spells it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from radixd.daemon.executor.limits import check_token_ids
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.server.common.bounds import (
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    check_count,
    check_range,
)
from radixd.daemon.server.common.errors import bad_request

if TYPE_CHECKING:
    from radixd.daemon.server.common.state import Limits


def engine_sampling(
    limits: Limits,
    what: str,
    *,
    n: int | None = None,
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    logit_bias: Mapping[int, float] | None = None,
    **values: Any,
) -> SamplingParams:
    """The engine's SamplingParams; None `n` / `max_tokens` take the defaults, `values` the other fields."""
    if n is not None:
        check_range(f"{what}.n", n, 1, MAX_N, "; ask for fewer completions per request")
    if max_tokens is not None:
        check_range(
            f"{what}.max_tokens",
            max_tokens,
            1,
            limits.context_length,
            f" (prompt + max_tokens must fit the context length of {limits.context_length} tokens)",
        )
    check_count(f"{what}.stop", stop, MAX_STOP_STRINGS)
    for i, s in enumerate(stop):
        if not s or len(s) > MAX_STOP_CHARS:
            raise bad_request(f"{what}.stop[{i}] has {len(s)} characters; it needs 1 to {MAX_STOP_CHARS}")
    check_count(f"{what}.stop_token_ids", stop_token_ids, MAX_STOP_TOKEN_IDS)
    check_token_ids(stop_token_ids, limits.vocab_size, what=f"{what}.stop_token_ids")
    if logit_bias:
        check_count(f"{what}.logit_bias", logit_bias, MAX_LOGIT_BIAS)
        check_token_ids(list(logit_bias), limits.vocab_size, what=f"{what}.logit_bias")
        values["logit_bias"] = tuple(logit_bias.items())
    try:
        return SamplingParams(
            n=n or 1,
            max_tokens=limits.default_max_tokens if max_tokens is None else max_tokens,
            stop=tuple(stop),
            stop_token_ids=tuple(stop_token_ids),
            **values,
        )
    except (ValueError, TypeError) as exc:
        raise bad_request(f"invalid {what}: {exc}") from exc
