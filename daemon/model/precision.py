"""Execution precisions (`--dtype`): how weights are held and executed, and the activation/KV dtype.

- ``float32``: the reference mode; fp32 weights, activations and KV cache.
- ``bfloat16``: bf16 weights, activations and KV cache (oneDNN's bf16 GEMMs on CPUs with AVX512-BF16).
- ``int8``: ``bfloat16`` plus int8 weights with an fp32 scale per 32 inputs of a row, run as the bf16
  GEMM on the dequantized weights (it saves memory, not time); the lm_head as ``int4``'s.
- ``int4``: ``bfloat16`` plus 4-bit weights in GGUF's Q4_1 layout (group 32, scale and minimum),
  executed by torch's packed int4 CPU kernel for every row count (`int4.py`). On a Q4_1 GGUF (the
  embedded model) these are the file's own 4-bit codes. The lm_head is int8 per 32 inputs (`q8.py`;
  a Q8_0 head, the embedded model's, held exactly) where that kernel runs (x86-64 with AVX2 and FMA
  and a C compiler), else bf16.
- ``w4a8``: ``float32`` activations between projections, with the projections that a GGUF stores in
  Q4_1 / Q8_0 blocks (the embedded model's layers and head) run as those blocks times activations
  quantized to 8 bits per 32 inputs, in integer dot products, as llama.cpp runs them (`f32.py`,
  kernels/a8_gemm.c); other weights stay fp32. Its KV cache is float16 (llama.cpp's default too):
  half the bytes a long context's attention reads each step, widened exactly to fp32 on load.
- ``auto``: the fastest of these that meets the quality contract (docs/bench-offline.md) on the
  machine. When the layers' weights lie on the 4-bit grid already (a Q4_0 / Q4_1 / Q4_K GGUF, whose
  own codes it then runs): ``w4a8`` where its kernels build (x86-64 with AVX2, FMA and F16C, a C
  compiler), else ``int4`` on CPUs with native bf16 (AVX512-BF16, AMX). Other weights: ``bfloat16``
  on CPUs with native bf16, else ``float32``. On CUDA GPUs ``bfloat16`` where supported. ``int8`` is
  never faster than ``bfloat16``, so `auto` skips it.

Every mode's projections are row-invariant (`invariant.py`): a row's result does not depend on the
other rows of its step.

The flag's default is `auto`, or $RADIXD_DTYPE when set (the test suite pins the reference mode so).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from radixd.daemon.model.f32 import f32_available
from radixd.kernels.native import cpu_flags

WeightFormat = Literal["float", "int8", "int4"]


@dataclass(frozen=True)
class Precision:
    """One execution mode: `dtype` is the activations' and the float weights', `kv_dtype` the KV
    cache's; `weights` how the layers' projection matrices are held ("float": in `dtype`)."""

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


def resolve_precision(name: str, device: str, on_int4_grid: Callable[[], bool] = lambda: False) -> Precision:
    """The `Precision` for a `--dtype` value on `device` (`auto` resolved for this machine and, through
    `on_int4_grid`, asked only then, for whether the model's weights are exactly 4-bit already)."""
    if name != "auto":
        if name not in PRECISIONS:
            raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPE_CHOICES)})")
        p = PRECISIONS[name]
        if (p.weights != "float" or p.activations != "float") and not device.startswith("cpu"):
            raise ValueError(f"dtype {name} runs on CPU only; use bfloat16 on GPUs")
        if p.activations == "int8" and not f32_available():
            raise ValueError(f"dtype {name} needs an x86-64 CPU with AVX2, FMA and F16C and a C compiler")
        return p
    if device.startswith("cuda"):
        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return PRECISIONS["bfloat16" if bf16 else "float32"]
    # NOTE: 4-bit layers (the file's own codes) run as w4a8 wherever its kernels build, native bf16 or
    # not: on an AVX512-BF16 CPU (Zen 4) it decodes 2.1x int4's tokens/s at batch 1 and 1.5x at 64
    # (docs/bench-offline.md); int4 is the pick only where w4a8 cannot run.
    four_bit = on_int4_grid()
    if four_bit and f32_available():
        return PRECISIONS["w4a8"]
    # NOTE: without native bf16, oneDNN emulates it and fp32 activations are the faster ones.
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
    "w4a8 (a GGUF's Q4_1 / Q8_0 blocks times 8-bit activations, fp32 elsewhere, f16 KV; CPU), "
    "auto (the fastest that meets the quality contract here); default: $RADIXD_DTYPE or auto"
)
