/* Projections over GGUF blocks with 8-bit activations: radixd_gemm's a8 kinds (the w4a8 mode).
 *
 * A call quantizes each row of x per group of 32 inputs to int8 (symmetric: scale amax / 127, round
 * to nearest even) and multiplies the codes by the weights' codes in integers, as llama.cpp's
 * Q4_1 x Q8_1 and Q8_0 x Q8_0 dot products do: 32 products in one maddubs + madd instead of 32 fp32
 * FMAs on weights expanded first, which is what makes a one-row step compute-bound in f32_gemm.c.
 * For a Q4_1 group (w = d * q + m) and activation codes a with scale e:
 *     sum(w * x) ~ d * e * sum(q * a) + m * (e * sum(a))
 * NOTE: the result is not the fp32 product (the activations lose ~8 bits per group); the quality
 * contract bounds what that costs (docs/measurements/bench-offline.md). It is row-invariant by construction:
 * a row is quantized on its own, and each output sums its groups in increasing order (8 int32 lanes
 * of a group converted and added by one FMA each, the minimums' terms in a scalar in the same order,
 * one fixed horizontal sum last), whatever the row count, the row's position or the thread count.
 * On CPUs with AVX512-VNNI calls whose inputs are whole pairs of groups run a8_avx512.c's tiles
 * instead: the same arithmetic, two groups per instruction. The weights' scales and minimums are
 * fp16 here (the values the GGUF stores). */
#include "gemm.h"

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

/* y [m, n] = x [m, k] . W [n, k]^T over Q4_1 (kind RADIXD_W_Q4_1_A8: codes, d, mn) or Q8_0 (RADIXD_W_Q8_0_A8:
 * codes, d) blocks, x quantized here. Threads split the outputs into blocks of 4; rows run in tiles of
 * 4 (each unpacked weight group serves 4 rows), the rest one at a time. Returns 0, or -1 where the
 * activations' buffer could not be allocated (y is then unset). */
int radixd_a8_gemm(int kind, const float *x, int64_t m, int64_t k, const void *codes, const half *d,
                    const half *mn, int64_t n, float *y, int64_t ldy, int threads) {
    const int64_t groups = k / 32;
    const int q4 = kind == RADIXD_W_Q4_1_A8;
    /* NOTE: the path depends on the build and on k only, so a row's result never depends on its call. */
    const int wide = groups % 2 == 0 && avx512_vnni();
    const int64_t per_row = wide ? groups * 8 : groups; /* entries of e and c a row */
    /* NOTE: the calling thread's scratch (radixd_scratch), reused across calls: the tiles below never
     * touch it, and a decode step makes ~120 of these calls. Scales first, then the codes. */
    float *buf = radixd_scratch(m * (2 * per_row + groups) + (m * k + 3) / 4);
    if (!buf) return -1;
    a8_rows rows = {(int8_t *)(buf + m * (2 * per_row + groups)), buf, buf + m * 2 * per_row,
                    (int32_t *)(buf + m * per_row)};
    const a8_tile_fn(*fns)[2] = A8_TILES[q4 ? 0 : 1];
    int wide_nt = 2;
    if (wide) {
        radixd_quantize_pairs(x, m, k, q4, &rows);
        fns = radixd_a8w_tiles[q4 ? 0 : 1];
        wide_nt = 4;
    } else
        quantize_rows(x, m, k, rows.q, rows.e, rows.es);
    const half *mins = q4 ? mn : 0;
    const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (n * m * k >= PARALLEL_MACS)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t j0 = 4 * b, j1 = j0 + 4 < n ? j0 + 4 : n;
        for (int64_t r = 0; r < m;) {
            const int mt = r + 4 <= m ? 4 : 1;
            const int nt = mt == 4 ? wide_nt : 4;
            const a8_rows at = {rows.q + r * k, rows.e + r * per_row, rows.es + r * groups, rows.c + r * per_row};
            float *yr = y + r * ldy;
            for (int64_t j = j0; j < j1;) {
                if (j + nt <= j1) {
                    fns[mt == 4][1](&at, k, codes, d, mins, j, yr + j, ldy);
                    j += nt;
                } else {
                    fns[mt == 4][0](&at, k, codes, d, mins, j, yr + j, ldy);
                    j += 1;
                }
            }
            r += mt;
        }
    }
    return 0;
}
