"""fp32 projections through a compiled kernel with one summation order for every row count.

The float32 mode (`auto` on a CPU without AVX512-BF16 / AMX, and the reference that equals
transformers) runs every projection and the lm_head here (`llama.make_linear`). Torch's fp32 CPU
kernels are fast but not row-invariant the way radixd needs (docs/batch-invariance-cost.md): MKL's
GEMM changes kernel below 4 rows, and oneDNN's inner product, invariant over weights packed for
batch 2, runs a one-row call at about half the speed of the weight stream. This kernel
(kernels/f32_gemm.c, compiled once by kernels/native.py, called through ctypes, which releases the
GIL) reads the plain [out, in] weights: a one-row call streams them at the memory's speed, and
tiles of up to 4 rows reach MKL's GEMM speed on prefill chunks (bench/projections_ab.py).

Weights that a GGUF stored in Q4_1 or Q8_0 blocks (the embedded model's layers and embedding) are
kept as those blocks, recovered from the fp32 matrix at load and checked bit for bit: a call expands
a few rows at a time into fp32, exactly as the GGUF reader did, right before the same tiles read
them, so it streams 6 or 9 bits per weight (fp32 scales) instead of 32 and still returns bitwise the
result of the fp32 weights. Other weights (a Hugging Face checkpoint's) run as fp32.

The w4a8 mode runs the same blocks times activations quantized to 8 bits per 32 inputs, multiplied
in integers (`int8_activations`; kernels/a8_gemm.c, and a8_avx512.c on CPUs with AVX512-VNNI): not
the fp32 product, but no expansion of the weights to fp32, so a one-row step that is compute-bound on
the expansion runs faster (docs/bench-single-stream.md). Weights without GGUF blocks stay fp32 there
too.

NOTE: row-invariant by construction: each output sums its products in 8 lanes over k in increasing
order, then one fixed horizontal sum, whatever the row count, the row's position or the thread
count. It still runs behind `RowInvariant`, whose probe checks that at load like every projection's.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from collections.abc import Callable, Sequence

import torch

from radixd.daemon.model.invariant import RowInvariant
from radixd.daemon.model.linear import GROUP
from radixd.kernels.native import cpu_flags, load

# a8_gemm.c includes f32_gemm.c: one library holds both families.
_SOURCE = "a8_gemm.c"
_KINDS = {"f32": 0, "q4_1": 1, "q8_0": 2, "q4_1_a8": 3, "q8_0_a8": 4}  # the sources' SRC_*
# -O3: the tiles' loops over their constant row and output counts must unroll for the accumulators to
# stay in registers.
# -ffp-contract=off: expanding a Q4_1 weight must round (d * q) and then + m on their own, as the GGUF
# reader's numpy does, never as one FMA.
# -march=native: the w4a8 kernels take their AVX512-VNNI path where the CPU has it (a8_avx512.c).
# NOTE: the same flags as the step's library (native_decoder.py), so that both run the same path.
FLAGS = (
    "-O3",
    "-march=native",
    "-mavx2",
    "-mfma",
    "-mf16c",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fopenmp",
)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels (`f32_gemm`, `q4_1_gemm`, `q8_0_gemm`, their 8-bit-activation twins
    `q4_1_a8_gemm` and `q8_0_a8_gemm`, and the encoders), or None where they
    cannot run (not x86-64 with AVX2, FMA and F16C, no compiler)."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma", "f16c"} <= cpu_flags():
        return None
    lib = load(_SOURCE, FLAGS, "fp32 projections run through oneDNN")
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    i32 = ctypes.c_int
    lib.f32_gemm.argtypes = [ptr, i64, i64, ptr, i64, ptr, i32]
    lib.q4_1_gemm.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, i32]
    lib.q8_0_gemm.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, i32]
    lib.q4_1_a8_gemm.argtypes = lib.q4_1_gemm.argtypes
    lib.q8_0_a8_gemm.argtypes = lib.q8_0_gemm.argtypes
    lib.q4_1_encode.argtypes = [ptr, i64, i64, ptr, ptr, ptr]
    lib.q8_0_encode.argtypes = [ptr, i64, i64, ptr, ptr]
    gemms = (lib.f32_gemm, lib.q4_1_gemm, lib.q8_0_gemm, lib.q4_1_a8_gemm, lib.q8_0_a8_gemm)
    for f in (*gemms, lib.q4_1_encode, lib.q8_0_encode):
        f.restype = i32
    return lib


def _blocks(lib: ctypes.CDLL, w: torch.Tensor) -> tuple[str, list[torch.Tensor]] | None:
    """The GGUF blocks `w` expands from bit for bit: ("q4_1", [codes, d, m]) or ("q8_0", [codes, d]);
    None for other weights."""
    out_f, in_f = w.shape
    if in_f % GROUP or not out_f:
        return None
    d = torch.empty(out_f, in_f // GROUP)
    mn = torch.empty_like(d)
    nib = torch.empty(out_f, in_f // 2, dtype=torch.uint8)
    if lib.q4_1_encode(w.data_ptr(), out_f, in_f, nib.data_ptr(), d.data_ptr(), mn.data_ptr()):
        return "q4_1", [nib, d, mn]
    q8 = torch.empty(out_f, in_f, dtype=torch.int8)
    if lib.q8_0_encode(w.data_ptr(), out_f, in_f, q8.data_ptr(), d.data_ptr()):
        return "q8_0", [q8, d]
    return None


def f32_available() -> bool:
    """Whether `F32Linear` runs on this machine (x86-64 with AVX2, FMA and F16C, and a C compiler)."""
    return library() is not None


def run_gemm(
    gemm: Callable[..., int],
    operands: Sequence[int],
    x: torch.Tensor,
    shape: Sequence[int],
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """x W^T + b in fp32 through one of `library()`'s GEMMs over its weight `operands` (data pointers,
    in its argument order); `shape`: W's (out, in); x: [N, in] of any float dtype (bf16 converts
    exactly)."""
    out_f, in_f = shape
    if x.dim() != 2 or x.shape[1] != in_f:
        raise ValueError(f"expected [N, {in_f}] inputs, got {list(x.shape)}")
    xf = x.to(torch.float32).contiguous()
    y = torch.empty(xf.shape[0], out_f, dtype=torch.float32)
    if xf.shape[0] and gemm(
        xf.data_ptr(), xf.shape[0], in_f, *operands, out_f, y.data_ptr(), torch.get_num_threads()
    ):
        raise MemoryError("the projection kernel could not allocate its buffer")
    return y if bias is None else y + bias


class F32Linear:
    """fp32 `y = x W^T + b` over the [out, in] weight as given (`weight` is that very tensor), run from
    its GGUF blocks where it has them and `gguf_blocks` allows (`coding`: "q4_1", "q8_0" or "f32"),
    with `int8_activations` those blocks times 8-bit activations ("q4_1_a8", "q8_0_a8")."""

    def __init__(
        self,
        w_out_in: torch.Tensor,
        bias: torch.Tensor | None,
        gguf_blocks: bool = True,
        int8_activations: bool = False,
    ) -> None:
        lib = library()
        if lib is None:
            raise RuntimeError("the fp32 kernel needs an x86-64 CPU with AVX2 and FMA and a C compiler")
        if w_out_in.device.type != "cpu" or w_out_in.dtype != torch.float32:
            raise ValueError(f"F32Linear runs fp32 weights on CPU, got {w_out_in.dtype} on {w_out_in.device}")
        self.weight = w_out_in.contiguous()
        self.bias = bias
        blocks = _blocks(lib, self.weight) if gguf_blocks else None
        self.coding, self._operands = blocks if blocks is not None else ("f32", [self.weight])
        if int8_activations and blocks is not None:
            self.coding += "_a8"
            # The a8 kernels read the scales (and minimums) as the fp16 values they are (the encoder
            # keeps only blocks whose scales are fp16 values): fewer bytes streamed a step.
            codes, *scales = self._operands
            halves = [t.half() for t in scales]
            assert all(torch.equal(h.float(), t) for h, t in zip(halves, scales, strict=True))
            self._operands = [codes, *halves]
        self._gemm = getattr(lib, f"{self.coding}_gemm")
        self._ptrs = [t.data_ptr() for t in self._operands]  # NOTE: the tensors live as long as self
        out_f, in_f = self.weight.shape
        kind = self.coding if bias is None else f"{self.coding}+bias"
        self._rows = RowInvariant(kind, self._kernel, in_f, out_f, torch.float32, self.weight.device)

    def source(self) -> tuple[int, int, int, int]:
        """The weights as kernels/a8_gemm.c's `any_gemm` takes them: (kind: 0 fp32, 1 Q4_1, 2 Q8_0,
        3 Q4_1 x 8-bit activations, 4 Q8_0 x 8-bit activations, then the data pointers of the weights
        or codes, the scales and the minimums (fp32, fp16 for kinds 3 and 4); 0 where unused). They
        stay valid as long as this projection lives."""
        ptrs = [*self._ptrs, 0, 0][:3]
        return _KINDS[self.coding], ptrs[0], ptrs[1], ptrs[2]

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return run_gemm(self._gemm, self._ptrs, x, self.weight.shape, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)


class Widened16Linear:
    """16-bit weights (`weight`, as given) computed by `F32Linear` over their exact fp32 values, the
    result rounded to their dtype (bias added in fp32 first, as `F.linear` does).

    For CPUs without native bf16 (AVX512-BF16 / AMX), where torch's 16-bit GEMM is emulated: there
    oneDNN's kernel sums a row in an order that depends on the call's row count (measured on an
    AVX512F CPU: 2 rows differ from 1, and 65 from 512), and the bf16 rounding of its output hides
    most of those differences from the probe of `invariant.py`, so no probed plan is safe. The fp32
    kernel is row-invariant by construction. It holds an fp32 copy of the weights beside them: on such
    CPUs the 16-bit modes are never `auto`'s pick, and fp32 runs there faster anyway."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = w_out_in
        self.bias = bias
        wide_bias = None if bias is None else bias.float()
        self._f32 = F32Linear(w_out_in.float(), wide_bias, gguf_blocks=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._f32(x).to(self.weight.dtype)
