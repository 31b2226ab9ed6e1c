"""Projections over a GGUF file's matrices as stored: each part in its own format, one native call.

The w4a8 mode (8-bit activations) runs every quantized format the native library knows on the
file's blocks: the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), Q4_K, Q5_K and Q6_K in 16 rows'
interleaved blocks (kernels/legacy_x16.c, kernels/kquant_x16.c) where $RADIXD_KQUANT_LAYOUT and
this machine choose it, else Q4_1 and Q8_0 in the split layout the a8 kernels were tuned on (codes,
then fp16 scales and minimums: the same bytes, reordered once at load) and the others exactly as
mapped from the file, never copied. A fused projection chains its parts (`f32.Gemm`'s `then`).
NOTE: row-invariant like every native kernel (kernels/radixd.h). The K-quants' two layouts give
the same bits, so `auto` picks by a timing at load (`x16_pays`). The legacy formats' repacked kinds
sum a group in int32 before scaling it, so their last bits differ from the stored layout's: `auto`
takes them wherever the CPU runs them (AVX512-VNNI and BW), never by a timing, so that two starts on
one machine give the same bits (the speed that backs the rule: docs/measurements/bench-offline.md,
bench-kernels.md).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence

import numpy as np
import torch

from radixd.daemon.model.f32 import Gemm
from radixd.daemon.model.stored import BLOCKS, FLOATS, Stored
from radixd.kernels.native import Weights, library

# GGUF format -> the kernel kind over the file's own blocks (times 8-bit activations where quantized).
RAW_KINDS = {
    "Q4_0": "q4_0_a8",
    "Q5_0": "q5_0_a8",
    "Q5_1": "q5_1_a8",
    "Q4_K": "q4_k_a8",
    "Q5_K": "q5_k_a8",
    "Q6_K": "q6_k_a8",
    "F16": "f16",
    "BF16": "bf16",
    "F32": "f32",
}
# Formats held in the split layout: (the a8 kind, the fp32-activation kind).
SPLIT_KINDS = {"Q4_1": ("q4_1_a8", "q4_1"), "Q8_0": ("q8_0_a8", "q8_0")}
RUNNABLE = frozenset(RAW_KINDS) | frozenset(SPLIT_KINDS)
# Formats with a repacked layout (16 rows interleaved), and the knob that picks it for all of them:
# "auto" (the default: `x16_pays`), "x16" (wherever it runs) or "stored" (never). The legacy formats'
# repacked kinds (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) run 8-bit activations only.
X16_KINDS = {
    "Q4_K": "q4_k_x16",
    "Q6_K": "q6_k_x16",
    "Q4_1": "q4_1_x16",
    "Q8_0": "q8_0_x16",
    "Q5_0": "q5_0_x16",
    "Q4_0": "q4_0_x16",
    "Q5_1": "q5_1_x16",
    "Q5_K": "q5_k_x16",
}
# The library's repack entry points (repack, bytes) by the unit that runs the repacked kind.
_REPACK = {
    "q4_k_x16": "kquant",
    "q6_k_x16": "kquant",
    "q4_1_x16": "legacy",
    "q8_0_x16": "legacy",
    "q5_0_x16": "legacy",
    "q4_0_x16": "legacy",
    "q5_1_x16": "legacy",
    "q5_k_x16": "kquant",
}
# The formats whose repacked kind sums a group in int32 (other last bits than the stored layout's).
_SUMMED = frozenset({"Q4_1", "Q8_0", "Q5_0", "Q4_0", "Q5_1"})
ENV_LAYOUT = "RADIXD_KQUANT_LAYOUT"
LAYOUTS = ("auto", "x16", "stored")


def is_quantized(parts: Sequence[Stored]) -> bool:
    """Whether any part is held in blocks (not floats)."""
    return any(p.kind not in FLOATS for p in parts)


# The GGUF block structs of the formats held split.
_BLOCK_DTYPES = {
    "Q8_0": np.dtype([("d", "<f2"), ("qs", "i1", (32,))]),
    "Q4_1": np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))]),
}


def _split(p: Stored) -> list[torch.Tensor]:
    """Q4_1 / Q8_0 blocks -> [codes, d (fp16)] (+ [minimums (fp16)] for Q4_1), rows kept."""
    blocks = p.data.numpy().view(_BLOCK_DTYPES[p.kind]).reshape(p.rows, p.cols // 32)
    fields = ["qs", "d"] + (["m"] if p.kind == "Q4_1" else [])
    parts = [torch.from_numpy(np.ascontiguousarray(blocks[f])) for f in fields]
    return [parts[0].view(p.rows, -1), *parts[1:]]


def repack_x16(kind: str, data: torch.Tensor, rows: int, cols: int) -> torch.Tensor | None:
    """Blocks `data` [rows, bytes a row] of format `kind` (a key of X16_KINDS) in its x16 layout, or
    None where that does not run (the CPU lacks AVX512-VNNI, `rows` is not a multiple of 16, or for
    the legacy formats `cols` not of 64)."""
    lib = library()
    if lib is None or kind not in X16_KINDS or rows % 16:
        return None
    x16 = X16_KINDS[kind]
    unit, code = _REPACK[x16], int(Weights[x16.upper()])
    size = int(getattr(lib, f"radixd_{unit}_repacked_bytes")(code, rows, cols))
    out = torch.empty(size, dtype=torch.uint8)
    src = data.contiguous()
    done = getattr(lib, f"radixd_{unit}_repack")(code, src.data_ptr(), rows, cols, out.data_ptr())
    return out if done == 0 else None


def _best_s(gemm: Gemm, x: torch.Tensor, calls: int, repeats: int = 7) -> float:
    """The fastest of `repeats` timings of `calls` one-thread calls of gemm(x), after one untimed
    call (one thread: a shared machine's other loads delay a parallel call by whole time slices)."""
    gemm(x, threads=1)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            gemm(x, threads=1)
        best = min(best, time.perf_counter() - t0)
    return best


@functools.cache
def x16_pays(kind: str) -> bool:
    """Whether `auto` takes the repacked layout for `kind`. The legacy formats (Q4_0, Q4_1, Q5_0, Q5_1,
    Q8_0): wherever this CPU runs it (a rule, not a timing: their bits differ from the stored
    layout's). Q4_K / Q5_K / Q6_K: where it runs faster on this machine, measured once a process on a random
    [512, 2048] matrix (~40 ms): no slower for one row (a decode step, within 10%) and faster for 32
    (a prefill)."""
    per, size = BLOCKS[kind]
    if kind in _SUMMED:
        return repack_x16(kind, torch.zeros(16, 64 // per * size, dtype=torch.uint8), 16, 64) is not None
    n, k = 512, 2048
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (n, k // per, size), dtype=torch.uint8, generator=g)
    scales = (torch.rand(n, k // per, 2, generator=g) * 1e-2 + 1e-4).half().view(torch.uint8)
    if kind == "Q6_K":
        raw[..., 208:210] = scales[..., :2]
    else:
        raw[..., 0:4] = scales
    packed = repack_x16(kind, raw.view(n, -1), n, k)
    if packed is None:
        return False
    coding, ops = _stored(Stored(kind, n, k, raw.view(n, -1)), False)
    stored = Gemm(coding, ops, None, (n, k))
    x16 = Gemm(X16_KINDS[kind], [packed], None, (n, k))
    one, many = torch.randn(1, k, generator=g), torch.randn(32, k, generator=g)
    decode = _best_s(x16, one, 8) <= 1.1 * _best_s(stored, one, 8)
    return decode and _best_s(x16, many, 1) < _best_s(stored, many, 1)


def layout() -> str:
    """$RADIXD_KQUANT_LAYOUT, checked."""
    value = os.environ.get(ENV_LAYOUT, "auto")
    if value not in LAYOUTS:
        raise ValueError(f"{ENV_LAYOUT}={value!r}: expected one of {', '.join(LAYOUTS)}")
    return value


def _part(p: Stored, float_activations: bool, repack: bool) -> tuple[str, list[torch.Tensor]]:
    """The kernel kind and operands that run part `p`."""
    # The legacy formats' repacked kinds run 8-bit activations only.
    choice = layout() if repack and p.kind in X16_KINDS and not float_activations else "stored"
    if choice == "x16" or (choice == "auto" and x16_pays(p.kind)):
        packed = repack_x16(p.kind, p.data, p.rows, p.cols)
        if packed is not None:
            p.release()
            return X16_KINDS[p.kind], [packed]
    return _stored(p, float_activations)


def _stored(p: Stored, float_activations: bool) -> tuple[str, list[torch.Tensor]]:
    """The kernel kind and operands that run part `p` in its stored layout."""
    if p.kind in SPLIT_KINDS:
        ops = _split(p)
        p.release()
        a8, f = SPLIT_KINDS[p.kind]
        if not float_activations:
            return a8, ops
        # The fp32-activation kinds read fp32 scales.
        return f, [ops[0], *(t.float() for t in ops[1:])]
    if p.kind not in RAW_KINDS:
        raise ValueError(f"{p.kind} matrices do not run natively (supported: {', '.join(sorted(RUNNABLE))})")
    return RAW_KINDS[p.kind], [p.data]


class QuantLinear:
    """y = x W^T + b over stored parts [out_i, in] (outputs in part order); `weight`: the parts.
    `float_activations`: Q4_1 / Q8_0 parts multiply fp32 activations (the other formats have only
    their 8-bit-activation kernels). `repack`: False keeps K-quant parts as mapped (a table only
    read by rows, whose repacking would cost load time for nothing)."""

    def __init__(
        self,
        parts: Sequence[Stored],
        bias: torch.Tensor | None,
        float_activations: bool = False,
        repack: bool = True,
    ) -> None:
        if not parts or len({p.cols for p in parts}) != 1:
            raise ValueError("a projection's parts must share their input width")
        self.weight = tuple(parts)
        self.bias = bias
        gemm: Gemm | None = None
        end = sum(p.rows for p in parts)
        kinds = []
        for p in reversed(parts):
            coding, operands = _part(p, float_activations, repack)
            kinds.append(coding)
            part_bias = None if bias is None else bias[end - p.rows : end]
            gemm = Gemm(coding, operands, part_bias, p.shape, then=gemm)
            end -= p.rows
        assert gemm is not None
        self.gemm = gemm
        self.coding = "+".join(reversed(kinds))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: no `RowInvariant` probe: the native kernels are row-invariant by construction (tested
        # per kind in tests/kernels), and a probe per shape costs seconds of every start.
        return self.gemm(x)


class StoredEmbedding:
    """Embedding rows read from a stored [vocab, hidden] matrix by the kernels' own dequantization
    (the lm_head's `Gemm` where the two are tied): no float copy of the table."""

    def __init__(self, gemm: Gemm) -> None:
        if gemm.then is not None:
            raise ValueError("an embedding is one stored matrix")
        self._gemm = gemm

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self._gemm.proj.n), int(self._gemm.proj.k))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """int64 ids [T] -> fp32 [T, hidden]."""
        return self._gemm.rows(ids)
