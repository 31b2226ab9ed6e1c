"""Shared fixtures: one loaded SmolLM2 per session (converted into a session cache folder) and the
transformers reference model built from the same GGUF by transformers' own GGUF reader."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from daemon_testkit import PROMPTS

from radixd.daemon.loaders import LoadedModel, default_model_path, load_model


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private conversion cache for the session (never the user's ~/.cache)."""
    d = tmp_path_factory.mktemp("radixd-cache")
    old = os.environ.get("RADIXD_CACHE_DIR")
    os.environ["RADIXD_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("RADIXD_CACHE_DIR", None)
    else:
        os.environ["RADIXD_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def smollm(model_cache_dir: Path) -> LoadedModel:
    t0 = time.perf_counter()
    lm = load_model()
    lm.first_load_s = time.perf_counter() - t0  # type: ignore[attr-defined]
    return lm


@pytest.fixture(scope="session")
def prompt_ids(smollm: LoadedModel) -> list[list[int]]:
    return [smollm.tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="session")
def hf_smollm() -> Any:
    """transformers' LlamaForCausalLM with weights from transformers' GGUF reader (fp32)."""
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = default_model_path()
    cfg = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    model = LlamaForCausalLM(cfg).eval()
    parsed = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)
    model.load_state_dict(parsed["tensors"], strict=False)
    model.tie_weights()
    model.generation_config.eos_token_id = None
    return model


def hf_generate(model: Any, prompt: list[int], n_new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_new,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :].tolist()]


@pytest.fixture(scope="session")
def hf_greedy(hf_smollm: Any, prompt_ids: list[list[int]]) -> list[list[int]]:
    """transformers' greedy 32 new tokens for every prompt."""
    return [hf_generate(hf_smollm, p, 32) for p in prompt_ids]
