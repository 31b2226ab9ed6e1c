"""Incremental detokenizer (UTF-8 safety, deltas == full decode) and stop strings across boundaries."""

from __future__ import annotations

import random

import pytest

from radixd.daemon.detokenizer import IncrementalDetokenizer
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.stop import StopStringMatcher

TEXTS = [
    "héllo wörld, ça va? 世界你好 🎉🚀 done",
    "Emoji run: 👩‍👩‍👧‍👦🏳️‍🌈 and math ∮ E⋅da = Q",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "日本語のテキストとカタカナ、ひらがな。",
]


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_never_split_characters_and_concatenate_to_full_decode(smollm: LoadedModel, text: str) -> None:
    tok = smollm.tokenizer
    prompt = tok.encode("Say:")
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, prompt)
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == text
    if any(ord(c) > 0x7FF for c in text):
        assert "" in deltas[:-1]  # some token ended mid-character and was held back


@pytest.mark.slow
def test_random_tokens_concatenate_to_full_decode(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    rng = random.Random(0)
    for _ in range(5):
        ids = [rng.randrange(tok.vocab_size) for _ in range(60)]
        detok = IncrementalDetokenizer(tok, [rng.randrange(tok.vocab_size) for _ in range(3)])
        out = "".join(detok.add(t) for t in ids) + detok.flush()
        assert out == tok.decode(ids)


@pytest.mark.slow
def test_multi_token_add_and_skip_special(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    ids = tok.encode("<|im_start|>assistant\nHi 🙂<|im_end|>")
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    out = detok.add(ids[:3]) + detok.add(ids[3:]) + detok.flush()
    assert out == tok.decode(ids, skip_special_tokens=True) == "assistant\nHi 🙂"


def _run(stop: list[str], deltas: list[str]) -> tuple[str, bool, str | None]:
    m = StopStringMatcher(stop)
    out = ""
    for d in deltas:
        r = m.push(d)
        out += r.text
        if r.stopped:
            return out, True, r.stop_string
    return out + m.finish(), False, None


def test_stop_string_split_across_deltas_is_excluded() -> None:
    assert _run(["END"], ["foo E", "N", "D bar"]) == ("foo ", True, "END")


def test_partial_match_is_released_when_it_fails() -> None:
    assert _run(["END"], ["foo E", "N", "x"]) == ("foo ENx", False, None)


def test_held_back_text_is_released_at_finish() -> None:
    m = StopStringMatcher(["</answer>"])
    assert m.push("42 </ans").text == "42 "
    assert m.finish() == "</ans"


def test_earliest_of_several_stop_strings_wins() -> None:
    assert _run(["world", "lo w"], ["hel", "lo wor", "ld"]) == ("hel", True, "lo w")


def test_stop_inside_one_delta_and_no_stops() -> None:
    assert _run(["\n\n"], ["a\n\nb"]) == ("a", True, "\n\n")
    assert _run([], ["a", "b"]) == ("ab", False, None)


@pytest.mark.slow
def test_stop_string_across_token_boundaries_with_real_tokens(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    ids = tok.encode("The answer is 42. Question: next")
    detok = IncrementalDetokenizer(tok)
    m = StopStringMatcher(["Question:"])
    out, stopped, n_tokens = "", False, 0
    for t in ids:
        n_tokens += 1
        r = m.push(detok.add(t))
        out += r.text
        if r.stopped:
            stopped = True
            break
    assert stopped and out == "The answer is 42. "
    assert n_tokens < len(ids)
