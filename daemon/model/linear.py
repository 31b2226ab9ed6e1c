"""The model's projections (`y = x W^T + b`) in the layout and kernel each precision runs fastest.

fp32: `f32.py`'s compiled kernel, else oneDNN's packed inner product (`PackedLinear`), else `x @ W` over
[in, out] (`InOutLinear`). 16-bit: `F.linear`. int8: the bf16 GEMM over dequantized per-32 groups.
NOTE: every projection runs behind its load-time row-invariance plan (`invariant.py`), so a token
computes bitwise the same in any batch and in a prefill chunk."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from radixd.daemon.model.invariant import RowInvariant
from radixd.daemon.model.stored import Weight

# The batch size oneDNN packs the fp32 weights for: with 2 (not 1) every row count runs one kernel.
PACK_BATCH_HINT = 2


class Linear(Protocol):
    """A projection: [N, in] -> [N, out]. `weight`: the float matrix [out, in] it computes with
    (possibly a view); `bias`: [out] or None."""

    bias: torch.Tensor | None

    @property
    def weight(self) -> Weight:
        """The matrix it computes with: float rows, or a file's stored parts."""
        ...

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
    """Symmetric int8 per `group` inputs of a row -> (q int8 [out, in], scale fp32 [out, in / group]).

    Groups of 32 keep the quality contract (one scale per row does not) and match GGUF's blocks."""
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
        # NOTE: no one-row matrix-vector kernel: it sums in another order than the GEMM (batch-dependent).
        self._dense = dense(self.weight, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._dense(x)
