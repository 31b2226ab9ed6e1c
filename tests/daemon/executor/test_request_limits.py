"""The one token-id check and the one context-fit check, shared by the engine, server and runner."""

from __future__ import annotations

import pytest

from radixd.daemon.errors import InvalidRequest, RequestTooLarge
from radixd.daemon.executor.limits import check_context, check_token_ids


def test_token_ids_must_be_integers_inside_the_vocabulary() -> None:
    assert check_token_ids((0, 5, 9), 10) == [0, 5, 9]
    for bad, pos in (([1, -3, 5], 1), ([1, 10], 1), ([True], 0), ([1, 2.0], 1)):
        with pytest.raises(InvalidRequest, match=f"at position {pos} is out of range") as err:
            check_token_ids(bad, 10, what="prompt")  # type: ignore[arg-type]
        assert isinstance(err.value, ValueError) and err.value.code == "invalid_argument"


def test_prompt_plus_max_tokens_must_fit_the_context() -> None:
    check_context(200, 56, 256)  # exactly full
    with pytest.raises(RequestTooLarge, match="context limit of 256") as err:
        check_context(200, 57, 256)
    assert "context length" in str(err.value) and "at most 56" in str(err.value)
