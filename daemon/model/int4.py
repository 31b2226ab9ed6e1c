"""4-bit weights in the GGUF Q4_1 layout, executed by torch's packed int4 CPU kernel.

Each group of 32 consecutive inputs of a row is stored as 4-bit codes `q` in [0, 15] with a scale
and a minimum, `w = q * d + m`: exactly the Q4_1 blocks the embedded SmolLM2 GGUF ships. Quantizing
weights that came from Q4_1 blocks therefore recovers the GGUF's own codes (the group's minimum has
code 0 and its maximum code 15), so this mode runs the file's 4-bit weights without expanding them.

Every row count (decode batches and prefill chunks alike) runs `torch._weight_int4pack_mm_for_cpu`,
which streams half a byte per weight (a quarter of bf16's), behind the row-invariance plan of
`invariant.py`: a token's result is bitwise the same in a decode step of any batch and in a prefill
chunk.

NOTE: until issue 25, steps of more than 12 rows ran oneDNN's bf16 GEMM over the dequantized weights
instead, which is faster for prefill on AMX / AVX512-BF16 machines (the crossover measured there: the
kernel wins up to ~12 rows, the GEMM from ~16 on) but sums in another order, so a token prefilled and
the same token decoded differed. docs/batch-invariance-cost.md measures both designs.
The kernel takes `(q - 8) * scale + zero`, hence `zero = m + 8 * d`; scales and zeros are bf16, the
activations' dtype, as the kernel requires for its fast path (fp32 activations take a reference
loop ~30x slower).
"""

from __future__ import annotations

import torch

from radixd.daemon.model.invariant import RowInvariant

GROUP = 32


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes per `group` inputs of a row, min/max as GGUF's Q4_1:
    -> (q int32 [out, in] in [0, 15], d fp32 [out, in / group], m fp32 [out, in / group])."""
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
    """Whether `quantize_int4` holds `w` exactly (to fp32 rounding), i.e. its groups are 4-bit already.

    Checks `rows` rows spread over the matrix: a tensor stored 4-bit has every group on the grid, one
    stored otherwise (5-8 bits, 16-bit floats) almost none, so a sample decides at a fraction of the
    cost of quantizing it all (`auto` asks this of every layer matrix at load)."""
    if w.dim() != 2 or w.shape[1] % GROUP:
        return False
    sample = w[:: max(1, w.shape[0] // rows)].float()
    q, d, m = quantize_int4(sample)
    back = dequantize_int4(q, scales_and_zeros(d, m, torch.float32))
    return bool(((back - sample).abs() <= 1e-5 * sample.abs().amax().clamp_min(1e-30)).all())


class Int4Linear:
    """Q4_1-style 4-bit weights [out, in]; `weight` is their bf16 dequantization (what the kernel
    computes with)."""

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
