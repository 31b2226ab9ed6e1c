"""The engine's two request checks (ids in the vocabulary, prompt + output within the context), the one
definition every layer calls. NOTE: they read no engine state, so any thread may call them.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixd.daemon.errors import InvalidRequest, RequestTooLarge


def check_token_ids(ids: Sequence[int], vocab_size: int, what: str = "prompt") -> list[int]:
    """Refuse an id outside [0, vocab_size), naming its position (InvalidRequest); -> the ids as a list."""
    for pos, tid in enumerate(ids):
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < vocab_size:
            raise InvalidRequest(
                f"{what} token id {tid!r} at position {pos} is out of range; token ids must be integers"
                f" in [0, {vocab_size})"
            )
    return list(ids)


def check_context(prompt_len: int, max_tokens: int, context_length: int) -> None:
    """Refuse a prompt whose `max_tokens` more would exceed the context (RequestTooLarge)."""
    total = prompt_len + max_tokens
    if total > context_length:
        raise RequestTooLarge(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = {total} exceeds the context"
            f" limit of {context_length} tokens (the context length); shorten the prompt or lower"
            f" max_tokens to at most {max(0, context_length - prompt_len)}"
        )
