"""int8 weights with a scale per 32 inputs (GGUF's Q8_0 layout) through a compiled AVX2 kernel.

The lm_head of the `int4` and `int8` modes (`llama.make_lm_head`): a tied 49,152 x 576 embedding
streams 28 MB of int8 codes and 3.5 MB of fp32 scales a step here instead of bf16's 57 MB. A Q8_0
embedding (the embedded model's) lies on this grid already: `quantize_groups` recovers the file's
own codes and scales, so the head loses nothing against the GGUF.

Torch has no CPU kernel for this layout that is faster than bf16 on an AVX2 machine without VNNI
(docs/bench-offline.md: `_weight_int8pack_mm` holds one scale per row only and ran slower than bf16's
`F.linear`; dequantizing blocks of rows and running the fp32 GEMM was 10x slower), so a small C
kernel (kernels/q8_gemm.c) is compiled once with the system's C compiler (kernels/native.py) and
called through ctypes, which releases the GIL as torch's kernels do.

NOTE: the kernel is row-invariant by construction: every output sums its 18 groups of 32 products
in one fixed order (fp32 FMAs per group of 32, scaled into an 8-lane accumulator, then one fixed
horizontal sum) whatever the call's row count, the row's position in it or the thread count, so
a token's logits are bitwise the same in a decode step of any batch and in a prefill chunk. It
still runs behind `RowInvariant`, whose probe checks that at load like every projection's.
Activations go in as fp32 (bf16 converts exactly), logits come out fp32.
"""

from __future__ import annotations

import ctypes
import functools
import platform

import torch

from radixd.daemon.model.invariant import RowInvariant
from radixd.daemon.model.linear import dequantize_groups, quantize_groups
from radixd.kernels.native import cpu_flags, load

_SOURCE = "q8_gemm.c"
_FLAGS = ("-O2", "-mavx2", "-mfma", "-fopenmp")


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    """The loaded kernel, or None where it cannot run (not x86-64 with AVX2 and FMA, no compiler)."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= cpu_flags():
        return None
    lib = load(_SOURCE, _FLAGS, "the lm_head runs as before")
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.q8_gemm.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ctypes.c_int]
    lib.q8_gemm.restype = None
    return lib


def q8_available() -> bool:
    """Whether `Q8Linear` runs on this machine (x86-64 with AVX2 and FMA, and a C compiler)."""
    return _kernel() is not None


class Q8Linear:
    """int8 weights [out, in] with an fp32 scale per 32 inputs (`quantize_groups`); returns fp32.
    `weight` is the dequantized matrix in `dtype` (a tied embedding looks its rows up there)."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        lib = _kernel()
        if lib is None:
            raise RuntimeError("the int8 kernel needs an x86-64 CPU with AVX2 and FMA and a C compiler")
        if w_out_in.device.type != "cpu":
            raise ValueError(f"int8 weights run on CPU only, got {w_out_in.device}")
        self._gemm = lib.q8_gemm
        q, scale = quantize_groups(w_out_in)
        self.q, self.scale = q.contiguous(), scale.contiguous()
        self.weight = dequantize_groups(self.q, self.scale).to(dtype)
        self.bias = bias
        out_f, in_f = q.shape
        kind = "q8" if bias is None else "q8+bias"
        self._rows = RowInvariant(kind, self._kernel, in_f, out_f, dtype, q.device)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32).contiguous()
        out_f, in_f = self.q.shape
        if xf.dim() != 2 or xf.shape[1] != in_f:
            raise ValueError(f"expected [N, {in_f}] inputs, got {list(x.shape)}")
        y = torch.empty(xf.shape[0], out_f, dtype=torch.float32)
        if xf.shape[0]:
            self._gemm(
                xf.data_ptr(),
                xf.shape[0],
                in_f,
                self.q.data_ptr(),
                self.scale.data_ptr(),
                out_f,
                y.data_ptr(),
                torch.get_num_threads(),
            )
        return y if self.bias is None else y + self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)
