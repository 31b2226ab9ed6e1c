"""The fp32 projections' compiled kernel (`f32.py`): it computes x W^T, a row comes out bitwise the
same whatever its call's rows, their number and the thread count, and the float32 mode runs it."""

from __future__ import annotations

import shutil

import pytest
import torch

from radixd.daemon.model.f32 import F32Linear, f32_available
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
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([lin._kernel(x[i : i + 1]) for i in range(70)])
    finally:
        torch.set_num_threads(threads)
    # Every remainder of the 4-row tiles, and a row's place among others.
    for m in (2, 3, 4, 5, 6, 7, 8, 13, 64, 65, 70):
        assert torch.equal(lin._kernel(x[:m]), alone[:m]), m
        assert torch.equal(lin._kernel(x[70 - m :]), alone[70 - m :]), m
    assert torch.equal(lin(x), alone)
    assert torch.equal(lin(x[::2]), alone[::2])  # a strided input
    assert lin(x[:0]).shape == (0, out_f)


def test_bad_input_is_refused() -> None:
    lin = linear(16, 24, seed=5)
    with pytest.raises(ValueError, match=r"\[N, 24\]"):
        lin._kernel(torch.zeros(2, 8))
    with pytest.raises(ValueError, match="fp32 weights"):
        F32Linear(torch.zeros(4, 4, dtype=torch.bfloat16), None)


def test_the_float32_mode_runs_it_over_its_weights_as_given() -> None:
    w = torch.randn(64, 96)
    lin = make_linear(w, None, PRECISIONS["float32"], CPU)
    assert type(lin) is F32Linear and lin.weight is w  # no second copy of the weights
    assert type(make_lm_head(w, PRECISIONS["float32"], CPU)) is F32Linear
