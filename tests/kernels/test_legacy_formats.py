"""kernels/legacy_gemm.c (and legacy_avx512.c): GGUF's Q4_0, Q5_0 and Q5_1 blocks as the file stores them
times 8-bit activations, and F16 / BF16 rows in fp32 arithmetic, through `radixd_gemm`.

Blocks come from gguf-py's quantizer; rows dequantize bitwise as gguf-py's reader does; a product is the
integer arithmetic the kernel promises (a float64 model of it: x quantized per 32 inputs as the kernel
does, sums exact) and close to x times the dequantized W; the 16-bit kinds are bitwise the fp32 kind over
the widened rows; a row's result never depends on its call. k = 96 (odd groups) runs the AVX2 tiles, the
other widths the AVX512-VNNI ones where the CPU has them."""

from __future__ import annotations

import ctypes

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from radixd.daemon.model.f32 import Gemm, library

LEGACY = {"q4_0_a8": QT.Q4_0, "q5_0_a8": QT.Q5_0, "q5_1_a8": QT.Q5_1}
SHAPES = [(37, 96), (20, 128), (9, 640)]  # (n, k): odd groups, one pair, Gemma 3 270M's width


def weights(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[:, ::7] += 0.02  # groups that are not centred on zero: Q5_1's minimums matter
    return w


def blocks(coding: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """gguf-py's blocks of a random [n, k] matrix -> (the blocks as uint8 [n, row bytes], gguf-py's
    dequantized float32 [n, k])."""
    raw = gguf.quants.quantize(weights(n, k, seed), LEGACY[coding])
    return torch.from_numpy(raw.copy()), gguf.quants.dequantize(raw, LEGACY[coding]).reshape(n, k)


def sixteen(coding: str, n: int, k: int, seed: int) -> torch.Tensor:
    w = torch.from_numpy(weights(n, k, seed)) * 40
    w[0, : min(k, 4)] = torch.tensor([0.0, -0.0, float("inf"), 1e-6][: min(k, 4)])  # specials, subnormals
    return w.half() if coding == "f16" else w.bfloat16()


def codes_of(coding: str, raw: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A block matrix's signed codes [n, k / 32, 32], scales and minimums [n, k / 32] (float64), read
    from the bytes as the format lays them out."""
    b = raw.reshape(n, k // 32, -1)
    d = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = np.zeros_like(d)
    qs_at = {"q4_0_a8": 2, "q5_0_a8": 6, "q5_1_a8": 8}[coding]
    nib = b[..., qs_at : qs_at + 16]
    q = np.concatenate([nib & 0x0F, nib >> 4], axis=-1).astype(np.int64)
    if coding != "q4_0_a8":
        qh = b[..., qs_at - 4 : qs_at].copy().view(np.uint32)
        q |= ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int64) << 4
    if coding == "q5_1_a8":
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    offset = {"q4_0_a8": 8, "q5_0_a8": 16, "q5_1_a8": 0}[coding]
    return (q - offset).astype(np.float64), d, m


def quantized_x(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """x [m, k] per 32 inputs as the kernel quantizes it: codes round_half_even(x * (127 / amax)) and
    scale amax / 127, fp32 -> (codes float64 [m, k / 32, 32], scales float64 [m, k / 32])."""
    g = x.numpy().reshape(x.shape[0], -1, 32)
    amax = np.abs(g).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return np.round(g * inv).astype(np.float64), (amax / np.float32(127))[..., 0].astype(np.float64)


def model(coding: str, raw: np.ndarray, x: torch.Tensor, n: int, k: int) -> np.ndarray:
    """sum over groups of d * e * sum(q * a) + m * e * sum(a), in float64."""
    q, d, m = codes_of(coding, raw, n, k)
    a, e = quantized_x(x)
    ints = np.einsum("mgk,ngk->mng", a, q)  # exact in float64
    out: np.ndarray = (ints * d[None] * e[:, None] + m[None] * (e * a.sum(2))[:, None]).sum(2)
    return out


def gemm(coding: str, w: torch.Tensor, n: int, k: int, bias: torch.Tensor | None = None) -> Gemm:
    return Gemm(coding, [w], bias, (n, k))


def dequantized(g: Gemm, rows: list[int]) -> torch.Tensor:
    lib = library()
    assert lib is not None
    idx = torch.tensor(rows, dtype=torch.int64)
    out = torch.empty(len(rows), g.proj.k)
    assert lib.radixd_dequantize_rows(ctypes.byref(g.proj), idx.data_ptr(), len(rows), out.data_ptr()) == 0
    return out


def assert_rows_as_alone(g: Gemm, x: torch.Tensor) -> None:
    """Each row of x [9, k] comes out bitwise as it does alone on one thread, in calls of 2..9 rows at
    every position, on 1 and 2 threads."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([g(x[i : i + 1]) for i in range(x.shape[0])])
        for t in (1, 2):
            torch.set_num_threads(t)
            for m in range(2, x.shape[0] + 1):
                for s in range(x.shape[0] - m + 1):
                    assert torch.equal(g(x[s : s + m]), alone[s : s + m]), (t, m, s)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("coding", sorted(LEGACY))
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_rows_dequantize_as_gguf_reads_them(coding: str, n: int, k: int) -> None:
    raw, want = blocks(coding, n, k, seed=n)
    got = dequantized(gemm(coding, raw, n, k), list(range(n))[::-1])
    assert np.array_equal(got.numpy().view(np.uint32), want[::-1].view(np.uint32))


@pytest.mark.parametrize("coding", ["f16", "bf16"])
def test_16_bit_rows_dequantize_as_gguf_reads_them(coding: str) -> None:
    n, k = 5, 45
    w = sixteen(coding, n, k, seed=3)
    qtype = QT.F16 if coding == "f16" else QT.BF16
    want = gguf.quants.dequantize(w.view(torch.uint16).numpy().view(np.uint8), qtype).reshape(n, k)
    got = dequantized(gemm(coding, w, n, k), [4, 0, 2])
    assert np.array_equal(got.numpy().view(np.uint32), want[[4, 0, 2]].view(np.uint32))


@pytest.mark.parametrize("coding", sorted(LEGACY))
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_the_product_is_the_promised_integer_arithmetic(coding: str, n: int, k: int) -> None:
    raw, w = blocks(coding, n, k, seed=k)
    g = gemm(coding, raw, n, k)
    for m in (1, 3, 4, 5, 9):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        x[0, :32] = 0.0  # a group of zeros: scale 0
        got = g(x).double().numpy()
        want = model(coding, raw.numpy(), x, n, k)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
        exact = x.double().numpy() @ w.astype(np.float64).T  # and 8-bit activations cost little
        assert np.abs(got - exact).max() < 0.03 * np.abs(exact).max()


@pytest.mark.parametrize("coding", [*sorted(LEGACY), "f16", "bf16"])
@pytest.mark.parametrize("k", [96, 640])
def test_a_rows_result_does_not_depend_on_its_call(coding: str, k: int) -> None:
    n = 1400  # enough outputs that calls of 2 rows already split over the threads
    w = blocks(coding, n, k, seed=1)[0] if coding in LEGACY else sixteen(coding, n, k, seed=1)
    assert_rows_as_alone(gemm(coding, w, n, k), torch.randn(9, k, generator=torch.Generator().manual_seed(2)))


@pytest.mark.parametrize("coding", ["f16", "bf16"])
@pytest.mark.parametrize(("n", "k"), [(37, 13), (30, 64), (5, 645)])
def test_16_bit_rows_are_the_fp32_kind_over_their_values(coding: str, n: int, k: int) -> None:
    w = sixteen(coding, n, k, seed=k)
    w[0, :3] = 1.0  # no inf here: it would make every product of row 0 inf or nan
    g, wide = gemm(coding, w, n, k), gemm("f32", w.float(), n, k)
    for m in (1, 2, 4, 5, 11):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        assert torch.equal(g(x), wide(x)), m


def test_a_chain_of_a_q5_0_part_and_a_q8_0_part_with_biases() -> None:
    k = 128
    raw, _ = blocks("q5_0_a8", 11, k, seed=5)
    q8 = gguf.quants.quantize(weights(6, k, seed=6), QT.Q8_0).reshape(6, k // 32, 34)
    q8_d = torch.from_numpy(q8[..., :2].copy().view(np.float16)[..., 0].copy())
    q8_codes = torch.from_numpy(q8[..., 2:].copy().view(np.int8).reshape(6, k))
    b1, b2 = torch.randn(11), torch.randn(6)
    first = gemm("q5_0_a8", raw, 11, k, b1)
    second = Gemm("q8_0_a8", [q8_codes, q8_d], b2, (6, k))
    first.proj.next = ctypes.pointer(second.proj)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(7))
    fused = torch.empty(5, 17)
    lib = library()
    assert lib is not None
    assert lib.radixd_gemm(ctypes.byref(first.proj), x.data_ptr(), 5, fused.data_ptr(), 2) == 0
    first.proj.next = None
    assert torch.equal(fused[:, :11], first(x)) and torch.equal(fused[:, 11:], second(x))
    want = model("q5_0_a8", raw.numpy(), x, 11, k) + b1.double().numpy()
    np.testing.assert_allclose(fused[:, :11].double().numpy(), want, rtol=0, atol=2e-6 * np.abs(want).max())
