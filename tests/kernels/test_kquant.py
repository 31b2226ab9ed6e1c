"""The K-quant kinds (kernels/kquant_gemm.c): GGUF Q4_K, Q5_K and Q6_K blocks as the file stores them
times activations quantized to 8 bits per 256 inputs. Rows dequantize bitwise as gguf-py does; a
projection computes exactly the integer and fp32 arithmetic it promises (a numpy model of it, bit for
bit), stays within the activations' rounding of x @ W^T, and gives a row the same bits whatever its
call's rows, its position and the thread count; parts of different kinds chain, and a bias adds.
Q4_K, Q5_K and Q6_K repacked at load (kernels/kquant_x16.c) keep every one of those bits."""

from __future__ import annotations

import ctypes

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from radixd.daemon.model import f32, quant
from radixd.daemon.model.f32 import Gemm
from radixd.daemon.model.stored import Stored
from radixd.kernels.native import Proj, Weights, cpu_flags

QK = 256
KINDS = {"q4_k_a8": (QT.Q4_K, 144), "q5_k_a8": (QT.Q5_K, 176), "q6_k_a8": (QT.Q6_K, 210)}


def blocks(coding: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random super-blocks [n, k / 256 * bytes]: random codes and integer scales, fp16 d (and dmin)
    in [1e-3, 1e-2) so the weights stay of a model's size."""
    qtype, size = KINDS[coding]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (n, k // QK, size), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-2, (n, k // QK, 2)).astype(np.float16).view(np.uint8)
    if qtype == QT.Q6_K:
        b[..., 208:210] = scales[..., :2]
    else:
        b[..., 0:4] = scales
    return b.reshape(n, -1)


def integer_parts(coding: str, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per super-block: codes u [n, sb, 256] (unsigned), scales and minimums per 16 [n, sb, 16], d and
    dmin [n, sb] (fp32), with w = (d * sc) * u - (dmin * mn) (Q6_K: (d * sc) * (u - 32))."""
    qtype, size = KINDS[coding]
    n = b.shape[0]
    sb = b.reshape(n, -1, size).astype(np.int64)
    raw = b.reshape(n, -1, size)
    if qtype == QT.Q6_K:
        ql, qh = sb[..., :128].reshape(n, -1, 2, 64), sb[..., 128:192].reshape(n, -1, 2, 32)
        lo = np.stack([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3)
        hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=3)
        u = (lo | hi << 4).reshape(n, -1, QK)
        sc = raw[..., 192:208].view(np.int8).astype(np.int64)
        d = raw[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
        return u, sc, 32 * sc, d, d
    s = sb[..., 4:16]
    sc8 = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | (s[..., 0:4] >> 6) << 4], axis=2)
    mn8 = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4], axis=2)
    qs = sb[..., size - 128 :].reshape(n, -1, 4, 1, 32) >> np.array([0, 4]).reshape(2, 1)
    u = (qs & 15).reshape(n, -1, QK)
    if qtype == QT.Q5_K:
        qh = sb[..., 16:48].reshape(n, -1, 1, 32) >> np.arange(8).reshape(8, 1)
        u = u | ((qh & 1) << 4).reshape(n, -1, QK)
    dd = raw[..., 0:4].copy().view(np.float16).astype(np.float32)
    return u, np.repeat(sc8, 2, axis=2), np.repeat(mn8, 2, axis=2), dd[..., 0], dd[..., 1]


def activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [m, k] as the kernel quantizes it per 256: codes rint(x * (127 / amax)) (fp32, half to even)
    [m, sb, 256] and scales amax / 127 [m, sb]."""
    g = x.reshape(x.shape[0], -1, QK)
    amax = np.abs(g).max(axis=2)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), np.float32(0)).astype(np.float32)
    return np.rint(g * inv[..., None]).astype(np.int64), amax / np.float32(127)


def model(coding: str, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The promised arithmetic: S1 = sum_i sc_i * (u . a over span i), S2 = sum_i mn_i * sum(a over
    span i) exactly, then per super-block in fp32 (d * e) * S1 - (dmin * e) * S2 (Q6_K: (d * e) *
    (S1 - S2)), added in order from 0."""
    u, sc, mn, d, dmin = integer_parts(coding, b)
    a, e = activations(x)
    n, nsb = d.shape
    dots = np.einsum("nsil,msil->mnsi", u.reshape(n, nsb, 16, 16), a.reshape(-1, nsb, 16, 16))
    s1 = np.einsum("mnsi,nsi->mns", dots, sc)
    s2 = np.einsum("msi,nsi->mns", a.reshape(-1, nsb, 16, 16).sum(3), mn)
    acc = np.zeros((x.shape[0], n), np.float32)
    for s in range(nsb):
        de, dme = d[None, :, s] * e[:, None, s], dmin[None, :, s] * e[:, None, s]
        if coding == "q6_k_a8":
            acc = acc + de * (s1[..., s] - s2[..., s]).astype(np.float32)
        else:
            acc = acc + (de * s1[..., s].astype(np.float32) - dme * s2[..., s].astype(np.float32))
    return acc


def lib() -> ctypes.CDLL:
    built = f32.library()
    assert built is not None, "the K-quant kernels need an x86-64 CPU with AVX2, FMA, F16C and a C compiler"
    return built


def gemm(proj: Proj, x: np.ndarray, threads: int) -> np.ndarray:
    width, p = 0, ctypes.pointer(proj)
    while p:
        width, p = width + p.contents.n, p.contents.next
    xc = np.ascontiguousarray(x, np.float32)
    y = np.empty((x.shape[0], width), np.float32)
    assert lib().radixd_gemm(ctypes.byref(proj), xc.ctypes.data, x.shape[0], y.ctypes.data, threads) == 0
    return y


def part(coding: str, b: np.ndarray, k: int) -> Proj:
    return Proj(Weights[coding.upper()], b.ctypes.data, 0, 0, 0, b.shape[0], k)


def inputs(m: int, k: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)
    x[0, :QK] = 0.0  # a super-block of zeros: scale 0
    return x


@pytest.mark.parametrize("coding", sorted(KINDS))
def test_rows_dequantize_as_gguf(coding: str) -> None:
    n, k = 11, 768
    b = blocks(coding, n, k, seed=1)
    want = gguf.quants.dequantize(b, KINDS[coding][0])
    rows = np.array([3, 0, 10, 3], np.int64)
    out = np.empty((len(rows), k), np.float32)
    proj = part(coding, b, k)
    assert lib().radixd_dequantize_rows(ctypes.byref(proj), rows.ctypes.data, len(rows), out.ctypes.data) == 0
    np.testing.assert_array_equal(out.view(np.int32), want[rows].view(np.int32))
    # the integer parts the model below uses give gguf-py's weights too
    u, sc, mn, d, dmin = integer_parts(coding, b)
    codes = (u - 32 * (coding == "q6_k_a8")).astype(np.float32)
    w = (d[..., None] * np.repeat(sc, 16, axis=2).astype(np.float32)) * codes
    if coding != "q6_k_a8":
        w = w - dmin[..., None] * np.repeat(mn, 16, axis=2).astype(np.float32)
    np.testing.assert_array_equal(w.reshape(n, k).view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("coding", sorted(KINDS))
@pytest.mark.parametrize(("n", "k", "m"), [(13, 512, 1), (13, 512, 6), (130, 2048, 9), (21, 1536, 13)])
def test_gemm_computes_its_arithmetic(coding: str, n: int, k: int, m: int) -> None:
    b = blocks(coding, n, k, seed=n + m)
    x = inputs(m, k, seed=m)
    y = Gemm(coding, [torch.from_numpy(b)], None, (n, k))(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(y.view(np.int32), model(coding, b, x).view(np.int32))
    # within the activations' rounding (at most amax / 254 an input) of the fp32 product
    w = gguf.quants.dequantize(b, KINDS[coding][0]).astype(np.float64)
    amax = np.repeat(np.abs(x.reshape(m, -1, QK)).max(axis=2), QK, axis=1)
    bound = (amax / 254) @ np.abs(w).T * 1.001 + 1e-5
    assert (np.abs(y - x.astype(np.float64) @ w.T) <= bound).all()


@pytest.mark.parametrize("coding", sorted(KINDS))
def test_a_row_is_the_same_in_any_call(coding: str) -> None:
    n, k = 130, 2048  # enough work for the call to split over threads
    b = blocks(coding, n, k, seed=7)
    x = inputs(9, k, seed=7)
    proj = part(coding, b, k)
    alone = [gemm(proj, x[i : i + 1], 1)[0] for i in range(9)]
    for threads in (1, 2):
        for rows in range(2, 10):
            for start in {0, 9 - rows}:
                y = gemm(proj, x[start : start + rows], threads)
                for i in range(rows):
                    np.testing.assert_array_equal(y[i].view(np.int32), alone[start + i].view(np.int32))


@pytest.mark.parametrize("coding", sorted(KINDS))
def test_every_tile_gives_a_row_the_same_bits(coding: str) -> None:
    """Rows 1 to 12 at every position run through the one-row, four-row and eight-row tiles; k / 256 =
    6 runs the one-row tile's four super-blocks at a time and the last two one at a time."""
    n, k, total = 130, 1536, 12
    b = blocks(coding, n, k, seed=11)
    x = inputs(total, k, seed=11)
    proj = part(coding, b, k)
    alone = np.stack([gemm(proj, x[i : i + 1], 1 + i % 2)[0] for i in range(total)]).view(np.int32)
    np.testing.assert_array_equal(alone, model(coding, b, x).view(np.int32))
    for threads in (1, 2):
        for rows in range(1, total + 1):
            for start in range(total - rows + 1):
                y = gemm(proj, x[start : start + rows], threads)
                np.testing.assert_array_equal(y.view(np.int32), alone[start : start + rows])


def test_parts_of_two_kinds_chain_and_a_bias_adds() -> None:
    k, m = 512, 5
    b4, b6 = blocks("q4_k_a8", 9, k, seed=3), blocks("q6_k_a8", 6, k, seed=4)
    x = inputs(m, k, seed=5)
    first, second = part("q4_k_a8", b4, k), part("q6_k_a8", b6, k)
    first.next = ctypes.pointer(second)
    y = gemm(first, x, 2)
    np.testing.assert_array_equal(y[:, :9], model("q4_k_a8", b4, x))
    np.testing.assert_array_equal(y[:, 9:], model("q6_k_a8", b6, x))
    bias = torch.randn(9)
    got = Gemm("q4_k_a8", [torch.from_numpy(b4)], bias, (9, k))(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got, model("q4_k_a8", b4, x) + bias.numpy())


# The repacked kinds and the stored kind whose bits they keep.
X16 = {"q4_k_x16": ("q4_k_a8", "Q4_K"), "q6_k_x16": ("q6_k_a8", "Q6_K"), "q5_k_x16": ("q5_k_a8", "Q5_K")}
RAW = {"Q4_K": "q4_k_a8", "Q6_K": "q6_k_a8", "Q5_K": "q5_k_a8"}
VNNI = {"avx512_vnni", "avx512bw"} <= cpu_flags()


def repacked(x16: str, b: np.ndarray, k: int) -> tuple[Proj, torch.Tensor] | None:
    """The x16 part of blocks b (and the bytes it points to), None where the CPU cannot run it."""
    packed = quant.repack_x16(X16[x16][1], torch.from_numpy(b), b.shape[0], k)
    if packed is None:
        return None
    return Proj(Weights[x16.upper()], packed.data_ptr(), 0, 0, 0, b.shape[0], k), packed


@pytest.mark.parametrize("x16", sorted(X16))
def test_repacked_rows_keep_every_bit(x16: str) -> None:
    """Rows dequantize to gguf-py's weights, and rows 1 to 9 at every position, on 1 or 2 threads,
    give the stored kind's arithmetic bit for bit (the tiles of 1 to 4 rows, 16 outputs a group), as
    does each row of a 64-row call."""
    coding = X16[x16][0]
    n, k, total = 48, 1536, 9
    b = blocks(coding, n, k, seed=13)
    got = repacked(x16, b, k)
    if got is None:  # the kernels need AVX512-VNNI; elsewhere the load keeps the stored kind
        assert not VNNI
        return
    proj, _keep = got
    rows = np.array([17, 0, 47, 17], np.int64)
    out = np.empty((len(rows), k), np.float32)
    assert lib().radixd_dequantize_rows(ctypes.byref(proj), rows.ctypes.data, len(rows), out.ctypes.data) == 0
    want_w = gguf.quants.dequantize(b, KINDS[coding][0])
    np.testing.assert_array_equal(out.view(np.int32), want_w[rows].view(np.int32))
    x = inputs(total, k, seed=13)
    want = model(coding, b, x).view(np.int32)
    for threads in (1, 2):
        for m in range(1, total + 1):
            for start in range(total - m + 1):
                y = gemm(proj, x[start : start + m], threads)
                np.testing.assert_array_equal(y.view(np.int32), want[start : start + m])
    # a prefill's 64 rows: each row as alone, whatever the thread count
    many = inputs(64, k, seed=14)
    alone = np.concatenate([gemm(proj, many[i : i + 1], 1) for i in range(64)])
    for threads in (1, 2):
        np.testing.assert_array_equal(gemm(proj, many, threads).view(np.int32), alone.view(np.int32))


def test_the_layout_is_chosen_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """$RADIXD_KQUANT_LAYOUT: x16 repacks Q4_K, Q6_K and Q5_K parts of 16-row multiples (outputs
    unchanged), stored keeps the file's blocks, auto follows the machine's measurement; a bad value is
    refused."""
    k = 512
    specs = (("Q4_K", 32, 21), ("Q6_K", 16, 22), ("Q5_K", 16, 25), ("Q4_K", 8, 23), ("Q5_K", 24, 26))
    parts = [Stored(kind, n, k, torch.from_numpy(blocks(RAW[kind], n, k, seed))) for kind, n, seed in specs]
    x = torch.from_numpy(inputs(5, k, seed=24))
    monkeypatch.setenv(quant.ENV_LAYOUT, "stored")
    stored = quant.QuantLinear(parts, None)
    assert stored.coding == "q4_k_a8+q6_k_a8+q5_k_a8+q4_k_a8+q5_k_a8"
    monkeypatch.setenv(quant.ENV_LAYOUT, "x16")
    x16 = quant.QuantLinear(parts, None)
    # 8 and 24 rows stay stored
    assert x16.coding == ("q4_k_x16+q6_k_x16+q5_k_x16+q4_k_a8+q5_k_a8" if VNNI else stored.coding)
    np.testing.assert_array_equal(x16(x).numpy().view(np.int32), stored(x).numpy().view(np.int32))
    monkeypatch.setenv(quant.ENV_LAYOUT, "auto")
    want = [quant.X16_KINDS[kind] if quant.x16_pays(kind) else RAW[kind] for kind in ("Q4_K", "Q6_K", "Q5_K")]
    assert quant.QuantLinear(parts, None).coding.split("+")[:3] == want
    monkeypatch.setenv(quant.ENV_LAYOUT, "fast")
    with pytest.raises(ValueError, match="RADIXD_KQUANT_LAYOUT"):
        quant.QuantLinear(parts, None)
