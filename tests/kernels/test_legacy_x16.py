"""kernels/legacy_x16.c: Q4_1, Q8_0, Q5_0, Q4_0 and Q5_1 repacked at load, 16 rows a record, sum each
group's products in int32 and scale them once, so their last bits differ from the stored layout's
8-bit-activation kinds. Checked: row-invariance bit for bit (1 to N rows at every position of a call,
each output's position in its 16-row record, 1 and 2 threads, a 64-row call's rows as alone);
closeness to an fp64 sum of the same quantized integers, as close as the stored kind; rows dequantize
to the same weights; a part whose outputs are not a multiple of 16 (or whose inputs are not of 64)
stays stored."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from radixd.daemon.model import quant
from radixd.daemon.model.f32 import Gemm
from radixd.daemon.model.stored import Stored
from radixd.kernels.native import cpu_flags

KINDS = ("Q4_1", "Q8_0", "Q5_0", "Q4_0", "Q5_1")
VNNI = {"avx512_vnni", "avx512bw"} <= cpu_flags()
SHAPES = [(48, 576), (32, 1536), (16, 64)]


def stored_kinds(kind: str) -> tuple[str, str]:
    """The stored layout's kinds of `kind`: (8-bit activations, fp32 activations)."""
    if kind in quant.SPLIT_KINDS:
        return quant.SPLIT_KINDS[kind]
    return quant.RAW_KINDS[kind], quant.RAW_KINDS[kind]


def part(kind: str, n: int, k: int, seed: int) -> Stored:
    """gguf-py's blocks of a random [n, k] matrix (groups off zero too: Q4_1 / Q5_1's minimums matter)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[:, ::7] += 0.02
    raw = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, kind))
    return Stored(kind, n, k, torch.from_numpy(raw.view(np.uint8).reshape(n, -1).copy()))


def both(kind: str, n: int, k: int, seed: int) -> tuple[Stored, Gemm, Gemm] | None:
    """(blocks, stored Gemm, x16 Gemm) over the same blocks; None where this CPU cannot run x16."""
    p = part(kind, n, k, seed)
    packed = quant.repack_x16(kind, p.data, n, k)
    if packed is None:
        assert not VNNI
        return None
    coding, ops = quant._stored(p, False)
    return p, Gemm(coding, ops, None, (n, k)), Gemm(quant.X16_KINDS[kind], [packed], None, (n, k))


def bits(y: torch.Tensor) -> np.ndarray:
    return y.numpy().view(np.int32)


def reference(kind: str, p: Stored, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """fp64 y = x W^T over the integers the kernels multiply (x quantized per 32 inputs as
    kernels/gemm.h's quantize_group does), and each output's sum of |terms| (the error scale)."""
    xs = x.numpy().reshape(x.shape[0], -1, 32)
    amax = np.abs(xs).max(axis=2, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, np.float32(1e-30)), np.float32(0))
    q = np.rint(xs * inv.astype(np.float32)).astype(np.float64)
    e = (amax[..., 0] / np.float32(127)).astype(np.float32)
    es = (e * q.sum(axis=2).astype(np.float32)).astype(np.float64)
    size = {"Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q4_0": 18, "Q5_1": 24}[kind]
    blocks = p.data.numpy().reshape(p.rows, -1, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    mn = np.zeros_like(d)
    if kind == "Q8_0":
        codes = blocks[..., 2:34].copy().view(np.int8).astype(np.float64)
    else:  # nibbles in the last 16 bytes (byte j: input j low, j + 16 high), 5th bits in qh before them
        nib = blocks[..., size - 16 :]
        codes = np.concatenate([nib & 0x0F, nib >> 4], axis=2).astype(np.float64)
        if kind in ("Q5_0", "Q5_1"):
            qh = blocks[..., size - 20 : size - 16].copy().view("<u4")[..., 0:1]
            codes += (qh >> np.arange(32, dtype=np.uint32) & 1) * 16.0
        if kind in ("Q4_1", "Q5_1"):
            mn = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        codes -= {"Q4_0": 8, "Q5_0": 16}.get(kind, 0)
    dots = np.einsum("mgi,ngi->mng", q, codes)  # exact integers
    scaled, mins = dots * d[None] * e.astype(np.float64)[:, None], mn[None] * es[:, None]
    return (scaled + mins).sum(axis=2), (np.abs(scaled) + np.abs(mins)).sum(axis=2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_repacked_rows_are_row_invariant(kind: str, n: int, k: int) -> None:
    """1 to 9 rows at every start of a 9-row batch, 1 and 2 threads (tiles of 1 to 4 rows, each output
    at its place in its record) bitwise each row alone; each row of a 64-row call as alone."""
    got = both(kind, n, k, seed=n + k)
    if got is None:
        return
    _, _, x16 = got
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(k)) * 3
    alone9 = torch.cat([x16(x[i : i + 1], 1) for i in range(9)])
    for threads in (1, 2):
        for m in range(1, 10):
            for start in range(10 - m):
                got_rows = x16(x[start : start + m], threads)
                np.testing.assert_array_equal(bits(got_rows), bits(alone9[start : start + m]))
    many = torch.randn(64, k, generator=torch.Generator().manual_seed(1))
    alone = torch.cat([x16(many[i : i + 1], 1) for i in range(64)])
    for threads in (1, 2):
        np.testing.assert_array_equal(bits(x16(many, threads)), bits(alone))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_repacked_sums_match_the_integers(kind: str, n: int, k: int) -> None:
    """Each output within a few fp32 roundings a group of the fp64 sum of the same quantized integers,
    as the stored kind is; the two kinds within that of each other; rows dequantize alike."""
    got = both(kind, n, k, seed=n + k + 1)
    if got is None:
        return
    p, stored, x16 = got
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(k + 1)) * 3
    x[3] = 0.0  # a zero row: scales 0, every output exactly 0
    want, scale = reference(kind, p, x)
    tol = 4 * (k // 32) * 2.0**-24 * scale + 1e-30
    for y in (x16(x, 1), stored(x, 1)):
        err = np.abs(y.numpy().astype(np.float64) - want)
        assert (err <= tol).all(), float((err / tol).max())
    assert not x16(x, 1)[3].any()
    ids = torch.tensor([0, 15, n - 1, 7, n // 2 + 1])
    np.testing.assert_array_equal(bits(x16.rows(ids)), bits(stored.rows(ids)))


@pytest.mark.parametrize("kind", KINDS)
def test_the_layout_is_chosen_at_load(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """$RADIXD_KQUANT_LAYOUT=x16 repacks the 16-row multiples of 64 inputs; a tail part (40 outputs)
    stays stored with the stored kind's bits; the chained outputs are close to the stored layout's
    and the bias is added alike; fp32 activations never take the repacked kind."""
    (k, (a8, floats_kind)) = 576, stored_kinds(kind)
    specs = ((32, 1), (40, 2), (16, 3))
    x = torch.randn(7, k, generator=torch.Generator().manual_seed(4))
    bias = torch.randn(88, generator=torch.Generator().manual_seed(5))
    monkeypatch.setenv(quant.ENV_LAYOUT, "stored")
    stored = quant.QuantLinear([part(kind, n, k, s) for n, s in specs], bias)
    assert stored.coding == "+".join([a8] * 3)
    monkeypatch.setenv(quant.ENV_LAYOUT, "x16")
    x16 = quant.QuantLinear([part(kind, n, k, s) for n, s in specs], bias)
    want = [quant.X16_KINDS[kind], a8, quant.X16_KINDS[kind]] if VNNI else [a8] * 3
    assert x16.coding == "+".join(want)
    ys, yx = stored(x), x16(x)
    np.testing.assert_array_equal(bits(yx[:, 32:72]), bits(ys[:, 32:72]))
    torch.testing.assert_close(yx, ys, rtol=1e-5, atol=1e-5)
    floats = quant.QuantLinear([part(kind, n, k, s) for n, s in specs], None, float_activations=True)
    assert floats.coding == "+".join([floats_kind] * 3)
    monkeypatch.setenv(quant.ENV_LAYOUT, "auto")
    chosen = quant.X16_KINDS[kind] if quant.x16_pays(kind) else a8
    assert quant.QuantLinear([part(kind, 16, k, 6)], None).coding == chosen
