"""A constraint that forces text this model's vocabulary cannot spell (SmolLM2 has no token for 21 of
the 256 bytes, 0x16 among them) ends its request with INVALID_ARGUMENT and a message that says so,
before any token when the bytes are forced from the start, mid-way otherwise; never as INTERNAL, and
the batch around it goes on."""

from __future__ import annotations

import pytest
from engine_kit import assert_all_free, make_core, run
from structured_kit import chat, constrained

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.structured.spec import Constraint

pytestmark = pytest.mark.slow

MISSING_BYTE = "\\x16"  # a regex escape for a byte with no token in SmolLM2's vocabulary


def test_the_vocabulary_really_lacks_the_byte(smollm: LoadedModel) -> None:
    """The premise: no token spells 0x16 (else the cases below test nothing)."""
    tok = smollm.tokenizer.tokenizer
    assert tok.decode(tok.encode("\x16" + "0").ids) == "0"


@pytest.mark.parametrize(
    ("regex", "before_any_token"),
    [
        (MISSING_BYTE + "0", True),  # forced from the start: the mask would allow "0", consume refuse it
        (MISSING_BYTE, True),  # nothing at all can start the output
        ("(a|b)" + MISSING_BYTE + "0", False),  # forced after a free choice: found mid-way
        ("(a|b)" + MISSING_BYTE, False),  # no token continues after a free choice
        ("[xy]{1,2}" + MISSING_BYTE + "[0-9]", False),
    ],
)
def test_unspellable_forced_bytes_end_with_invalid_argument(
    smollm: LoadedModel, regex: str, before_any_token: bool
) -> None:
    core = make_core(smollm)
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    reqs = [
        GenerateRequest("dead", chat(smollm, "Write a or b."), constrained(Constraint("regex", regex))),
        GenerateRequest("plain", chat(smollm, "Hello!"), plain),
    ]
    col = run(core, reqs)
    out = col.final("dead")
    assert out.finish_reason == "error" and out.error_code == "invalid_argument", (out.error, out.error_code)
    assert out.error is not None and "cannot" in out.error and "internal" not in out.error
    if before_any_token:
        assert col.tokens("dead") == []
    else:
        assert 1 <= len(col.tokens("dead")) <= 2
        assert "\\x16" in out.error or "cannot go on" in out.error
    assert col.final("plain").finish_reason == "length" and len(col.tokens("plain")) == 6
    assert core.stats().errors == 0  # the client's constraint, not an engine fault
    assert_all_free(core)


def test_a_choice_around_the_missing_byte_still_generates(smollm: LoadedModel) -> None:
    """Where the grammar leaves a spellable way on, the output takes it: no error at all."""
    core = make_core(smollm)
    req = GenerateRequest(
        "ok", chat(smollm, "Say ab."), constrained(Constraint("regex", "a(" + MISSING_BYTE + "|b)c"))
    )
    col = run(core, [req])
    out = col.final("ok")
    assert out.finish_reason == "stop", out.error
    assert col.text("ok") == "abc"
    assert_all_free(core)
