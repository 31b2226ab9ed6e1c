"""Projections over a GGUF file's matrices as stored: each part in its own format, one native call.

The w4a8 mode (8-bit activations) runs every quantized format the native library knows on the
file's blocks: Q4_1 and Q8_0 in the split layout the a8 kernels were tuned on (codes, then fp16
scales and minimums: the same bytes, reordered once at load), the others exactly as mapped from the
file, never copied. A fused projection chains its parts (`f32.Gemm`'s `then`).
NOTE: row-invariant like every native kernel (kernels/radixd.h).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from radixd.daemon.model.f32 import Gemm
from radixd.daemon.model.stored import FLOATS, Stored

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


def _part(p: Stored, float_activations: bool) -> tuple[str, list[torch.Tensor]]:
    """The kernel kind and operands that run part `p`."""
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
    their 8-bit-activation kernels)."""

    def __init__(
        self, parts: Sequence[Stored], bias: torch.Tensor | None, float_activations: bool = False
    ) -> None:
        if not parts or len({p.cols for p in parts}) != 1:
            raise ValueError("a projection's parts must share their input width")
        self.weight = tuple(parts)
        self.bias = bias
        gemm: Gemm | None = None
        end = sum(p.rows for p in parts)
        kinds = []
        for p in reversed(parts):
            coding, operands = _part(p, float_activations)
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
