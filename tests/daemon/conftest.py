"""Fixtures of the model tests: the transformers reference model, built from the same GGUF by
transformers' own GGUF reader, and its greedy outputs. The radixd model itself is tests/conftest.py's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from daemon_testkit import PROMPTS, hf_generate
from tiny_models import write_tiny_gemma3

from radixd.daemon.loaders import LoadedModel, default_model_path, load_model


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for a module of many tiny ops, where a second thread only adds overhead."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


@pytest.fixture(scope="session")
def hf_greedy(hf_smollm: Any, prompt_ids: list[list[int]]) -> list[list[int]]:
    """transformers' greedy 32 new tokens for every prompt."""
    return [hf_generate(hf_smollm, p, 32) for p in prompt_ids]


@pytest.fixture(scope="session")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """A random-weight Gemma 3 with sliding (window: 8 tokens) and full layers (the windowed KV layout),
    fp32 on the CPU."""
    layers = [
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ]
    path = write_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3"), layers, 8)
    return load_model(str(path), "cpu", "float32")
