"""Row-invariant fp32 projections through the native library's `radixd_gemm` (kernels/f32_gemm.c).

The float32 mode runs every projection and the lm_head here (`llama.make_linear`): torch's fp32 CPU
kernels are not row-invariant (docs/measurements/batch-invariance-cost.md). A GGUF's Q4_1 / Q8_0 weights
stay those blocks (recovered from the fp32 matrix at load, checked bit for bit), expanded right before
the tiles read them: bitwise the fp32 result. The w4a8 mode multiplies the same blocks by int8
activations (`int8_activations`; kernels/a8_gemm.c): not the fp32 product. Other weights run as fp32.
NOTE: each output sums in a fixed order whatever the row count, position or thread count: row-invariant
by construction (tests/daemon/test_f32.py, tests/kernels), so unlike torch's kernels not probed at load.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Sequence

import torch

from radixd.daemon.model.linear import GROUP
from radixd.kernels import native
from radixd.kernels.native import Proj, Weights, cpu_flags


def library() -> ctypes.CDLL | None:
    """The native library where its projections run (x86-64 with AVX2, FMA and F16C), else None."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma", "f16c"} <= cpu_flags():
        return None
    return native.library()


def _blocks(lib: ctypes.CDLL, w: torch.Tensor) -> tuple[str, list[torch.Tensor]] | None:
    """The GGUF blocks `w` expands from bit for bit: ("q4_1", [codes, d, m]) or ("q8_0", [codes, d]);
    None for other weights."""
    out_f, in_f = w.shape
    if in_f % GROUP or not out_f:
        return None
    d = torch.empty(out_f, in_f // GROUP)
    mn = torch.empty_like(d)
    nib = torch.empty(out_f, in_f // 2, dtype=torch.uint8)
    if lib.radixd_q4_1_encode(w.data_ptr(), out_f, in_f, nib.data_ptr(), d.data_ptr(), mn.data_ptr()):
        return "q4_1", [nib, d, mn]
    q8 = torch.empty(out_f, in_f, dtype=torch.int8)
    if lib.radixd_q8_0_encode(w.data_ptr(), out_f, in_f, q8.data_ptr(), d.data_ptr()):
        return "q8_0", [q8, d]
    return None


def f32_available() -> bool:
    """Whether `F32Linear` runs on this machine (x86-64 with AVX2, FMA and F16C, and a C compiler)."""
    return library() is not None


class Gemm:
    """y = x W^T + b through `radixd_gemm` over weights stored as `coding` (a `Weights` name, lower
    case): `operands` are the weights or codes, then the scales and minimums, as radixd.h's
    `radixd_weights` lists them; `shape`: W's (out, in). It keeps every tensor it points to."""

    def __init__(
        self,
        coding: str,
        operands: Sequence[torch.Tensor],
        bias: torch.Tensor | None,
        shape: Sequence[int],
        then: Gemm | None = None,
    ) -> None:
        """`then`: the next part of a chained projection (its outputs follow these; same inputs)."""
        lib = library()
        if lib is None:
            raise RuntimeError(
                "the projection kernels need an x86-64 CPU with AVX2, FMA and F16C, and a compiler"
            )
        self._fn = lib.radixd_gemm
        self._rows_fn = lib.radixd_dequantize_rows
        self.operands = list(operands)
        self._bias = None if bias is None else bias.to(torch.float32).contiguous()
        w, d, mn = [t.data_ptr() for t in operands] + [0] * (3 - len(operands))
        bias_ptr = 0 if self._bias is None else self._bias.data_ptr()
        self.proj = Proj(Weights[coding.upper()], w, d, mn, bias_ptr, *shape)
        self.then = then
        self.width: int = int(shape[0]) + (then.width if then is not None else 0)
        if then is not None:
            if then.proj.k != self.proj.k:
                raise ValueError(f"chained parts take {self.proj.k} and {then.proj.k} inputs")
            self.proj.next = ctypes.pointer(then.proj)

    def __call__(self, x: torch.Tensor, threads: int = 0) -> torch.Tensor:
        """x: [N, in] of any float dtype (bf16 converts exactly) -> [N, out] fp32, on `threads`
        threads (0: torch's)."""
        out_f, in_f = self.width, self.proj.k
        if x.dim() != 2 or x.shape[1] != in_f:
            raise ValueError(f"expected [N, {in_f}] inputs, got {list(x.shape)}")
        xf = x.to(torch.float32).contiguous()
        y = torch.empty(xf.shape[0], out_f, dtype=torch.float32)
        rows, threads = xf.shape[0], threads or torch.get_num_threads()
        rc = self._fn(ctypes.byref(self.proj), xf.data_ptr(), rows, y.data_ptr(), threads) if rows else 0
        if rc == -2:
            raise RuntimeError(f"the native library does not run {Weights(self.proj.kind).name} weights")
        if rc:
            raise MemoryError("the projection kernel could not allocate its buffer")
        return y

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (int [T]) of this part's W as fp32 [T, in]: the weights its kernels multiply by."""
        idx = ids.to(torch.int64).contiguous()
        n = int(self.proj.n)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise IndexError(f"row ids must lie in [0, {n})")
        out = torch.empty(idx.numel(), int(self.proj.k))
        rc = self._rows_fn(ctypes.byref(self.proj), idx.data_ptr(), idx.numel(), out.data_ptr())
        if rc:
            raise RuntimeError(f"the native library does not dequantize {Weights(self.proj.kind).name} rows")
        return out


class F32Linear:
    """fp32 `y = x W^T + b` over the [out, in] weight as given (`weight` is that very tensor), run from
    its GGUF blocks where it has them and `gguf_blocks` allows (`coding`: "q4_1", "q8_0" or "f32"),
    with `int8_activations` those blocks times 8-bit activations ("q4_1_a8", "q8_0_a8")."""

    def __init__(
        self,
        w_out_in: torch.Tensor,
        bias: torch.Tensor | None,
        gguf_blocks: bool = True,
        int8_activations: bool = False,
    ) -> None:
        lib = library()
        if lib is None:
            raise RuntimeError("the fp32 kernel needs an x86-64 CPU with AVX2 and FMA and a C compiler")
        if w_out_in.device.type != "cpu" or w_out_in.dtype != torch.float32:
            raise ValueError(f"F32Linear runs fp32 weights on CPU, got {w_out_in.dtype} on {w_out_in.device}")
        self.weight = w_out_in.contiguous()
        self.bias = bias
        blocks = _blocks(lib, self.weight) if gguf_blocks else None
        self.coding, operands = blocks if blocks is not None else ("f32", [self.weight])
        if int8_activations and blocks is not None:
            self.coding += "_a8"
            # The a8 kernels read the scales (and minimums) as the fp16 values they are (the encoder
            # keeps only blocks whose scales are fp16 values): fewer bytes streamed a step.
            codes, *scales = operands
            halves = [t.half() for t in scales]
            assert all(torch.equal(h.float(), t) for h, t in zip(halves, scales, strict=True))
            operands = [codes, *halves]
        self.gemm = Gemm(self.coding, operands, bias, self.weight.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: row-invariant by construction (radixd.h; tests/daemon/test_f32.py), so not probed.
        return self.gemm(x)


class Widened16Linear:
    """16-bit weights computed by `F32Linear` over their exact fp32 values, rounded to their dtype (bias
    added in fp32 first, as `F.linear` does), for CPUs without native bf16 (AVX512-BF16 / AMX): there
    oneDNN's emulated 16-bit GEMM sums in an order that depends on the row count, which the bf16 rounding
    hides from `invariant.py`'s probe. Holds an fp32 copy of the weights (such CPUs never pick 16-bit)."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = w_out_in
        self.bias = bias
        wide_bias = None if bias is None else bias.float()
        self._f32 = F32Linear(w_out_in.float(), wide_bias, gguf_blocks=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._f32(x).to(self.weight.dtype)
