"""Loaders: default model discovery, conversion cache, errors naming the file, tokenizer and chat
template equal to transformers' for the same GGUF."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from radixd.daemon.loaders import LoadedModel, ModelLoadError, default_model_path, load_model
from radixd.daemon.loaders.cache import cache_key, load_cached
from radixd.daemon.loaders.gguf_file import _unpermute


def test_default_model_is_found_without_importing_the_package() -> None:
    path = default_model_path()
    assert path.endswith(".gguf") and os.path.isfile(path)


def test_missing_file_error_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match=re.escape("nope.gguf")):
        load_model(str(missing))


def test_garbage_file_error_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError, match=re.escape("garbage.gguf")):
        load_model(str(bad), use_cache=False)


def test_truncated_gguf_error_names_it(tmp_path: Path) -> None:
    cut = tmp_path / "truncated.gguf"
    with open(default_model_path(), "rb") as f:
        cut.write_bytes(f.read(3_000_000))
    with pytest.raises(ModelLoadError, match=re.escape("truncated.gguf")):
        load_model(str(cut), use_cache=False)


def test_hf_dir_without_weights_or_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=re.escape("config.json")):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,'
        ' "num_hidden_layers": 1, "num_attention_heads": 2}'
    )
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(str(tmp_path))


def test_unpermute_inverts_llama_cpp_permute() -> None:
    heads, d, hidden = 3, 8, 5
    w = torch.randn(heads * d, hidden)
    # llama.cpp's permute: (head, 2, d/2) -> (head, d/2, 2)
    permuted = w.reshape(heads, 2, d // 2, hidden).transpose(1, 2).reshape(heads * d, hidden)
    assert torch.equal(_unpermute(permuted, heads), w)
    assert torch.equal(_unpermute(permuted[:, 0].contiguous(), heads), w[:, 0])


@pytest.mark.slow
def test_second_load_is_fast_and_identical(smollm: LoadedModel, model_cache_dir: Path) -> None:
    assert any(model_cache_dir.iterdir()), "the first load should have written a cache entry"
    t0 = time.perf_counter()
    again = load_model()
    elapsed = time.perf_counter() - t0
    assert elapsed <= 5.0, f"second load took {elapsed:.1f}s"
    a, b = smollm.model.weights.tensors(), again.model.weights.tensors()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.tokenizer.encode("cache hit?") == smollm.tokenizer.encode("cache hit?")
    assert again.config == smollm.config


def test_cache_key_follows_path_size_and_mtime(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    k1 = cache_key(str(f))
    assert cache_key(str(f)) == k1
    os.utime(f, ns=(1, 1))
    k2 = cache_key(str(f))
    f.write_bytes(b"x" * 11)
    os.utime(f, ns=(1, 1))
    assert len({k1, k2, cache_key(str(f))}) == 3


@pytest.mark.slow
def test_damaged_cache_entry_is_a_miss(smollm: LoadedModel, model_cache_dir: Path) -> None:
    entry = model_cache_dir / cache_key(default_model_path())
    assert (entry / "meta.json").exists()
    assert load_cached(default_model_path()) is not None
    saved = (entry / "meta.json").read_text()
    try:
        (entry / "meta.json").write_text("{not json")
        assert load_cached(default_model_path()) is None
    finally:
        (entry / "meta.json").write_text(saved)


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


TOKENIZE = [
    "Hello world",
    "  two  spaces and\ttabs\n\nnew lines  ",
    "Numbers 12345 and 3.14159, dates 2024-05-01",
    "def f(x):\n    return x**2  # square\n",
    "Ünïcödé — “quotes” 世界 🎉",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "don't won't I'm you'll we've they'd",
]


@pytest.mark.slow
@pytest.mark.parametrize("text", TOKENIZE)
def test_tokenizer_matches_transformers(smollm: LoadedModel, hf_tokenizer: Any, text: str) -> None:
    want = hf_tokenizer(text, add_special_tokens=True)["input_ids"]
    assert smollm.tokenizer.encode(text) == want
    assert smollm.tokenizer.decode(want) == hf_tokenizer.decode(want)


@pytest.mark.slow
def test_chat_template_matches_transformers(smollm: LoadedModel, hf_tokenizer: Any) -> None:
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    want = hf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert smollm.tokenizer.apply_chat_template(msgs) == want
    sys_msgs = [{"role": "system", "content": "Be brief."}, *msgs]
    want2 = hf_tokenizer.apply_chat_template(sys_msgs, tokenize=False, add_generation_prompt=False)
    assert smollm.tokenizer.apply_chat_template(sys_msgs, add_generation_prompt=False) == want2
    assert smollm.tokenizer.encode_chat(msgs)[0] == smollm.tokenizer.token_to_id("<|im_start|>")
    assert smollm.tokenizer.token_to_id("<|im_end|>") in smollm.tokenizer.eos_token_ids
