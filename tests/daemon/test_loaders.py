"""Loaders: default model discovery, GGUF files read as stored, errors naming the file, tokenizer and
chat template equal to transformers' for the same GGUF."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from radixd.daemon.loaders import LoadedModel, ModelLoadError, default_model_path, load_model
from radixd.daemon.loaders.gguf_file import _unpermute
from radixd.daemon.loaders.gguf_header import GGUFHeader
from radixd.daemon.model.stored import Stored


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
        load_model(str(bad))


def test_truncated_gguf_error_names_it(tmp_path: Path) -> None:
    cut = tmp_path / "truncated.gguf"
    with open(default_model_path(), "rb") as f:
        cut.write_bytes(f.read(3_000_000))
    with pytest.raises(ModelLoadError, match=re.escape("truncated.gguf")):
        load_model(str(cut))


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


def test_a_second_load_is_identical_and_writes_nothing(smollm: LoadedModel, model_cache_dir: Path) -> None:
    before = sorted(p.name for p in model_cache_dir.rglob("*") if "kernels" not in p.parts)
    again = load_model()
    a, b = smollm.model.weights.tensors(), again.model.weights.tensors()
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y), k
    assert again.tokenizer.encode("twice?") == smollm.tokenizer.encode("twice?")
    assert again.config == smollm.config
    assert sorted(p.name for p in model_cache_dir.rglob("*") if "kernels" not in p.parts) == before


def test_the_header_reader_agrees_with_gguf_py() -> None:
    import gguf

    path = default_model_path()
    ours, theirs = GGUFHeader(path), gguf.GGUFReader(path, "r")
    assert ours.fields.keys() == {k for k in theirs.fields if not k.startswith("GGUF.")}
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.get(key) == field.contents(), key
    assert [(t.name, t.dims, t.type_id, t.offset) for t in ours.tensors] == [
        (t.name, tuple(int(x) for x in t.shape), int(t.tensor_type), int(t.data_offset))
        for t in theirs.tensors
    ]


def test_w4a8_holds_the_files_blocks_not_floats() -> None:
    lm = load_model(dtype="w4a8")
    layer = lm.model.weights.layers[0]
    for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down, lm.model.weights.lm_head):
        assert isinstance(m, tuple) and all(isinstance(p, Stored) for p in m)
    assert isinstance(lm.model.weights.embed, tuple)
    ids = torch.tensor([0, 5, 49151])
    want = torch.cat([p.dequantize() for p in lm.model.weights.embed])[ids]
    assert torch.equal(lm.model.embed(ids), want)


def test_an_unsupported_format_is_refused_by_name(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "q2k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    blocks = np.zeros((8, 84), dtype=np.uint8)  # 8 rows of one Q2_K block
    w.add_tensor("token_embd.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="Q2_K"):
        load_model(str(path))


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
