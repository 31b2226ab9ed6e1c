"""The model's projections (`y = x W^T + b`) in the layout and kernel each precision runs fastest.

- fp32: weights kept [in, out] and run as `x @ W`: CPU GEMMs with a few rows (decode batches) run up
  to 2x faster in that layout than `F.linear`'s [out, in] in fp32.
- bf16 (and other 16-bit floats): [out, in] through `F.linear`, which reaches oneDNN's bf16 kernels
  (AVX512-BF16); `x @ W` with [in, out] bf16 weights measured up to 1.5x slower.
- int8: int8 weights [out, in] with an fp32 scale per 32 inputs of a row (symmetric, round to nearest).
  A one-row input (batch-1 decode) streams the int8 weights through a kernel that torch.compile
  generates (dequantize, multiply, reduce in fp32: a quarter of fp32's bytes); more rows run the bf16
  GEMM over the dequantized weights, which the matrix-vector kernel loses to from 2 rows on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F


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

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w) if self.bias is None else torch.addmm(self.bias, x, self.w)


class OutInLinear:
    """16-bit floats: `F.linear` over the [out, in] weight as given."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = w_out_in
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


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


def _int8_matvec(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # Written as a broadcast-multiply-reduce so inductor emits one fused vectorized loop that reads
    # each int8 weight once; a matmul here would make it materialize the dequantized matrix first.
    n, k = q.shape
    g = k // GROUP
    w = q.reshape(n, g, GROUP).float() * scale.reshape(n, g, 1)
    return (x.float().reshape(1, g, GROUP) * w).sum((-1, -2)).reshape(1, n).to(x.dtype)


@functools.cache
def compiled_int8_matvec() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The compiled kernel for one-row inputs (compiled on the first call)."""
    # NOTE: dynamic=True: one graph serves every weight shape. Static shapes compile one graph per
    # shape, and dynamo's recompile limit (8 per function) is soon reached with several models in
    # one process; the dynamic loops measured as fast (the 32-wide inner loop stays static).
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = torch.compile(
        _int8_matvec, dynamic=True, fullgraph=True
    )
    return fn


class Int8Linear:
    """int8 weights [out, in] + fp32 scales per 32 inputs; `weight` is the dequantized matrix in
    `dtype`."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.q, self.scale = quantize_groups(w_out_in)
        self.weight = dequantize_groups(self.q, self.scale).to(dtype)
        self.bias = bias
        self._matvec = compiled_int8_matvec()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 1:
            return F.linear(x, self.weight, self.bias)
        y = self._matvec(x, self.q, self.scale)
        return y if self.bias is None else y + self.bias
