"""int8 weights with a scale per 32 inputs (GGUF's Q8_0 layout), run by the compiled fp32 kernels.

The lm_head of the `int4` and `int8` modes (`llama.make_lm_head`): a tied 49,152 x 576 embedding
streams 28 MB of int8 codes and 3.5 MB of fp32 scales a step here instead of bf16's 57 MB. A Q8_0
embedding (the embedded model's) lies on this grid already: `quantize_groups` recovers the file's
own codes and scales, so the head loses nothing against the GGUF.

Torch has no CPU kernel for this layout that is faster than bf16 on an AVX2 machine without VNNI
(docs/bench-offline.md: `_weight_int8pack_mm` holds one scale per row only and ran slower than bf16's
`F.linear`; dequantizing blocks of rows and running the fp32 GEMM was 10x slower), so it runs
`radixd_gemm`'s Q8_0 kind (kernels/f32_gemm.c, through `f32.Gemm`): a block of rows expanded to fp32
(q * scale) into a per-thread buffer, then the fp32 tiles.

NOTE: row-invariant by construction, as every call of that library: each output sums in one fixed
order whatever the call's row count, the row's position or the thread count, so a token's logits
are bitwise the same in a decode step of any batch and in a prefill chunk. It still runs behind
`RowInvariant`, whose probe checks that at load like every projection's. Activations go in as fp32
(bf16 converts exactly), logits come out fp32.
"""

from __future__ import annotations

import torch

from radixd.daemon.model.f32 import Gemm, f32_available, library
from radixd.daemon.model.invariant import RowInvariant
from radixd.daemon.model.linear import dequantize_groups, quantize_groups


def q8_available() -> bool:
    """Whether `Q8Linear` runs on this machine (that of `f32.f32_available`)."""
    return f32_available()


class Q8Linear:
    """int8 weights [out, in] with an fp32 scale per 32 inputs (`quantize_groups`); returns fp32.
    `weight` is the dequantized matrix in `dtype` (a tied embedding looks its rows up there)."""

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
