"""Incremental detokenizers (UTF-8 safety, deltas == full decode) and stop strings across boundaries.

Each detokenizer test runs both ways: by byte pieces (what the embedded byte-level vocabulary gets) and
by decode windows (what any other tokenizer gets), against the tokenizer's own full decode.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
from tokenizers import Tokenizer, decoders, models

from radixd.daemon.loaders import LoadedModel
from radixd.daemon.text.detokenizer import (
    ByteDetokenizer,
    Detokenizer,
    WindowDetokenizer,
    new_detokenizer,
)
from radixd.daemon.text.stop import StopStringMatcher
from radixd.daemon.text.tokenizer import TextTokenizer

MakeDetok = Callable[..., Detokenizer]


@pytest.fixture(params=["bytes", "window"])
def make_detok(request: pytest.FixtureRequest) -> MakeDetok:
    def make(tok: TextTokenizer, prompt: Sequence[int] = (), skip_special: bool = False) -> Detokenizer:
        if request.param == "window":
            return WindowDetokenizer(tok, prompt, skip_special)
        detok = new_detokenizer(tok, prompt, skip_special)
        assert isinstance(detok, ByteDetokenizer)  # the embedded vocabulary takes the fast path
        return detok

    return make


TEXTS = [
    "héllo wörld, ça va? 世界你好 🎉🚀 done",
    "Emoji run: 👩‍👩‍👧‍👦🏳️‍🌈 and math ∮ E⋅da = Q",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "日本語のテキストとカタカナ、ひらがな。",
]


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_never_split_characters_and_concatenate_to_full_decode(
    smollm: LoadedModel, text: str, make_detok: MakeDetok
) -> None:
    tok = smollm.tokenizer
    prompt = tok.encode("Say:")
    ids = tok.encode(text)
    detok = make_detok(tok, prompt)
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == text
    if any(ord(c) > 0x7FF for c in text):
        assert "" in deltas[:-1]  # some token ended mid-character and was held back


@pytest.mark.slow
def test_random_tokens_concatenate_to_full_decode(smollm: LoadedModel, make_detok: MakeDetok) -> None:
    tok = smollm.tokenizer
    rng = random.Random(0)
    for i in range(10):
        skip = i % 2 == 1
        ids = [rng.randrange(tok.vocab_size) for _ in range(60)]
        detok = make_detok(tok, [rng.randrange(tok.vocab_size) for _ in range(3)], skip)
        out = "".join(detok.add(t) for t in ids) + detok.flush()
        assert out == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.slow
def test_invalid_utf8_is_replaced_as_the_tokenizer_replaces_it(smollm: LoadedModel) -> None:
    # Streams dense in lone bytes >= 0x80 (continuations, truncated and overlong leads) stress where the
    # incremental UTF-8 decoder puts U+FFFD against the tokenizer's own lossy decode.
    tok = smollm.tokenizer
    pieces = tok.byte_pieces(False)
    assert pieces is not None
    high = [i for i, p in enumerate(pieces) if len(p) == 1 and p[0] >= 0x80]
    assert len(high) > 100  # the vocabulary spells most lone bytes >= 0x80 (113 of 128)
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.choice(high) if rng.random() < 0.7 else rng.randrange(tok.vocab_size) for _ in range(12)]
        detok = ByteDetokenizer(pieces)
        deltas = [detok.add(t) for t in ids] + [detok.flush()]
        assert "".join(deltas) == tok.decode(ids)


def test_other_decoders_take_the_window_path() -> None:
    vocab = {"\u2581a": 0, "b": 1, "<unk>": 2}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.decoder = decoders.Metaspace()
    tok = TextTokenizer(raw)
    assert tok.byte_pieces(True) is None
    detok = new_detokenizer(tok, (), skip_special_tokens=True)
    assert isinstance(detok, WindowDetokenizer)
    assert detok.add([0, 1]) + detok.add(0) + detok.flush() == tok.decode([0, 1, 0]) == "ab a"


@pytest.mark.slow
def test_multi_token_add_and_skip_special(smollm: LoadedModel, make_detok: MakeDetok) -> None:
    tok = smollm.tokenizer
    ids = tok.encode("<|im_start|>assistant\nHi 🙂<|im_end|>")
    detok = make_detok(tok, skip_special=True)
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
def test_stop_string_across_token_boundaries_with_real_tokens(
    smollm: LoadedModel, make_detok: MakeDetok
) -> None:
    tok = smollm.tokenizer
    ids = tok.encode("The answer is 42. Question: next")
    detok = make_detok(tok)
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
