"""The model's projections (`y = x W^T + b`) in the layout and kernel each precision runs fastest.

- fp32 on an x86-64 CPU with AVX2 and FMA and a C compiler: the compiled kernel of `f32.py` over the
  plain [out, in] weights (one summation order for every row count, the weight stream's speed at 1 row),
  or over the GGUF Q4_1 / Q8_0 blocks they were expanded from (bitwise the same result, 6 or 9 bits
  streamed per weight instead of 32).
- fp32 where that cannot run and torch has oneDNN: oneDNN's inner product over the weights packed once
  at load into its blocked layout (`PackedLinear`): one kernel for every row count, no packing per call.
- fp32 otherwise: weights kept [in, out] and run as `x @ W` (`InOutLinear`): CPU GEMMs with a few rows
  ran up to 2x faster in that layout than `F.linear`'s [out, in].
- bf16 (and other 16-bit floats): [out, in] through `F.linear`, which reaches oneDNN's bf16 kernels
  (AVX512-BF16); `x @ W` with [in, out] bf16 weights measured up to 1.5x slower.
- int8: int8 weights [out, in] with an fp32 scale per 32 inputs of a row (symmetric, round to nearest),
  run as the bf16 GEMM over the dequantized weights for every row count. (The quantized modes' lm_head
  runs the same format through a compiled kernel instead: `q8.py`.)

NOTE: every projection is row-invariant (`invariant.py`): a row's result is bitwise the same whatever
the call's other rows and their number, so a token computes the same in a decode step of any batch and
in a prefill chunk. Each kernel runs behind the plan its load-time probe measured (oneDNN's packed fp32
kernel needs no padding on an AVX2 machine; MKL's `x @ W`, the fallback, pads calls of fewer than 12
rows to 12 there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from radixd.daemon.model.invariant import RowInvariant

# The batch size oneDNN lays the packed fp32 weights out for: with 2 (not 1) every row count runs one
# kernel on an AVX2 machine (measured: with 1, one-row calls take another kernel).
PACK_BATCH_HINT = 2


class Linear(Protocol):
    """A projection: [N, in] -> [N, out]. `weight`: the float matrix [out, in] it computes with
    (possibly a view); `bias`: [out] or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class InOutLinear:
    """fp32: `x @ W` over a contiguous [in, out] copy; `weight` is a [out, in] view of it."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.w = w_out_in.t().contiguous()
        self.weight = self.w.t()
        self.bias = bias
        kind = "mm" if bias is None else "addmm"
        in_f, out_f = self.w.shape
        self._rows = RowInvariant(kind, self._kernel, in_f, out_f, self.w.dtype, self.w.device)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w) if self.bias is None else torch.addmm(self.bias, x, self.w)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)


class PackedLinear:
    """fp32 through oneDNN's inner product over the weights reordered once, at load, into its blocked
    layout (`weight`: the [out, in] matrix as given)."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = w_out_in
        self.bias = bias
        self._packed = torch.ops.mkldnn._reorder_linear_weight(w_out_in, PACK_BATCH_HINT)
        out_f, in_f = w_out_in.shape
        kind = f"onednn{PACK_BATCH_HINT}" + ("" if bias is None else "+bias")
        self._rows = RowInvariant(kind, self._kernel, in_f, out_f, w_out_in.dtype, w_out_in.device)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self._packed, self.bias, "none", [], ""
        )
        return y

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)


class OutInLinear:
    """16-bit floats: `F.linear` over the [out, in] weight as given."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = w_out_in
        self.bias = bias
        out_f, in_f = w_out_in.shape
        kind = "linear" if bias is None else "linear+bias"
        self._rows = RowInvariant(kind, self._kernel, in_f, out_f, w_out_in.dtype, w_out_in.device)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)


GROUP = 32


def quantize_groups(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per `group` consecutive inputs of a row (round to nearest):
    w ~= q * scale[:, :, None] groupwise; -> (q int8 [out, in], scale fp32 [out, in / group]).

    NOTE: groups of 32 are what keeps the quality contract (docs/bench-offline.md): one scale per row
    measured 94% top-1 agreement with fp32, below the 95% the contract asks. GGUF's Q4/Q8 blocks are
    32 wide too, so their values land on the int8 grid with little further error."""
    out_f, in_f = w.shape
    if in_f % group:
        raise ValueError(f"int8 weights need in_features divisible by {group}, got {in_f}")
    g = w.float().reshape(out_f, in_f // group, group)
    scale = g.abs().amax(dim=2).clamp_min(1e-12) / 127.0
    q = torch.round(g / scale[:, :, None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(out_f, in_f), scale


def dequantize_groups(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 [out, in] from `quantize_groups`' output."""
    out_f, in_f = q.shape
    return (q.float().reshape(out_f, scale.shape[1], -1) * scale[:, :, None]).reshape(out_f, in_f)


class Int8Linear:
    """int8 weights [out, in] + fp32 scales per 32 inputs; `weight` is the dequantized matrix in
    `dtype`."""

    def __init__(
        self,
        w_out_in: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        dense: Callable[[torch.Tensor, torch.Tensor | None], Linear] = OutInLinear,
    ) -> None:
        """`dense` builds the projection that runs the dequantized weights."""
        self.q, self.scale = quantize_groups(w_out_in)
        self.weight = dequantize_groups(self.q, self.scale).to(dtype)
        self.bias = bias
        # NOTE: a one-row int8 matrix-vector kernel (a quarter of fp32's bytes) was faster at batch 1
        # but sums in another order than the GEMM: a token's result then depended on its batch.
        self._dense = dense(self.weight, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._dense(x)
