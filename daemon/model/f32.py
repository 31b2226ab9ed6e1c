"""fp32 projections through a compiled kernel with one summation order for every row count.

The float32 mode (`auto` on a CPU without AVX512-BF16 / AMX, and the reference that equals
transformers) runs every projection and the lm_head here (`llama.make_linear`). Torch's fp32 CPU
kernels are fast but not row-invariant the way radixd needs (docs/batch-invariance-cost.md): MKL's
GEMM changes kernel below 4 rows, and oneDNN's inner product, invariant over weights packed for
batch 2, runs a one-row call at about half the speed of the weight stream. This kernel
(kernels/f32_gemm.c, compiled once by kernels/native.py, called through ctypes, which releases the
GIL) reads the plain [out, in] weights: a one-row call streams them at the memory's speed, and
tiles of up to 4 rows reach MKL's GEMM speed on prefill chunks (bench/projections_ab.py).

NOTE: row-invariant by construction: each output sums its products in 8 lanes over k in increasing
order, then one fixed horizontal sum, whatever the row count, the row's position or the thread
count. It still runs behind `RowInvariant`, whose probe checks that at load like every projection's.
"""

from __future__ import annotations

import ctypes
import functools
import platform

import torch

from radixd.daemon.model.invariant import RowInvariant
from radixd.kernels.native import cpu_flags, load

_SOURCE = "f32_gemm.c"
# -O3: the tiles' loops over their constant row and output counts must unroll for the accumulators to
# stay in registers.
_FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    """The loaded kernel, or None where it cannot run (not x86-64 with AVX2 and FMA, no compiler)."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= cpu_flags():
        return None
    lib = load(_SOURCE, _FLAGS, "fp32 projections run through oneDNN")
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.f32_gemm.argtypes = [ptr, i64, i64, ptr, i64, ptr, ctypes.c_int]
    lib.f32_gemm.restype = None
    return lib


def f32_available() -> bool:
    """Whether `F32Linear` runs on this machine (x86-64 with AVX2 and FMA, and a C compiler)."""
    return _kernel() is not None


class F32Linear:
    """fp32 `y = x W^T + b` over the [out, in] weight as given (`weight` is that very tensor)."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
        lib = _kernel()
        if lib is None:
            raise RuntimeError("the fp32 kernel needs an x86-64 CPU with AVX2 and FMA and a C compiler")
        if w_out_in.device.type != "cpu" or w_out_in.dtype != torch.float32:
            raise ValueError(f"F32Linear runs fp32 weights on CPU, got {w_out_in.dtype} on {w_out_in.device}")
        self._gemm = lib.f32_gemm
        self.weight = w_out_in.contiguous()
        self.bias = bias
        out_f, in_f = self.weight.shape
        kind = "f32" if bias is None else "f32+bias"
        self._rows = RowInvariant(kind, self._kernel, in_f, out_f, torch.float32, self.weight.device)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32).contiguous()
        out_f, in_f = self.weight.shape
        if xf.dim() != 2 or xf.shape[1] != in_f:
            raise ValueError(f"expected [N, {in_f}] inputs, got {list(x.shape)}")
        y = torch.empty(xf.shape[0], out_f, dtype=torch.float32)
        if xf.shape[0]:
            self._gemm(
                xf.data_ptr(),
                xf.shape[0],
                in_f,
                self.weight.data_ptr(),
                out_f,
                y.data_ptr(),
                torch.get_num_threads(),
            )
        return y if self.bias is None else y + self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)
