"""SentencePiece GGUF vocabularies: radixd's tokenizer against transformers' GGUF tokenizer for the same
tiny files (one with the space prefix and llama.cpp's per-piece prefix rule, one shaped like Gemma's),
BOS, decoding, end-of-turn ids, and the chat template a Gemma file without one gets."""

from __future__ import annotations

import random
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from tokenizers import AddedToken

from radixd.daemon.loaders import ModelLoadError
from radixd.daemon.loaders.gguf_file import _open, _tokenizer
from radixd.daemon.text.spm import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED
from radixd.daemon.text.tokenizer import TextTokenizer

SP = "\u2581"
CORPUS = (
    "the quick brown fox jumps over the lazy dog and the other dog; hello world, hello there! "
    "in 1234 and 5678 there were 90 cats. interesting things happen in the world of tokenizers, "
    "wörld café naïve: the end. return value = compute(x, y) + 42 ; print('hello')"
)
CHARS = sorted(set(CORPUS.replace(" ", SP)) | set("ABCDEFGHIJKLMNOPQRSTUVWXYZ") | {SP, "é", "世"})
TEXTS = [
    "the quick brown fox",
    "Hello world",
    "hello there! the end.",
    "interesting tokenizers in the world",
    "numbers 1234 5678 90 3.14159 and 007",
    "two  spaces, three   spaces and    four",
    " leading space",
    "  two leading",
    "trailing space ",
    "tabs\tand\nnewlines\n\nand more\r\n",
    "wörld café naïve",
    "unicode 世界 and 世 ok",
    "emoji 🎉🚀 need byte fallback, so does ж and 한국어",
    "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n",
    "before<end_of_turn>after",
    "a tool <tool> call<tool>here",
    "<unk> and <s> inside </s> text",
    "print('hello') # code = compute(x, y) + 42",
    "",
    " ",
    "x",
    "the the the the the the the the",
]


def _merged_tokens(n: int) -> list[str]:
    """A tiny BPE training on CORPUS: the pieces its first `n` merges make, best first."""
    words = [list(SP + w) for w in CORPUS.split(" ")]
    out: list[str] = []
    for _ in range(n):
        pairs = Counter((a, b) for w in words for a, b in pairwise(w))
        if not pairs:
            break
        (a, b), _count = pairs.most_common(1)[0]
        out.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i : i + 2] = [a + b]
                i += 1
    return out


def _vocab(gemma: bool) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: specials, the 256 byte tokens, characters, merged pieces (scored by
    their order, as Gemma's are), control turn markers and user-defined tokens."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN] if gemma else [UNKNOWN, CONTROL, CONTROL]
    user = ["<tool>", "\n", "\n\n", "  ", "   "] if gemma else ["<tool>"]
    tokens = [*specials, "<start_of_turn>", "<end_of_turn>", *user]
    types += [CONTROL, CONTROL] + [USER_DEFINED] * len(user)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    merged = [t for t in _merged_tokens(160) if t not in CHARS]
    tokens += merged + CHARS
    types += [NORMAL] * (len(merged) + len(CHARS))
    first = len(tokens) - len(merged) - len(CHARS)
    scores = [0.0] * first + [-float(i) for i in range(len(merged))]
    scores += [-1e4 - i for i in range(len(CHARS))]
    return tokens, scores, types


def _write(path: Path, arch: str, gemma: bool) -> None:
    tokens, scores, types = _vocab(gemma)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(tokens.index("<bos>" if gemma else "<s>"))
    w.add_eos_token_id(tokens.index("<eos>" if gemma else "</s>"))
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_add_bos_token(True)
    w.add_add_space_prefix(not gemma)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# phi3: the architecture whose transformers builder prefixes each piece as llama.cpp does.
FILES = {"prefix": ("phi3", False), "gemma": ("gemma3", True)}


@pytest.fixture(scope="module", params=sorted(FILES))
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[TextTokenizer, Any]:
    from transformers import AutoTokenizer

    arch, gemma = FILES[request.param]
    d = tmp_path_factory.mktemp(request.param)
    _write(d / "tiny.gguf", arch, gemma)
    ours = _tokenizer(_open(str(d / "tiny.gguf")), str(d / "tiny.gguf"))
    return ours, AutoTokenizer.from_pretrained(str(d), gguf_file="tiny.gguf")


def _cases(gemma: bool) -> list[str]:
    rng = random.Random(3)
    pieces = [*CORPUS.split(" "), "世", "é", "🎉", "\n", "<end_of_turn>", "<tool>", "\t", "12", "ж"]
    out = list(TEXTS)
    for _ in range(200):
        out.append(
            "".join(rng.choice(pieces) + rng.choice([" ", "", "  "]) for _ in range(rng.randint(1, 9)))
        )
    if gemma:
        # transformers respells Gemma's space tokens and merges them; llama.cpp cuts them out of the raw
        # text longest first. They agree on runs the space tokens spell greedily: here up to 3 spaces.
        out = [t for t in out if "    " not in t]
    return out


def test_encodes_as_transformers(pair: tuple[TextTokenizer, Any]) -> None:
    ours, hf = pair
    gemma = ours.token_to_id("<bos>") is not None
    cases = _cases(gemma)
    for text in cases:
        assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False), text
        assert ours.encode(text) == hf.encode(text), text
    assert ours.add_bos and ours.encode("x")[0] == ours.bos_token_id
    # the cases reach byte fallback, control and user-defined tokens
    seen = {i for text in cases for i in ours.encode(text)}
    assert {"<0xF0>", "<end_of_turn>", "<tool>"} <= {ours.id_to_token(i) for i in seen}


def test_decodes_as_transformers_and_round_trips(pair: tuple[TextTokenizer, Any]) -> None:
    ours, hf = pair
    rng = random.Random(5)
    for _ in range(100):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(1, 12))]
        assert ours.decode(ids) == hf.decode(ids), ids
    for text in TEXTS:
        if "<" not in text:  # no cut-out tokens: each piece's prefix space would decode as a space
            assert ours.decode(ours.encode(text, add_special_tokens=False)) == text
            assert ours.decode(ours.encode(text), skip_special_tokens=True) == text


def test_space_prefix_follows_llama_cpp(tmp_path: Path) -> None:
    """Written out by hand: the prefix goes before the text and after each cut-out token, even when
    the text already starts with a space, and a missing character falls back to its UTF-8 bytes."""
    _write(tmp_path / "p.gguf", "llama", False)
    tok = _tokenizer(_open(str(tmp_path / "p.gguf")), str(tmp_path / "p.gguf"))
    ids = tok.encode(" the<end_of_turn>the\n", add_special_tokens=False)
    assert [tok.id_to_token(i) for i in ids] == [SP, SP + "the", "<end_of_turn>", SP + "the", "<0x0A>"]


def test_end_of_turn_ids_are_the_vocabularys_special_turn_ends(tmp_path: Path) -> None:
    _write(tmp_path / "g.gguf", "gemma3", True)
    tok = _tokenizer(_open(str(tmp_path / "g.gguf")), str(tmp_path / "g.gguf"))
    names = [tok.id_to_token(i) for i in tok.eos_token_ids]
    assert names == ["<eos>", "<end_of_turn>"]


def test_gemma_file_without_a_template_chats_in_gemma_turns(tmp_path: Path) -> None:
    _write(tmp_path / "g.gguf", "gemma3", True)
    tok = _tokenizer(_open(str(tmp_path / "g.gguf")), str(tmp_path / "g.gguf"))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " Weather? \n"},  # trimmed, as Gemma's own template does
        {"role": "assistant", "content": "Calling."},
        {"role": "tool", "content": [{"type": "text", "text": "sunny"}]},
    ]
    text = tok.apply_chat_template(messages)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nWeather?<end_of_turn>\n"
        "<start_of_turn>model\nCalling.<end_of_turn>\n"
        "<start_of_turn>user\nsunny<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = tok.encode_chat(messages)
    assert ids[0] == tok.bos_token_id and ids.count(tok.token_to_id("<end_of_turn>")) == 3


def test_unknown_tokenizer_model_names_the_supported_ones(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "u.gguf"), "llama")
    w.add_tokenizer_model("rwkv")
    w.add_token_list(["a", "b"])
    w.add_tensor("token_embd.weight", np.zeros((2, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"'rwkv' is not supported.*'gpt2'.*'llama'"):
        _tokenizer(_open(str(tmp_path / "u.gguf")), str(tmp_path / "u.gguf"))


@pytest.mark.parametrize(
    ("specials", "plain", "eos", "want"),
    [
        (["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"], [], 1, [1, 2, 3]),  # Llama 3
        (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], [], 0, [0, 2]),  # Qwen2.5 / Qwen3
        (["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]"], [], 2, [2]),  # Mistral
        (
            ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
            ["<s>", "</s>"],
            1,
            [1, 4],
        ),  # Gemma
    ],
)
def test_end_of_turn_ids_per_family(specials: list[str], plain: list[str], eos: int, want: list[int]) -> None:
    from tokenizers import Tokenizer, models

    from radixd.daemon.text.tokenizer import end_of_turn_ids

    vocab = {t: i for i, t in enumerate([*specials, *plain, "a"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    tok.add_tokens([AddedToken(t, special=False) for t in plain])
    assert list(end_of_turn_ids(tok, eos)) == want
    # the file's own end-of-turn / end-of-message ids come right after eos, without repeats
    last = want[-1]
    first = [eos] if last == eos else [eos, last]
    assert list(end_of_turn_ids(tok, eos, [last, None])) == first + [w for w in want if w not in first]
