"""Precisions: `--dtype` resolution, the projections' kernels, and the KV pool following the dtype."""

from __future__ import annotations

import pytest
import torch
from daemon_testkit import tiny_model

from radixd.daemon.executor.runner import ModelRunner, StepSeq, num_blocks_for_budget
from radixd.daemon.loaders.common import model_precision
from radixd.daemon.model import precision
from radixd.daemon.model.int4 import on_int4_grid
from radixd.daemon.model.linear import (
    InOutLinear,
    Int8Linear,
    OutInLinear,
    PackedLinear,
    dequantize_groups,
    quantize_groups,
)
from radixd.daemon.model.precision import PRECISIONS, resolve_precision


def test_auto_follows_the_cpu_and_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu", lambda: True).name == "w4a8"
    assert resolve_precision("auto", "cpu").name == "float32"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", "cpu").name == "bfloat16"
    assert resolve_precision("auto", "cpu", lambda: True).name == "w4a8"
    assert resolve_precision("bfloat16", "cpu", lambda: True).name == "bfloat16"
    monkeypatch.setattr(precision, "f32_available", lambda: False)
    assert resolve_precision("auto", "cpu", lambda: True).name == "int4"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu", lambda: True).name == "float32"


def test_auto_picks_a_4_bit_mode_only_for_weights_on_its_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose layers are 4-bit already (a Q4_1 GGUF's) gets w4a8 (int4 where w4a8's kernels
    cannot build and bf16 is native) under auto; others do not."""
    for bf16, kernels, grid, want in (
        (True, True, True, "w4a8"),
        (True, False, True, "int4"),
        (True, True, False, "bfloat16"),
        (False, True, True, "w4a8"),
        (False, True, False, "float32"),
    ):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda bf16=bf16: bf16)
        monkeypatch.setattr(precision, "f32_available", lambda kernels=kernels: kernels)
        m = tiny_model(q4_1=grid)
        assert model_precision("cpu", "auto", m.weights).name == want
    w = tiny_model(q4_1=True).weights.layers[0].gate_up
    assert on_int4_grid(w) and not on_int4_grid(w + 1e-3 * torch.randn_like(w))


def test_flag_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXD_DTYPE", raising=False)
    assert precision.default_dtype_name() == "auto"
    monkeypatch.setenv("RADIXD_DTYPE", "bfloat16")
    assert precision.default_dtype_name() == "bfloat16"


def test_explicit_and_invalid_dtypes() -> None:
    assert resolve_precision("float32", "cpu") is PRECISIONS["float32"]
    assert resolve_precision("bfloat16", "cpu").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_precision("float8", "cpu")
    with pytest.raises(ValueError, match="CPU only"):
        resolve_precision("int8", "cuda")


def test_quantize_groups_round_trips_within_half_a_step() -> None:
    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(1))
    w[3, 32:64] = 0.0  # an all-zero group must not divide by zero
    q, scale = quantize_groups(w)
    assert q.dtype == torch.int8 and scale.shape == (48, 3)
    assert bool((q.reshape(48, 3, 32).abs().amax(-1)[scale > 1e-11] == 127).all())
    err = (dequantize_groups(q, scale) - w).abs().reshape(48, 3, 32)
    assert bool((err <= scale[:, :, None] / 2 + 1e-7).all())
    assert bool((q[3, 32:64] == 0).all())
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_groups(torch.randn(4, 40))


@pytest.mark.parametrize("bias", [False, True])
def test_int8_runs_the_dense_product_of_its_dequantized_weights(bias: bool) -> None:
    """int8 runs the bf16 GEMM over the dequantized weights at every row count (a one-row int8 kernel
    would sum in another order than the GEMM): one row alone equals the same row among others."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(96, 64, generator=g)
    b = torch.randn(96, generator=g).bfloat16() if bias else None
    lin = Int8Linear(w, b, torch.bfloat16)
    x = torch.randn(3, 64, generator=g).bfloat16()
    with torch.inference_mode():
        dense = lin(x)
        rows = torch.cat([lin(x[i : i + 1]) for i in range(3)])
    assert rows.dtype == torch.bfloat16 and rows.shape == (3, 96)
    assert torch.equal(rows, dense)
    ref = x.float() @ dequantize_groups(lin.q, lin.scale).t() + (b.float() if b is not None else 0.0)
    tol = 1e-2 * float(ref.abs().max())
    torch.testing.assert_close(dense.float(), ref, rtol=2e-2, atol=tol)


def test_layouts_per_precision() -> None:
    w = torch.randn(8, 4)
    x = torch.randn(2, 4)
    fp32 = InOutLinear(w, None)
    assert fp32.weight.shape == (8, 4) and fp32.w.is_contiguous() and fp32.w.shape == (4, 8)
    torch.testing.assert_close(fp32(x), x @ w.t())
    packed = PackedLinear(w, None)  # oneDNN's blocked layout, packed once
    assert packed.weight is w
    torch.testing.assert_close(packed(x), x @ w.t())
    wb = w.bfloat16()
    bf = OutInLinear(wb, None)
    assert bf.weight is wb  # F.linear runs on the [out, in] tensor as given: no copy
    torch.testing.assert_close(bf(x.bfloat16()).float(), x @ w.t(), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("mode", ["bfloat16", "int8", "int4", "w4a8"])
def test_kv_pool_follows_the_dtype(mode: str) -> None:
    # Weights on the Q4_1 grid (what the embedded GGUF ships) so that every mode holds them closely.
    fp32 = tiny_model(q4_1=True)
    low = tiny_model(precision=PRECISIONS[mode], q4_1=True)
    # w4a8 keeps fp32 activations and an f16 KV cache; the others run and cache in bf16
    kv = torch.float16 if mode == "w4a8" else torch.bfloat16
    assert low.precision.name == mode and low.kv_dtype == kv
    assert low.dtype == (torch.float32 if mode == "w4a8" else torch.bfloat16)
    budget = 1 << 20
    n32 = num_blocks_for_budget(fp32.config, 4, budget, fp32.kv_dtype)
    n16 = num_blocks_for_budget(low.config, 4, budget, low.kv_dtype)
    assert n16 == 2 * n32
    r32, r16 = ModelRunner(fp32, n32, 4), ModelRunner(low, n16, 4)
    assert r16.k_caches[0].dtype == kv and r16.kv_bytes_per_block * 2 == r32.kv_bytes_per_block
    ids = [5, 9, 2, 7, 1, 3]
    lg32 = r32.step_logits([StepSeq(0, ids, 0, [1, 2], None)])
    lg16 = r16.step_logits([StepSeq(0, ids, 0, [1, 2], None)])
    assert lg16.dtype == torch.float32
    # A random tiny model is no quality test; this checks that the low-precision path computes the
    # same function (mostly the same top-1 tokens), not a broken one.
    agree = (lg32.argmax(-1) == lg16.argmax(-1)).float().mean()
    assert float(agree) >= 0.8
    assert float((lg32 - lg16).abs().max()) < 0.5
