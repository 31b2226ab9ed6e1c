"""int8 weights with a scale per 32 inputs (GGUF's Q8_0 layout), run by the compiled fp32 kernels.

The lm_head of the `int4` and `int8` modes (a Q8_0 embedding's own codes are recovered exactly), via
`radixd_gemm`'s Q8_0 kind (`f32.Gemm`): torch has no faster CPU kernel for this layout.
NOTE: row-invariant by construction (one summation order), still behind `RowInvariant`'s probe."""

from __future__ import annotations

import torch

from radixd.daemon.model.f32 import Gemm, f32_available, library
from radixd.daemon.model.invariant import RowInvariant
from radixd.daemon.model.linear import dequantize_groups, quantize_groups


def q8_available() -> bool:
    """Whether `Q8Linear` runs on this machine (that of `f32.f32_available`)."""
    return f32_available()


class Q8Linear:
    """int8 weights [out, in], an fp32 scale per 32 inputs, fp32 out; `weight`: dequantized, in `dtype`."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        lib = library()
        if lib is None:
            raise RuntimeError("the int8 kernel needs an x86-64 CPU with AVX2, FMA and F16C and a C compiler")
        if w_out_in.device.type != "cpu":
            raise ValueError(f"int8 weights run on CPU only, got {w_out_in.device}")
        q, scale = quantize_groups(w_out_in)
        self.q, self.scale = q.contiguous(), scale.contiguous()
        self._gemm = Gemm("q8_0", [self.q, self.scale], bias, self.q.shape)
        self.weight = dequantize_groups(self.q, self.scale).to(dtype)
        self.bias = bias
        out_f, in_f = q.shape
        kind = "q8" if bias is None else "q8+bias"
        self._rows = RowInvariant(kind, self._kernel, in_f, out_f, dtype, q.device)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return self._gemm(x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)
