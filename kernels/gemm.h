/* What the projection units (f32_gemm.c, a8_gemm.c, a8_avx512.c, legacy_gemm.c, legacy_avx512.c,
 * kquant_gemm.c, kquant_x16.c, legacy_x16.c) share: horizontal sums, the prefetch of coded weights, the per-thread buffer, the 8-bit activations,
 * the legacy GGUF blocks' layout. Private to the library.
 *
 * NOTE: every unit including this is built with -ffp-contract=off and without -ffast-math: an
 * expression rounds as written, and a multiply-add fuses only where an intrinsic says so.
 */
#ifndef RADIXD_GEMM_H
#define RADIXD_GEMM_H

#include <immintrin.h>
#include <stdint.h>

#include "radixd.h"

/* Symbols the units share that stay out of the library's interface. */
#define INTERNAL __attribute__((visibility("hidden")))

static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

static inline float hmax(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
}

#define NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* A call splits its outputs over threads from this many multiply-accumulates (m x n x k); below it a
 * thread streams the weights alone. NOTE: one threshold for every unit: at one row a decode step's
 * smallest projections (~300k) must take both threads, or the step streams them at one core's speed. */
#define PARALLEL_MACS 65536

/* Outputs ahead whose weights a tile of coded weights asks for while it computes its own. A thread's outputs lie one after another, so this is the stream the hardware prefetcher
 * follows, but a tile reads 4 rows of a few hundred bytes at once and the prefetcher alone stays
 * too close behind. */
#define PREFETCH_OUTPUTS 8
/* Code bytes a group of 32 weights. */
#define GROUP_BYTES_q4_1 16
#define GROUP_BYTES_q8_0 32

/* Ask for the codes (`code_bytes` a group), scales and minimums (mn: NULL for Q8_0; `scale_bytes`
 * each) of the group PREFETCH_OUTPUTS rows past group `at`. Past the matrix's end the hints are for
 * nothing, harmlessly (a prefetch never faults). */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *codes, int64_t code_bytes,
                                                                 const void *d, const void *mn, int64_t scale_bytes,
                                                                 int64_t at, int64_t groups) {
    const int64_t ahead = at + PREFETCH_OUTPUTS * groups;
    _mm_prefetch((const char *)codes + ahead * code_bytes, _MM_HINT_T0);
    _mm_prefetch((const char *)d + ahead * scale_bytes, _MM_HINT_T0);
    if (mn) _mm_prefetch((const char *)mn + ahead * scale_bytes, _MM_HINT_T0);
}

/* A per-thread buffer of at least `n` floats, kept for the thread's next calls (f32_gemm.c). */
INTERNAL float *radixd_scratch(int64_t n);

/* One group of 32 inputs as int8 codes (in input order, one 256-bit vector), with its scale
 * e = amax / 127 and e * sum(codes) (Q4_1's minimums' term). */
static inline __attribute__((always_inline)) __m256i quantize_group(const float *p, float *e, float *es) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(p + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    float a = hmax(amax);
    __m256 inv = _mm256_set1_ps(a > 0 ? 127.0f / a : 0.0f);
    __m256i c[4];
    for (int i = 0; i < 4; i++) c[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], inv), NEAREST));
    /* packs interleave the 128-bit lanes; the permute puts inputs back in order */
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    b = _mm256_permutevar8x32_epi32(b, order);
    __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), b);
    __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    *e = a / 127.0f;
    *es = *e * (float)_mm_cvtsi128_si32(h);
    return b;
}

/* A call's activations, quantized, from the row a tile starts at: int8 codes q (stride k), scales e,
 * Q4_1's minimums' terms es (stride k / 32) and, on the AVX512 path, the lanes' starts c (a8_avx512.c;
 * e and c then have k / 4 entries a row, one per lane). */
typedef struct {
    int8_t *q;
    float *e, *es;
    int32_t *c;
} a8_rows;

/* fp16 bits: the a8 kinds' block scales and minimums, as the GGUF stores them (every Q4_1 / Q8_0
 * scale is an fp16 value), so a step streams 0.625 bytes a Q4_1 weight instead of 0.75. */
typedef uint16_t half;

typedef void (*a8_tile_fn)(const a8_rows *, int64_t, const void *, const half *, const half *, int64_t, float *,
                           int64_t);

/* a8_gemm.c: y = x W^T over the a8 kinds' blocks (fp16 scales), x quantized here. */
INTERNAL int radixd_a8_gemm(int kind, const float *x, int64_t m, int64_t k, const void *codes, const half *d,
                            const half *mn, int64_t n, float *y, int64_t ldy, int threads);

/* Whether this CPU runs the AVX512-VNNI tiles (a8_avx512.c, legacy_avx512.c): its features only, the
 * same answer for every call, so that a CPU runs one path for a given k. */
static inline int avx512_vnni(void) {
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

/* a8_avx512.c (AVX512-VNNI): x as pairs of groups, and the tiles that read them, [kind][rows 1 or 4]
 * [outputs 1 or 4]. Called only where the CPU has AVX512-VNNI, BW and VL. */
INTERNAL void radixd_quantize_pairs(const float *x, int64_t m, int64_t k, int q4, const a8_rows *out);
INTERNAL extern const a8_tile_fn radixd_a8w_tiles[2][2][2];

/* GGUF's legacy blocks of 32 weights as the file stores them: a block's bytes, and where its 5th bits
 * (qh, 4 bytes: bit j for input j) and its 16 bytes of nibbles (byte j: input j low, j + 16 high)
 * start; every block starts with its fp16 scale d (Q5_1: then its fp16 minimum). */
#define BLOCK_BYTES_q4_0 18
#define BLOCK_BYTES_q5_0 22
#define BLOCK_BYTES_q5_1 24
#define QH_AT_q5_0 2
#define QH_AT_q5_1 4
#define QS_AT_q4_0 2
#define QS_AT_q5_0 6
#define QS_AT_q5_1 8

/* legacy_gemm.c: radixd_gemm's parts of kinds Q4_0_A8, Q5_0_A8, Q5_1_A8 (x quantized as the a8 kinds
 * do), F16 and BF16 (fp32 arithmetic in the fp32 kind's order), into y's columns (row stride ldy);
 * 0 or -1 (no memory). And row `row` of such a part's W as fp32, the values the GGUF reader gives. */
INTERNAL int radixd_legacy_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads);
INTERNAL void radixd_legacy_dequantize_row(const radixd_proj *p, int64_t row, float *out);

/* legacy_avx512.c (AVX512-VNNI): the legacy kinds' tiles over radixd_quantize_pairs' activations (in
 * input order, lanes starting from -offset * sum(a)), [Q4_0, Q5_0, Q5_1][rows 1 or 4][outputs 1 or 4]. */
INTERNAL extern const a8_tile_fn radixd_legacy_wide_tiles[3][2][2];

/* kquant_gemm.c: one part of the K-quant kinds (Q4_K, Q5_K, Q6_K blocks as the GGUF stores them) times
 * 8-bit activations into y's columns from 0 (row stride ldy): 0, -1 (no memory) or -2; and one row of
 * its W as fp32, as gguf-py's dequantize computes it. */
INTERNAL int radixd_kquant_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads);
INTERNAL void radixd_kquant_dequantize_row(const radixd_proj *p, int64_t row, float *out);
/* kquant_gemm.c: rows of x [m, k] quantized per 256 inputs: codes q [m, k], scales e [m, k / 256],
 * the codes' sums per 16 s [m, k / 16]. */
INTERNAL void radixd_kquant_quantize_rows(const float *x, int64_t m, int64_t k, int8_t *q, float *e, int16_t *s);

/* kquant_x16.c (AVX512-VNNI): the kinds Q4_K_X16, Q6_K_X16 and Q5_K_X16 (16 rows' blocks interleaved by
 * radixd_kquant_repack), as radixd_kquant_gemm with the same bits; -2 where the CPU lacks
 * AVX512-VNNI. And one row of such a part as fp32. */
INTERNAL int radixd_kquant_x16_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads);
INTERNAL void radixd_kquant_x16_dequantize_row(const radixd_proj *p, int64_t row, float *out);

/* legacy_x16.c (AVX512-VNNI): the kinds Q4_1_X16, Q8_0_X16, Q5_0_X16, Q4_0_X16 and Q5_1_X16 (16 rows'
 * blocks interleaved by radixd_legacy_repack), the stored a8 kinds' weights and activations with each
 * group summed in int32 (other last bits); -2 where the CPU lacks AVX512-VNNI. And one row of such a
 * part as fp32. */
INTERNAL int radixd_legacy_x16_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads);
INTERNAL void radixd_legacy_x16_dequantize_row(const radixd_proj *p, int64_t row, float *out);

#endif
