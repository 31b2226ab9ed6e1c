"""int4 weights: Q4_1 codes recovered exactly, and the packed kernel computes their product."""

from __future__ import annotations

import pytest
import torch

from radixd.daemon.model.int4 import (
    GROUP,
    Int4Linear,
    dequantize_int4,
    quantize_int4,
    scales_and_zeros,
)


def q4_1_weights(out_f: int, in_f: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights as a Q4_1 GGUF stores them: w = q * d + m per 32 inputs, d and m fp16, and each group
    holding codes 0 and 15 (the quantizer maps a group's minimum and maximum there)."""
    g = torch.Generator().manual_seed(seed)
    groups = in_f // GROUP
    q = torch.randint(0, 16, (out_f, groups, GROUP), generator=g, dtype=torch.int32)
    q[:, :, 0], q[:, :, 1] = 0, 15
    d = (torch.rand(out_f, groups, 1, generator=g) * 0.02 + 1e-3).half().float()
    m = (-torch.rand(out_f, groups, 1, generator=g) * 0.2).half().float()
    return (q * d + m).reshape(out_f, in_f), q.reshape(out_f, in_f)


def test_quantizing_q4_1_weights_recovers_the_files_codes() -> None:
    w, codes = q4_1_weights(48, 96, seed=1)
    q, d, m = quantize_int4(w)
    assert torch.equal(q, codes)
    assert torch.allclose(dequantize_int4(q, scales_and_zeros(d, m, torch.float32)), w, atol=1e-6)


def test_quantize_int4_bounds_the_error_of_arbitrary_weights() -> None:
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    w[5, :32] = 0.25  # a constant group: no step to divide by
    q, d, m = quantize_int4(w)
    assert int(q.min()) >= 0 and int(q.max()) <= 15 and bool((q[5, :32] == 0).all())
    err = (dequantize_int4(q, scales_and_zeros(d, m, torch.float32)) - w).abs().reshape(16, 2, GROUP)
    assert bool((err <= d[:, :, None] / 2 + 1e-6).all())
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_int4(torch.randn(4, 40))


@pytest.mark.parametrize("bias", [False, True])
def test_the_int4_kernel_and_the_gemm_path_compute_the_same_product(bias: bool) -> None:
    """Decode-sized steps run the packed int4 kernel, larger ones the bf16 GEMM over the dequantized
    weights: both equal x @ weight.T to bf16 rounding, also on a non-contiguous input."""
    w, _ = q4_1_weights(96, 64, seed=3)
    g = torch.Generator().manual_seed(4)
    b = torch.randn(96, generator=g).bfloat16() if bias else None
    lin = Int4Linear(w, b, torch.bfloat16)
    assert lin.weight.dtype == torch.bfloat16 and lin.weight.shape == (96, 64)
    wide = torch.randn(16, 128, generator=g).bfloat16()
    x = wide[:, :64]  # a column slice, as the MLP's gate is
    with torch.inference_mode():
        dense = lin(x)
        rows = torch.cat([lin(x[i : i + 1]) for i in range(x.shape[0])])
    ref = x.float() @ lin.weight.float().t() + (b.float() if b is not None else 0.0)
    tol = 1e-2 * float(ref.abs().max())
    torch.testing.assert_close(dense.float(), ref, rtol=2e-2, atol=tol)
    assert torch.equal(rows, dense)


def test_int4_needs_bf16_activations() -> None:
    with pytest.raises(ValueError, match="bf16"):
        Int4Linear(torch.randn(8, 32), None, torch.float32)
