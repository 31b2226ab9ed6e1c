"""The fp32 projections' compiled kernel (`f32.py`): it computes x W^T, a row comes out bitwise the
same whatever its call's rows, their number and the thread count, and the float32 mode runs it."""

from __future__ import annotations

import shutil
from typing import Protocol

import pytest
import torch

from radixd.daemon.loaders import LoadedModel
from radixd.daemon.model.f32 import F32Linear, Widened16Linear, f32_available
from radixd.daemon.model.llama import make_linear, make_lm_head
from radixd.daemon.model.precision import PRECISIONS
from radixd.kernels.native import cpu_flags

RUNS_HERE = {"avx2", "fma"} <= cpu_flags() and shutil.which("cc") is not None
CPU = torch.device("cpu")


def linear(out_f: int, in_f: int, seed: int, bias: bool = False) -> F32Linear:
    # NOTE: no skip: the float32 mode runs this kernel wherever it can build, so a machine that tests
    # radixd must build it (a failure here says why the daemon would fall back to oneDNN).
    assert RUNS_HERE, "the fp32 kernel needs an x86-64 CPU with AVX2 and FMA and a C compiler on PATH"
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g)
    return F32Linear(w, torch.randn(out_f, generator=g) if bias else None)


class RowKernel(Protocol):
    """A projection over the native kernels (row-invariant by construction: no row plan)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def assert_rows_as_alone(lin: RowKernel, x: torch.Tensor) -> torch.Tensor:
    """Each row of `x` (70 rows) comes out of `lin` bitwise as it does alone on one thread, in calls of
    every remainder of the 4-row tiles, first or last among others; -> the rows alone."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([lin(x[i : i + 1]) for i in range(70)])
    finally:
        torch.set_num_threads(threads)
    for m in (2, 3, 4, 5, 6, 7, 8, 13, 64, 65, 70):
        assert torch.equal(lin(x[:m]), alone[:m]), m
        assert torch.equal(lin(x[70 - m :]), alone[70 - m :]), m
    assert torch.equal(lin(x), alone)
    return alone


def test_the_kernel_runs_where_the_cpu_and_a_compiler_allow() -> None:
    assert f32_available() == RUNS_HERE


# Widths that are and are not multiples of the 8 lanes and of every tile's output count.
@pytest.mark.parametrize(("out_f", "in_f"), [(960, 576), (576, 1536), (37, 13), (5, 3), (200, 64)])
def test_the_kernel_computes_the_product(out_f: int, in_f: int) -> None:
    lin = linear(out_f, in_f, seed=1)
    for m in (1, 2, 3, 4, 5, 9, 70):
        x = torch.randn(m, in_f, generator=torch.Generator().manual_seed(m))
        want = x.double() @ lin.weight.double().t()
        got = lin(x)
        assert got.dtype == torch.float32 and got.shape == (m, out_f)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * float(want.abs().max()))


def test_a_bias_is_added() -> None:
    lin = linear(40, 24, seed=2, bias=True)
    x = torch.randn(3, 24)
    assert lin.bias is not None
    torch.testing.assert_close(lin(x), x @ lin.weight.t() + lin.bias)


@pytest.mark.parametrize(("out_f", "in_f"), [(960, 576), (37, 13)])
def test_a_row_is_bitwise_the_same_at_any_row_count_position_and_thread_count(out_f: int, in_f: int) -> None:
    lin = linear(out_f, in_f, seed=3)
    x = torch.randn(70, in_f, generator=torch.Generator().manual_seed(4))
    alone = assert_rows_as_alone(lin, x)
    assert torch.equal(lin(x[::2]), alone[::2])  # a strided input
    assert lin(x[:0]).shape == (0, out_f)


def test_bad_input_is_refused() -> None:
    lin = linear(16, 24, seed=5)
    with pytest.raises(ValueError, match=r"\[N, 24\]"):
        lin(torch.zeros(2, 8))
    with pytest.raises(ValueError, match="fp32 weights"):
        F32Linear(torch.zeros(4, 4, dtype=torch.bfloat16), None)


def test_the_float32_mode_runs_it_over_its_weights_as_given() -> None:
    w = torch.randn(64, 96)
    lin = make_linear(w, None, PRECISIONS["float32"], CPU)
    assert type(lin) is F32Linear and lin.weight is w  # no second copy of the weights
    assert type(make_lm_head(w, PRECISIONS["float32"], CPU)) is F32Linear


def q4_1_weights(out_f: int, in_f: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights as the GGUF reader expands Q4_1 blocks: (d * q) + m per 32 inputs, d and m fp16, each
    group's codes spanning 0..15; -> (weights, codes)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_f, in_f // 32, 32), generator=g)
    q[:, :, 0], q[:, :, 1] = 0, 15
    d = (torch.rand(out_f, in_f // 32, 1, generator=g) * 1e-2 + 1e-4).half().float()
    m = (-torch.rand(out_f, in_f // 32, 1, generator=g) * 0.1).half().float()
    return ((d * q.float()) + m).reshape(out_f, in_f), q.reshape(out_f, in_f)


def q8_0_weights(out_f: int, in_f: int, seed: int) -> torch.Tensor:
    """Weights as the GGUF reader expands Q8_0 blocks: q * d per 32 inputs, d fp16, |q| reaching 127."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out_f, in_f // 32, 32), generator=g)
    q[:, :, 5] = 127
    d = (torch.rand(out_f, in_f // 32, 1, generator=g) * 1e-3 + 1e-5).half().float()
    return (q.float() * d).reshape(out_f, in_f)


def same_as_fp32_weights(lin: F32Linear, rows: tuple[int, ...] = (1, 2, 3, 4, 5, 8, 70)) -> None:
    fp32 = F32Linear(lin.weight, lin.bias, gguf_blocks=False)
    assert fp32.coding == "f32"
    for m in rows:
        x = torch.randn(m, lin.weight.shape[1], generator=torch.Generator().manual_seed(m))
        assert torch.equal(lin(x), fp32(x)), m


def test_q4_1_weights_run_from_their_blocks_bitwise_as_fp32() -> None:
    w, codes = q4_1_weights(200, 96, seed=6)
    lin = F32Linear(w, None)
    assert lin.coding == "q4_1"
    nib = lin.gemm.operands[0]  # the recovered codes: input j in the low nibble, j + 16 in the high one
    low, high = (nib & 15).reshape(200, 3, 16), (nib >> 4).reshape(200, 3, 16)
    assert torch.equal(torch.cat((low, high), dim=2).reshape(200, 96).long(), codes)
    same_as_fp32_weights(lin)


def test_q8_0_weights_run_from_their_blocks_bitwise_as_fp32() -> None:
    lin = F32Linear(q8_0_weights(130, 64, seed=7), torch.randn(130))
    assert lin.coding == "q8_0"
    same_as_fp32_weights(lin)


def test_weights_off_the_grids_run_as_fp32() -> None:
    w, _ = q4_1_weights(8, 64, seed=8)
    w[3, 40] = torch.nextafter(w[3, 40], torch.tensor(1.0))  # one weight one ulp off its block
    assert F32Linear(w, None).coding == "f32"
    assert F32Linear(torch.randn(8, 64), None).coding == "f32"
    assert F32Linear(torch.randn(8, 24), None).coding == "f32"  # not groups of 32


@pytest.mark.slow
def test_the_embedded_models_blocks_are_run_bitwise_as_its_fp32_weights(smollm: LoadedModel) -> None:
    """The Q4_1 GGUF's layers and its Q8_0 embedding (the tied lm_head) run from their blocks."""
    projections = smollm.model.projections()
    assert all(isinstance(p, F32Linear) and p.coding == "q4_1" for p in projections[:-1])
    head = projections[-1]
    assert isinstance(head, F32Linear) and head.coding == "q8_0"
    same_as_fp32_weights(head, rows=(1, 4))
    layer = projections[2]
    assert isinstance(layer, F32Linear)
    same_as_fp32_weights(layer)


def test_16_bit_weights_widened_to_the_fp32_kernel() -> None:
    """Widened16Linear: the fp32 product of the bf16 weights' exact values, rounded to bf16, and a
    row's result whatever its call's rows (bf16 rounding cannot hide an order change: there is none)."""
    assert RUNS_HERE, "the fp32 kernel needs an x86-64 CPU with AVX2 and FMA and a C compiler on PATH"
    g = torch.Generator().manual_seed(11)
    w = torch.randn(96, 64, generator=g).bfloat16()
    bias = torch.randn(96, generator=g).bfloat16()
    lin = Widened16Linear(w, bias)
    assert lin.weight is w and lin.bias is bias
    x = torch.randn(9, 64, generator=g).bfloat16()
    got = lin(x)
    assert got.dtype == torch.bfloat16
    want = (x.double() @ w.double().t() + bias.double()).bfloat16()
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(torch.cat([lin(x[i : i + 1]) for i in range(9)]), got)
