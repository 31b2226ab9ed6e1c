"""4-bit weights in the GGUF Q4_1 layout (`w = q * d + m` per 32 inputs), run by torch's int4 CPU kernel
as `(q - 8) * scale + zero` with bf16 scales (its fast path); Q4_1-sourced weights keep the file's codes.
NOTE: every row count runs this one kernel (behind `invariant.py`'s plan), never a bf16 GEMM for
prefill, so prefill and decode agree bitwise."""

from __future__ import annotations

import torch

from radixd.daemon.model.invariant import RowInvariant

GROUP = 32


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1-style 4-bit codes per `group` inputs -> (q int32 [out, in], d, m fp32 [out, in / group])."""
    out_f, in_f = w.shape
    if in_f % group:
        raise ValueError(f"int4 weights need in_features divisible by {group}, got {in_f}")
    g = w.float().reshape(out_f, in_f // group, group)
    lo, hi = torch.aminmax(g, dim=2, keepdim=True)
    d = (hi - lo) / 15.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = (g - lo).mul_(inv).round_().clamp_(0, 15).to(torch.int32)
    return q.reshape(out_f, in_f), d.squeeze(2), lo.squeeze(2)


def scales_and_zeros(d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's [in / group, out, 2] table of (scale, zero) for `w = (q - 8) * scale + zero`."""
    return torch.stack((d, m + 8.0 * d), dim=-1).transpose(0, 1).contiguous().to(dtype)


def dequantize_int4(q: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    """fp32 [out, in] from codes and a `scales_and_zeros` table, as the kernel computes them."""
    out_f, in_f = q.shape
    s = sz[:, :, 0].float().t()[:, :, None]
    z = sz[:, :, 1].float().t()[:, :, None]
    w = torch.addcmul(z, q.reshape(out_f, in_f // GROUP, GROUP).float().sub_(8.0), s)
    return w.reshape(out_f, in_f)


def on_int4_grid(w: torch.Tensor, rows: int = 64) -> bool:
    """Whether `w`'s groups are 4-bit already (`quantize_int4` exact), judged on `rows` sampled rows."""
    if w.dim() != 2 or w.shape[1] % GROUP:
        return False
    sample = w[:: max(1, w.shape[0] // rows)].float()
    q, d, m = quantize_int4(sample)
    back = dequantize_int4(q, scales_and_zeros(d, m, torch.float32))
    return bool(((back - sample).abs() <= 1e-5 * sample.abs().amax().clamp_min(1e-30)).all())


class Int4Linear:
    """Q4_1-style 4-bit weights [out, in]; `weight` is their bf16 dequantization."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        if dtype != torch.bfloat16:
            raise ValueError(f"int4 weights run with bf16 activations, got {dtype}")
        q, d, m = quantize_int4(w_out_in)
        self.sz = scales_and_zeros(d, m, dtype)
        self.weight = dequantize_int4(q, self.sz).to(dtype)
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        self.bias = bias
        out_f, in_f = q.shape
        self._rows = RowInvariant("int4pack", self._kernel, in_f, out_f, dtype, q.device)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        # The kernel needs contiguous rows; the MLP's gate is a column slice of gate_up's output.
        y = torch._weight_int4pack_mm_for_cpu(x.contiguous(), self.packed, GROUP, self.sz)
        return y if self.bias is None else y + self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)
