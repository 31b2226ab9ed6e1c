"""A model's family from its metadata (GGUF header or config.json), and the smg parsers
`radixd cluster` passes for it: names smg 1.13 accepts, and a --gateway-arg of the user's wins."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest

from radixd.daemon.cluster import SMG_PARSERS, _smg_binary, parser_args
from radixd.daemon.loaders import ModelLoadError
from radixd.daemon.loaders.family import gguf_scalars, model_family


def _gguf(path: Path, arch: str, name: str, pre: str = "default") -> str:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2" if pre != "default" else "llama")
    w.add_tokenizer_pre(pre)
    w.add_token_list(["a", "b", "ab", "<|eot_id|>"])  # arrays are skipped on the way to later keys
    w.add_token_scores([0.0, -1.0, -2.0, 0.0])
    w.add_eos_token_id(3)
    w.add_add_bos_token(True)
    w.add_rope_freq_base(5e5)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize(
    ("arch", "name", "pre", "family"),
    [
        ("llama", "Meta Llama 3.1 8B Instruct", "llama-bpe", "llama3"),
        ("llama", "Llama 3.2 1B", "default", "llama3"),
        ("llama", "TinyLlama 1.1B Chat v1.0", "default", "llama"),
        ("llama", "mistralai_Mistral 7B Instruct v0.3", "default", "mistral"),
        ("qwen2", "Qwen2.5 1.5B Instruct", "qwen2", "qwen2"),
        ("qwen3", "Qwen3 0.6B", "qwen2", "qwen3"),
        ("qwen3", "Qwen3 4B Thinking 2507", "qwen2", "qwen3-thinking"),
        ("qwen3", "Qwen3-4B-Instruct-2507", "qwen2", "qwen3-instruct"),
        ("gemma3", "Gemma 3 270m", "default", "gemma3"),
        ("gemma3", "Functiongemma 270m It", "default", "functiongemma"),
        ("phi3", "Phi 3 Mini", "default", "phi3"),
    ],
)
def test_gguf_family(tmp_path: Path, arch: str, name: str, pre: str, family: str) -> None:
    assert model_family(_gguf(tmp_path / "m.gguf", arch, name, pre)) == family


def test_gguf_scalars_match_gguf_py(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", "llama", "Llama 3.2 1B", "llama-bpe")
    ours = gguf_scalars(path)
    reader = gguf.GGUFReader(path)
    scalars = {
        k: f.contents()
        for k, f in reader.fields.items()
        if f.types[0] != gguf.GGUFValueType.ARRAY and not k.startswith("GGUF.")
    }
    assert ours.keys() == scalars.keys()
    assert all(ours[k] == pytest.approx(v) for k, v in scalars.items())


def test_not_a_gguf_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"nope" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        model_family(str(tmp_path / "x.gguf"))
    with pytest.raises(ModelLoadError, match="not found"):
        model_family(str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"model_type": "llama", "vocab_size": 128256, "rope_scaling": {"rope_type": "llama3"}}, "llama3"),
        ({"model_type": "llama", "vocab_size": 32000}, "llama"),
        ({"model_type": "mistral", "vocab_size": 32768}, "mistral"),
        ({"model_type": "qwen2", "vocab_size": 151936}, "qwen2"),
        ({"model_type": "qwen3", "vocab_size": 151936, "_name_or_path": "Qwen/Qwen3-1.7B"}, "qwen3"),
        ({"model_type": "gemma3_text", "vocab_size": 262144}, "gemma3"),
    ],
)
def test_hf_directory_family(tmp_path: Path, config: dict[str, object], family: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_family(str(tmp_path)) == family


def test_parsers_per_family_and_the_users_flag_wins() -> None:
    assert parser_args("qwen3", []) == ["--tool-call-parser", "qwen", "--reasoning-parser", "qwen3"]
    assert parser_args("llama3", []) == ["--tool-call-parser", "llama"]
    assert parser_args("mistral", []) == ["--tool-call-parser", "mistral"]
    assert parser_args("qwen2", []) == ["--tool-call-parser", "qwen"]
    assert parser_args("gemma3", []) == parser_args("llama", []) == parser_args("", []) == []
    assert parser_args("qwen3", ["--tool-call-parser", "json"]) == ["--reasoning-parser", "qwen3"]
    assert parser_args("qwen3", ["--reasoning-parser=deepseek_r1", "--policy", "x"]) == [
        "--tool-call-parser",
        "qwen",
    ]


def test_smg_accepts_every_parser_named() -> None:
    """The names are checked against the choices `smg launch --help` lists."""
    text = subprocess.run(
        [_smg_binary(None), "launch", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    choices = {}
    for flag in ("--tool-call-parser", "--reasoning-parser"):
        found = re.search(re.escape(flag) + r" \{([^}]*)\}", text)
        assert found is not None, flag
        choices[flag] = set(found.group(1).split(","))
    for tool, reasoning in SMG_PARSERS.values():
        assert tool is None or tool in choices["--tool-call-parser"], tool
        assert reasoning is None or reasoning in choices["--reasoning-parser"], reasoning
