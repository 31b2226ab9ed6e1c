"""int8 weights with a scale per 32 inputs (GGUF's Q8_0 layout) through a compiled AVX2 kernel.

The lm_head of the `int4` and `int8` modes (`llama.make_lm_head`): a tied 49,152 x 576 embedding
streams 28 MB of int8 codes and 3.5 MB of fp32 scales a step here instead of bf16's 57 MB. A Q8_0
embedding (the embedded model's) lies on this grid already: `quantize_groups` recovers the file's
own codes and scales, so the head loses nothing against the GGUF.

Torch has no CPU kernel for this layout that is faster than bf16 on an AVX2 machine without VNNI
(docs/bench-offline.md: `_weight_int8pack_mm` holds one scale per row only and ran slower than bf16's
`F.linear`; dequantizing blocks of rows and running the fp32 GEMM was 10x slower), so a small C
kernel is compiled once with the system's C compiler (cached under the weights cache directory)
and called through ctypes, which releases the GIL as torch's kernels do.

NOTE: the kernel is row-invariant by construction: every output sums its 18 groups of 32 products
in one fixed order (fp32 FMAs per group of 32, scaled into an 8-lane accumulator, then one fixed
horizontal sum) whatever the call's row count, the row's position in it or the thread count, so
a token's logits are bitwise the same in a decode step of any batch and in a prefill chunk. It
still runs behind `RowInvariant`, whose probe checks that at load like every projection's.
Activations go in as fp32 (bf16 converts exactly), logits come out fp32.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from radixd.daemon.model.invariant import RowInvariant
from radixd.daemon.model.linear import dequantize_groups, quantize_groups
from radixd.daemon.model.precision import cpu_flags

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>

static inline __m256 cvt8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

#define TILE 4

/* y[m, n] for rows m0 .. m0 + mt - 1: each row runs the same operations in the same order. */
static inline void tile(const float *x, int64_t k, const int8_t *qn, const float *sn, int64_t groups,
                        float *y, int64_t n_out, int64_t n, int64_t m0, int mt) {
    __m256 acc[TILE];
    for (int i = 0; i < TILE; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int8_t *qg = qn + g * 32;
        __m256 w0 = cvt8(qg), w1 = cvt8(qg + 8), w2 = cvt8(qg + 16), w3 = cvt8(qg + 24);
        __m256 sc = _mm256_broadcast_ss(sn + g);
        for (int i = 0; i < mt; i++) {
            const float *xg = x + (m0 + i) * k + g * 32;
            __m256 p = _mm256_mul_ps(_mm256_loadu_ps(xg), w0);
            p = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), w1, p);
            p = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), w2, p);
            p = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), w3, p);
            acc[i] = _mm256_fmadd_ps(p, sc, acc[i]);
        }
    }
    for (int i = 0; i < mt; i++) y[(m0 + i) * n_out + n] = hsum(acc[i]);
}

/* y [m, n_out] = x [m, k] . (q [n_out, k] * s [n_out, k / 32] per group of 32)^T, all contiguous. */
void q8_gemm(const float *x, int64_t m, int64_t k, const int8_t *q, const float *s, int64_t n_out,
             float *y, int threads) {
    int64_t groups = k / 32;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < n_out; n++)
        for (int64_t m0 = 0; m0 < m; m0 += TILE)
            tile(x, k, q + n * k, s + n * groups, groups, y, n_out, n, m0,
                 (int)(m - m0 < TILE ? m - m0 : TILE));
}
"""
_FLAGS = ("-O2", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")


def _build(cache: Path) -> Path:
    """The kernel's shared library, compiled into `cache` unless there already (keyed by source and
    flags; written under a temporary name and renamed, so concurrent builds never load a torn file)."""
    key = hashlib.sha256((_SOURCE + " ".join(_FLAGS)).encode()).hexdigest()[:16]
    lib = cache / f"q8_gemm-{key}.so"
    if lib.exists():
        return lib
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise RuntimeError("no C compiler (cc or $CC) on PATH")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src, out = Path(tmp) / "q8_gemm.c", Path(tmp) / "q8_gemm.so"
        src.write_text(_SOURCE)
        subprocess.run([cc, *_FLAGS, str(src), "-o", str(out)], check=True, capture_output=True)
        os.replace(out, lib)
    return lib


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    """The loaded kernel, or None where it cannot run (not x86-64 with AVX2 and FMA, no compiler)."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= cpu_flags():
        return None
    # NOTE: imported here: the loaders import the model package, which imports this module.
    from radixd.daemon.loaders.cache import cache_root

    try:
        lib = ctypes.CDLL(str(_build(cache_root() / "kernels")))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        log.warning("int8 lm_head kernel unavailable (%s); the lm_head runs as before", e)
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.q8_gemm.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ctypes.c_int]
    lib.q8_gemm.restype = None
    return lib


def q8_available() -> bool:
    """Whether `Q8Linear` runs on this machine (x86-64 with AVX2 and FMA, and a C compiler)."""
    return _kernel() is not None


class Q8Linear:
    """int8 weights [out, in] with an fp32 scale per 32 inputs (`quantize_groups`); returns fp32.
    `weight` is the dequantized matrix in `dtype` (a tied embedding looks its rows up there)."""

    def __init__(self, w_out_in: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        lib = _kernel()
        if lib is None:
            raise RuntimeError("the int8 kernel needs an x86-64 CPU with AVX2 and FMA and a C compiler")
        if w_out_in.device.type != "cpu":
            raise ValueError(f"int8 weights run on CPU only, got {w_out_in.device}")
        self._gemm = lib.q8_gemm
        q, scale = quantize_groups(w_out_in)
        self.q, self.scale = q.contiguous(), scale.contiguous()
        self.weight = dequantize_groups(self.q, self.scale).to(dtype)
        self.bias = bias
        out_f, in_f = q.shape
        kind = "q8" if bias is None else "q8+bias"
        self._rows = RowInvariant(kind, self._kernel, in_f, out_f, dtype, q.device)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32).contiguous()
        out_f, in_f = self.q.shape
        if xf.dim() != 2 or xf.shape[1] != in_f:
            raise ValueError(f"expected [N, {in_f}] inputs, got {list(x.shape)}")
        y = torch.empty(xf.shape[0], out_f, dtype=torch.float32)
        if xf.shape[0]:
            self._gemm(
                xf.data_ptr(),
                xf.shape[0],
                in_f,
                self.q.data_ptr(),
                self.scale.data_ptr(),
                out_f,
                y.data_ptr(),
                torch.get_num_threads(),
            )
        return y if self.bias is None else y + self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x)
