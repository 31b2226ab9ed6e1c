"""The family of a model path (GGUF file or Hugging Face directory), from its metadata alone.

A GGUF's header is walked for its scalar keys (arrays such as the vocabulary are skipped, never
decoded) and a directory's config.json is read; no tensor is touched, so this is cheap before a load.
Families: "llama3", "llama" (Llama 2, TinyLlama, SmolLM...), "mistral", "qwen2" (Qwen2 / 2.5), "qwen3",
"qwen3-instruct" and "qwen3-thinking" (the 2507 releases), "gemma3", "functiongemma", else the
architecture as the file names it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from radixd.daemon.loaders.common import ModelLoadError
from radixd.daemon.loaders.gguf_header import GGUFFormatError, GGUFHeader

Scalar = str | int | float | bool


def gguf_scalars(path: str) -> dict[str, Scalar]:
    """The scalar metadata of a GGUF file (arrays skipped, never decoded)."""
    try:
        header = GGUFHeader(path, arrays=False)
    except FileNotFoundError as e:
        raise ModelLoadError(f"model file not found: {path}") from e
    except (GGUFFormatError, OSError) as e:
        raise ModelLoadError(f"{path} is not a GGUF file: {e}") from e
    return {k: v for k, v in header.fields.items() if isinstance(v, (str, int, float, bool))}


def _family(arch: str, name: str, llama3_vocab: bool) -> str:
    name = name.lower()
    if arch in ("qwen3", "qwen3moe"):
        for variant in ("thinking", "instruct"):
            if f"{variant}-2507" in name or f"{variant} 2507" in name:
                return f"qwen3-{variant}"
        return "qwen3"
    if arch in ("qwen2", "qwen2moe"):
        return "qwen2"
    if arch in ("mistral", "mistral3") or (arch == "llama" and re.search(r"mi[sx]tral", name)):
        return "mistral"
    if arch == "llama":
        return "llama3" if llama3_vocab or re.search(r"llama[-_ ]?3", name) else "llama"
    if arch.startswith("gemma3"):
        return "functiongemma" if "functiongemma" in name.replace(" ", "") else "gemma3"
    return arch


def model_family(path: str) -> str:
    """The family of the model at `path` (see the module docstring)."""
    p = Path(path)
    if p.is_dir():
        try:
            cfg = json.loads((p / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot read {p / 'config.json'}: {e}") from e
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        llama3 = rope.get("rope_type") == "llama3" or int(cfg.get("vocab_size") or 0) >= 128000
        name = str(cfg.get("_name_or_path") or p.resolve().name)
        return _family(str(cfg.get("model_type", "")), name, llama3)
    meta = gguf_scalars(path)
    arch = str(meta.get("general.architecture", ""))
    name = " ".join(str(meta.get(k, "")) for k in ("general.name", "general.basename", "general.finetune"))
    llama3 = meta.get("tokenizer.ggml.pre") in ("llama-bpe", "llama3", "llama-v3")
    return _family(arch, name, llama3)
