"""What every loader produces, the error it raises, and the device/dtype defaults."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixd.daemon.model import LlamaModel, LlamaWeights, ModelConfig
from radixd.daemon.model.int4 import on_int4_grid
from radixd.daemon.model.precision import Precision, precision_of_dtype, resolve_precision
from radixd.daemon.model.quant import is_quantized
from radixd.daemon.model.stored import Weight
from radixd.daemon.text.tokenizer import TextTokenizer


class ModelLoadError(Exception):
    """A model file or directory is missing, unreadable, corrupt or unsupported; the message names it."""


@dataclass
class ConvertedModel:
    """Weights in our fused layout (`LlamaWeights.tensors()` names; matrices as float rows or as the
    file stores them) plus config and tokenizer."""

    config: ModelConfig
    tensors: dict[str, Weight]
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

        def quantized_layers() -> bool:
            mats = (
                [m for lw in weights.layers for m in (lw.qkv, lw.o_proj, lw.gate_up, lw.down)]
                if weights
                else []
            )
            if mats and all(isinstance(m, tuple) for m in mats):  # a GGUF's matrices as stored
                return any(is_quantized(m) for m in mats if isinstance(m, tuple))
            return bool(mats) and all(isinstance(m, torch.Tensor) and on_int4_grid(m) for m in mats)

        try:
            return resolve_precision(dtype, device, quantized_layers)
        except ValueError as e:
            raise ModelLoadError(str(e)) from e
    return precision_of_dtype(dtype or default_dtype(device))


def build_model(conv: ConvertedModel, path: str, device: str, dtype: torch.dtype | str | None) -> LoadedModel:
    """Build the model on `device` in the precision `dtype` names (see `model_precision`)."""
    weights = LlamaWeights.from_tensors(conv.tensors, conv.config.num_layers)
    prec = model_precision(device, dtype, weights)
    embed = weights.embed[0].shape if isinstance(weights.embed, tuple) else tuple(weights.embed.shape)
    if embed != (conv.config.vocab_size, conv.config.hidden_size):
        raise ModelLoadError(
            f"{path}: embedding is {embed}, config says ({conv.config.vocab_size}, {conv.config.hidden_size})"
        )
    model = LlamaModel(conv.config, weights, device, prec)
    return LoadedModel(model, conv.tokenizer, conv.config, path)
