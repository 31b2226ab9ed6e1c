/* Projections over GGUF blocks with 8-bit activations: the w4a8 mode's (daemon/model/f32.py), built
 * and loaded by kernels/native.py together with f32_gemm.c, which this file includes.
 *
 * A call quantizes each row of x per group of 32 inputs to int8 (symmetric: scale amax / 127, round
 * to nearest even) and multiplies the codes by the weights' codes in integers, as llama.cpp's
 * Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products do: 32 products in one maddubs + madd instead of 32 fp32
 * FMAs on weights expanded first, which is what makes a one-row step compute-bound in f32_gemm.c.
 * For a Q4_1 group (w = d * q + m) and activation codes a with scale e:
 *     sum(w * x) ~ d * e * sum(q * a) + m * (e * sum(a))
 * NOTE: the result is not the fp32 product (the activations lose ~8 bits per group); the quality
 * contract bounds what that costs (docs/bench-offline.md). It is row-invariant by construction:
 * a row is quantized on its own, and each output sums its groups in increasing order (8 int32 lanes
 * of a group converted and added by one FMA each, the minimums' terms in a scalar in the same order,
 * one fixed horizontal sum last), whatever the row count, the row's position or the thread count.
 * On CPUs with AVX512-VNNI (a build with -march=native there) calls whose inputs are whole pairs of
 * groups run a8_avx512.c's tiles instead: the same arithmetic, two groups per instruction. The
 * weights' scales and minimums are fp16 here (the values the GGUF stores). */
#include "f32_gemm.c"

enum { SRC_Q4_1_A8 = 3, SRC_Q8_0_A8 = 4 };

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

/* Row r of x [m, k] as int8 codes per group of 32 (q [m, k]), their scales e [m, k / 32] and, for
 * Q4_1's minimums, e * sum(codes) per group (es [m, k / 32]). */
static void quantize_rows(const float *x, int64_t m, int64_t k, int8_t *q, float *e, float *es) {
    const int64_t groups = k / 32;
    for (int64_t r = 0; r < m; r++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t at = r * groups + g;
            __m256i b = quantize_group(x + r * k + g * 32, e + at, es + at);
            _mm256_storeu_si256((__m256i *)(q + r * k + g * 32), b);
        }
}

/* sum over one group of (weight code * activation code) in 8 int32 lanes. Q4_1: byte j of the 16 holds
 * input j in its low nibble and input j + 16 in its high one; codes 0..15 are unsigned for maddubs. */
static inline __attribute__((always_inline)) __m256i dot_q4_1(const void *codes, int64_t at, __m256i a) {
    __m128i b = _mm_loadu_si128((const __m128i *)((const uint8_t *)codes + at * 16));
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    __m256i u = _mm256_set_m128i(hi, lo);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}

/* Q8_0: codes -127..127 (never -128), so |w| is unsigned and the sign moves onto a. */
static inline __attribute__((always_inline)) __m256i dot_q8_0(const void *codes, int64_t at, __m256i a) {
    __m256i w = _mm256_loadu_si256((const __m256i *)((const int8_t *)codes + at * 32));
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
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

/* NT outputs from j0 for MT rows of the quantized x, weights of KIND. The same operations in the
 * same order for an output whatever the tile: a row's result does not depend on its tile. */
#define A8TILE(KIND, MT, NT)                                                                            \
    static void a8_##KIND##_##MT##_##NT(const a8_rows *x, int64_t k, const void *codes, const half *d, \
                                        const half *mn, int64_t j0, float *y, int64_t ldy) {           \
        const int64_t groups = k / 32;                                                                 \
        __m256 acc[MT][NT];                                                                            \
        float macc[MT][NT];                                                                            \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps(), macc[i][j] = 0.0f;           \
        for (int64_t g = 0; g < groups; g++) {                                                         \
            __m256i a[MT];                                                                             \
            for (int i = 0; i < MT; i++) a[i] = _mm256_loadu_si256((const __m256i *)(x->q + i * k + g * 32)); \
            for (int j = 0; j < NT; j++) {                                                             \
                const int64_t at = (j0 + j) * groups + g;                                              \
                prefetch_ahead(codes, GROUP_BYTES_##KIND, d, mn, 2, at, groups);                       \
                for (int i = 0; i < MT; i++) {                                                         \
                    __m256i p = dot_##KIND(codes, at, a[i]);                                           \
                    __m256 s = _mm256_set1_ps(_cvtsh_ss(d[at]) * x->e[i * groups + g]);                \
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[i][j]);                  \
                    if (mn) macc[i][j] += _cvtsh_ss(mn[at]) * x->es[i * groups + g];                   \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) y[i * ldy + j] = hsum(acc[i][j]) + macc[i][j];                \
    }

#define A8TILES(KIND) A8TILE(KIND, 1, 1) A8TILE(KIND, 1, 4) A8TILE(KIND, 4, 1) A8TILE(KIND, 4, 2)
A8TILES(q4_1)
A8TILES(q8_0)

/* [kind][rows 1 or 4][outputs: 1, or the wide tile (4 for one row, 2 for four)] */
static const a8_tile_fn A8_TILES[2][2][2] = {
    {{a8_q4_1_1_1, a8_q4_1_1_4}, {a8_q4_1_4_1, a8_q4_1_4_2}},
    {{a8_q8_0_1_1, a8_q8_0_1_4}, {a8_q8_0_4_1, a8_q8_0_4_2}}};

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define A8_AVX512 1
#include "a8_avx512.c"
#else
#define A8_AVX512 0
#endif

/* y [m, n] = x [m, k] . W [n, k]^T over Q4_1 (kind SRC_Q4_1_A8: codes, d, mn) or Q8_0 (SRC_Q8_0_A8:
 * codes, d) blocks, x quantized here. Threads split the outputs into blocks of 4; rows run in tiles of
 * 4 (each unpacked weight group serves 4 rows), the rest one at a time. Returns 0, or -1 where the
 * activations' buffer could not be allocated (y is then unset). */
static int a8_gemm(int kind, const float *x, int64_t m, int64_t k, const void *codes, const half *d,
                   const half *mn, int64_t n, float *y, int threads) {
    const int64_t groups = k / 32;
    const int q4 = kind == SRC_Q4_1_A8;
    /* NOTE: the path depends on the build and on k only, so a row's result never depends on its call. */
    const int wide = A8_AVX512 && groups % 2 == 0;
    const int64_t per_row = wide ? groups * 8 : groups; /* entries of e and c a row */
    /* NOTE: the calling thread's scratch (f32_gemm.c), reused across calls: the tiles below never
     * touch it, and a decode step makes ~120 of these calls. Scales first, then the codes. */
    float *buf = scratch(m * (2 * per_row + groups) + (m * k + 3) / 4);
    if (!buf) return -1;
    a8_rows rows = {(int8_t *)(buf + m * (2 * per_row + groups)), buf, buf + m * 2 * per_row,
                    (int32_t *)(buf + m * per_row)};
    const a8_tile_fn(*fns)[2] = A8_TILES[q4 ? 0 : 1];
    int wide_nt = 2;
#if A8_AVX512
    if (wide) {
        quantize_pairs(x, m, k, q4, &rows);
        fns = A8W_TILES[q4 ? 0 : 1];
        wide_nt = 4;
    } else
#endif
        quantize_rows(x, m, k, rows.q, rows.e, rows.es);
    const half *mins = q4 ? mn : 0;
    const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (blocks * m * k >= 65536)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t j0 = 4 * b, j1 = j0 + 4 < n ? j0 + 4 : n;
        for (int64_t r = 0; r < m;) {
            const int mt = r + 4 <= m ? 4 : 1;
            const int nt = mt == 4 ? wide_nt : 4;
            const a8_rows at = {rows.q + r * k, rows.e + r * per_row, rows.es + r * groups, rows.c + r * per_row};
            float *yr = y + r * n;
            for (int64_t j = j0; j < j1;) {
                if (j + nt <= j1) {
                    fns[mt == 4][1](&at, k, codes, d, mins, j, yr + j, n);
                    j += nt;
                } else {
                    fns[mt == 4][0](&at, k, codes, d, mins, j, yr + j, n);
                    j += 1;
                }
            }
            r += mt;
        }
    }
    return 0;
}

/* Any projection kind: fp32 / Q4_1 / Q8_0 weights as f32_gemm.c runs them, or the blocks times 8-bit
 * activations (the w4a8 mode). The one entry point of the decoder (cpu_decoder.c). */
static int any_gemm(int kind, const float *x, int64_t m, int64_t k, const void *w, const void *d,
                    const void *mn, int64_t n, float *y, int threads) {
    if (kind == SRC_Q4_1_A8 || kind == SRC_Q8_0_A8) return a8_gemm(kind, x, m, k, w, d, mn, n, y, threads);
    return gemm(kind, x, m, k, w, (const float *)d, (const float *)mn, n, y, threads);
}

/* Q4_1 blocks x 8-bit activations: codes [n, k / 2], d and mn [n, k / 32] fp16. */
int q4_1_a8_gemm(const float *x, int64_t m, int64_t k, const uint8_t *codes, const half *d, const half *mn,
                 int64_t n, float *y, int threads) {
    return a8_gemm(SRC_Q4_1_A8, x, m, k, codes, d, mn, n, y, threads);
}

/* Q8_0 blocks x 8-bit activations: codes [n, k] int8, d [n, k / 32] fp16. */
int q8_0_a8_gemm(const float *x, int64_t m, int64_t k, const int8_t *codes, const half *d, int64_t n, float *y,
                 int threads) {
    return a8_gemm(SRC_Q8_0_A8, x, m, k, codes, d, 0, n, y, threads);
}
