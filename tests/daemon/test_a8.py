"""The w4a8 mode's projections (kernels/a8_gemm.c through `F32Linear(int8_activations=True)`): GGUF
blocks times activations quantized to 8 bits per 32 inputs. They compute exactly the integer
arithmetic they promise (checked against a float64 model of it), stay close to the fp32 product, and
give a row bitwise the same result whatever its call's rows and thread count."""

from __future__ import annotations

import pytest
import torch

from radixd.daemon.model.f32 import F32Linear
from radixd.daemon.model.llama import make_linear
from radixd.daemon.model.precision import PRECISIONS
from tests.daemon.test_f32 import RUNS_HERE, assert_rows_as_alone, q4_1_weights, q8_0_weights

CPU = torch.device("cpu")


def quantized_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k] as the kernel quantizes it: per 32 inputs codes round(x * 127 / amax) (half to even)
    and the scale amax / 127 -> (codes float64 [m, k / 32, 32], scales float64 [m, k / 32, 1])."""
    g = x.reshape(x.shape[0], -1, 32)
    amax = g.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))  # fp32, as the kernel
    codes = torch.round(g * inv)
    return codes.double(), (amax / 127.0).double()


def model_of_q4_1(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum over groups of d * e * sum(q * a) + m * e * sum(a), in float64 (Q4_1: w = d * q + m)."""
    out_f, in_f = w.shape
    wg = w.reshape(out_f, in_f // 32, 32)
    lo, hi = wg.amin(dim=2), wg.amax(dim=2)
    d = ((hi - lo) / 15).half().float().double()
    q = torch.round((wg.double() - lo.double()[..., None]) / d[..., None]).clamp(0, 15)
    a, e = quantized_activations(x)
    ints = torch.einsum("mgk,ngk->mng", a, q)  # exact in float64
    e2 = e.squeeze(2)[:, None]  # [m, 1, groups]
    return (ints * d[None] * e2 + lo.double()[None] * e2 * a.sum(2)[:, None]).sum(2)


def model_of_q8_0(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out_f, in_f = w.shape
    wg = w.reshape(out_f, in_f // 32, 32)
    d = (wg.abs().amax(dim=2) / 127).half().float().double()
    q = torch.round(wg.double() / d[..., None])
    a, e = quantized_activations(x)
    return (torch.einsum("mgk,ngk->mng", a, q) * d[None] * e.squeeze(2)[:, None]).sum(2)


def a8(w: torch.Tensor, bias: torch.Tensor | None = None) -> F32Linear:
    assert RUNS_HERE, "the w4a8 kernels need an x86-64 CPU with AVX2 and FMA and a C compiler on PATH"
    return F32Linear(w, bias, int8_activations=True)


@pytest.mark.parametrize(("out_f", "in_f"), [(200, 96), (37, 64), (960, 576)])
def test_q4_1_blocks_times_8_bit_activations(out_f: int, in_f: int) -> None:
    w, _ = q4_1_weights(out_f, in_f, seed=out_f)
    lin = a8(w)
    assert lin.coding == "q4_1_a8"
    for m in (1, 2, 3, 4, 5, 9):
        x = torch.randn(m, in_f, generator=torch.Generator().manual_seed(m))
        want = model_of_q4_1(x, w)
        got = lin(x).double()
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * float(want.abs().max()))
        exact = x.double() @ w.double().t()  # and the quantization costs little against fp32
        assert float((got - exact).abs().max()) < 0.03 * float(exact.abs().max())


@pytest.mark.parametrize(("out_f", "in_f"), [(130, 64), (7, 32)])
def test_q8_0_blocks_times_8_bit_activations(out_f: int, in_f: int) -> None:
    w = q8_0_weights(out_f, in_f, seed=out_f)
    bias = torch.randn(out_f)
    lin = a8(w, bias)
    assert lin.coding == "q8_0_a8"
    for m in (1, 4, 6):
        x = torch.randn(m, in_f, generator=torch.Generator().manual_seed(m))
        want = model_of_q8_0(x, w) + bias.double()
        torch.testing.assert_close(lin(x).double(), want, rtol=0, atol=2e-6 * float(want.abs().max()))


def test_zero_rows_and_weights_without_blocks() -> None:
    w, _ = q4_1_weights(40, 64, seed=1)
    out = a8(w)(torch.zeros(3, 64))
    assert torch.equal(out, torch.zeros(3, 40))  # a group of zeros has scale 0, no NaN
    assert a8(torch.randn(8, 64)).coding == "f32"  # off the grids: fp32, as in float32


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_a_row_is_bitwise_the_same_at_any_row_count_position_and_thread_count(kind: str) -> None:
    w = q4_1_weights(198, 576, seed=3)[0] if kind == "q4_1" else q8_0_weights(198, 576, seed=3)
    # 198 outputs: the 4-output blocks leave a 2-output tail.
    assert_rows_as_alone(a8(w), torch.randn(70, 576, generator=torch.Generator().manual_seed(4)))


def test_the_w4a8_mode_runs_its_blocks_with_8_bit_activations() -> None:
    w, _ = q4_1_weights(64, 96, seed=9)
    lin = make_linear(w, None, PRECISIONS["w4a8"], CPU)
    assert isinstance(lin, F32Linear) and lin.coding == "q4_1_a8"
    plain = make_linear(w, None, PRECISIONS["float32"], CPU)
    assert isinstance(plain, F32Linear) and plain.coding == "q4_1"
