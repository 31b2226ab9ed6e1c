"""What every loader produces, the error it raises, and the device/dtype defaults."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixd.daemon.model import LlamaModel, LlamaWeights, ModelConfig
from radixd.daemon.model.int4 import on_int4_grid
from radixd.daemon.model.precision import Precision, precision_of_dtype, resolve_precision
from radixd.daemon.text.tokenizer import TextTokenizer


class ModelLoadError(Exception):
    """A model file or directory is missing, unreadable, corrupt or unsupported; the message names it."""


@dataclass
class ConvertedModel:
    """Weights in our fused fp32 layout (`LlamaWeights.tensors()` names) plus config and tokenizer."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    tokenizer: TextTokenizer


@dataclass
class LoadedModel:
    """A model ready to run: the decoder on its device plus tokenizer and where it came from."""

    model: LlamaModel
    tokenizer: TextTokenizer
    config: ModelConfig
    path: str


def default_dtype(device: str) -> torch.dtype:
    """fp32 on CPU; bf16 on CUDA when supported, else fp16."""
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def model_precision(
    device: str, dtype: torch.dtype | str | None, weights: LlamaWeights | None = None
) -> Precision:
    """What `dtype` asks for on `device`: a `--dtype` name, a torch dtype, or None (the default)."""
    if isinstance(dtype, str):

        def layers_on_int4_grid() -> bool:
            mats = (
                [m for lw in weights.layers for m in (lw.qkv, lw.o_proj, lw.gate_up, lw.down)]
                if weights
                else []
            )
            return bool(mats) and all(on_int4_grid(m) for m in mats)

        try:
            return resolve_precision(dtype, device, layers_on_int4_grid)
        except ValueError as e:
            raise ModelLoadError(str(e)) from e
    return precision_of_dtype(dtype or default_dtype(device))


def build_model(conv: ConvertedModel, path: str, device: str, dtype: torch.dtype | str | None) -> LoadedModel:
    """Build the model on `device` in the precision `dtype` names (see `model_precision`)."""
    weights = LlamaWeights.from_tensors(conv.tensors, conv.config.num_layers)
    prec = model_precision(device, dtype, weights)
    if weights.embed.shape != (conv.config.vocab_size, conv.config.hidden_size):
        raise ModelLoadError(
            f"{path}: embedding is {tuple(weights.embed.shape)}, config says "
            f"({conv.config.vocab_size}, {conv.config.hidden_size})"
        )
    model = LlamaModel(conv.config, weights, device, prec)
    return LoadedModel(model, conv.tokenizer, conv.config, path)
