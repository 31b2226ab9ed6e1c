"""Execution precisions (`--dtype`): how weights are held and executed, and the activation/KV dtype.

``float32`` (reference), ``bfloat16``, ``int8`` (bf16 over dequantized int8; memory, not time), ``int4``
(GGUF Q4_1 codes, `int4.py`), ``w4a8`` (a GGUF's blocks as stored x 8-bit activations, f16 KV),
``auto`` (the fastest meeting the quality contract here; the default, or $RADIXD_DTYPE). Every mode's
projections are row-invariant."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from radixd.daemon.model.f32 import f32_available
from radixd.kernels.dispatch import host_kernels
from radixd.kernels.native import cpu_flags

WeightFormat = Literal["float", "int8", "int4"]


@dataclass(frozen=True)
class Precision:
    """One execution mode: activation `dtype`, `kv_dtype`, and how projection `weights` are held."""

    name: str
    dtype: torch.dtype
    kv_dtype: torch.dtype
    weights: WeightFormat = "float"
    # "int8": projections held in GGUF blocks multiply 8-bit activations (w4a8); else `dtype`'s
    activations: Literal["float", "int8"] = "float"


PRECISIONS: dict[str, Precision] = {
    "float32": Precision("float32", torch.float32, torch.float32),
    "bfloat16": Precision("bfloat16", torch.bfloat16, torch.bfloat16),
    "int8": Precision("int8", torch.bfloat16, torch.bfloat16, weights="int8"),
    "int4": Precision("int4", torch.bfloat16, torch.bfloat16, weights="int4"),
    "w4a8": Precision("w4a8", torch.float32, torch.float16, activations="int8"),
}
DTYPE_CHOICES = ("auto", *PRECISIONS)


def precision_of_dtype(dtype: torch.dtype) -> Precision:
    """The plain (not quantized) mode executing in `dtype`."""
    for p in PRECISIONS.values():
        if p.dtype == dtype and p.weights == "float" and p.activations == "float":
            return p
    return Precision(str(dtype).removeprefix("torch."), dtype, dtype)


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU executes bf16 dot products natively (AVX512-BF16 or AMX-BF16; Linux flags)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def resolve_precision(name: str, device: str, quantized: Callable[[], bool] = lambda: False) -> Precision:
    """The `Precision` for a `--dtype` value on `device`; `quantized` (asked only for `auto`): whether
    the layers' weights are quantized already (a GGUF's blocks, or floats on the 4-bit grid)."""
    if name != "auto":
        if name not in PRECISIONS:
            raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPE_CHOICES)})")
        p = PRECISIONS[name]
        if (p.weights != "float" or p.activations != "float") and not host_kernels(device):
            raise ValueError(f"dtype {name} runs on CPU only; use bfloat16 on GPUs")
        if p.activations == "int8" and not f32_available():
            raise ValueError(f"dtype {name} needs an x86-64 CPU with AVX2, FMA and F16C and a C compiler")
        return p
    if not host_kernels(device):  # a GPU, or its kernels on the CPU's interpreter (float32: no bf16 there)
        bf16 = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return PRECISIONS["bfloat16" if bf16 else "float32"]
    # Quantized layers run as w4a8 wherever its kernels build (faster than int4 even with native bf16).
    four_bit = quantized()
    if four_bit and f32_available():
        return PRECISIONS["w4a8"]
    # Without native bf16, oneDNN emulates it and fp32 activations are the faster ones.
    if not cpu_has_native_bf16():
        return PRECISIONS["float32"]
    # NOTE: int4 only where it loses nothing: re-quantizing other weights to 4 bits is a model change.
    return PRECISIONS["int4" if four_bit else "bfloat16"]


def default_dtype_name() -> str:
    """The `--dtype` default: $RADIXD_DTYPE if set, else "auto"."""
    return os.environ.get("RADIXD_DTYPE") or "auto"


DTYPE_HELP = (
    "weights' execution mode, which also sets the KV cache dtype: float32 (reference; fp32 KV), "
    "bfloat16 (bf16 weights, activations and KV), int8 (int8 weights, bf16 activations and KV; CPU), "
    "int4 (GGUF Q4_1-style 4-bit weights, bf16 activations and KV; CPU), "
    "w4a8 (a GGUF's quantized blocks as the file stores them times 8-bit activations, fp32 elsewhere, "
    "f16 KV; CPU), "
    "auto (the fastest that meets the quality contract here); default: $RADIXD_DTYPE or auto"
)
