/* The w4a8 projections on CPUs with AVX512-VNNI: a8_gemm.c runs them where the CPU has it and a
 * call's inputs are whole pairs of groups. The one unit built with AVX512 flags (native.py).
 *
 * Why: a one-row step is compute-bound on the AVX2 path's work per group and output (unpack,
 * maddubs + madd, a scalar scale, a scalar minimum's term). Here one vpdpbusd multiplies and sums
 * two groups (64 codes), the two groups' scales are one vector product, and the minimums' terms are
 * one vector dot product per output after the loop.
 *
 * Layout: a pair of groups (2p, 2p + 1) is 64 activation bytes. Q4_1 holds input j of a group in
 * the low nibble of byte j and input j + 16 in the high one, so a pair's 32 code bytes unpack (a
 * broadcast load, a shift of the upper half, an and) to inputs [g0 0-15, g1 0-15, g0 16-31, g1
 * 16-31], and the activations are stored in that order; Q8_0's 64 code bytes are in input order.
 * vpdpbusd sums 4 bytes into each of 16 int32 lanes, so lane l belongs to group (l / 4) % 2 of the
 * pair for Q4_1 and l / 8 for Q8_0 (`lane_groups`); scales are spread over the lanes the same way.
 * vpdpbusd multiplies unsigned by signed bytes: Q4_1's codes are 0..15; Q8_0's signed codes w enter
 * as w + 128 (w ^ 0x80) and each lane starts from -128 * the sum of its 4 activation codes, so it
 * holds exactly sum(w * a).
 *
 * NOTE: row-invariant by construction, as the AVX2 path: an output accumulates its pairs in order
 * (16 lanes, one FMA each), then one fixed horizontal sum, plus its minimums' term summed 16 groups
 * a vector in order; the same operations in every tile, at any row count, position or thread count.
 * Its results differ from the AVX2 path's in the last bits (other lanes): for a given k, a CPU
 * runs one path only. */
#include <string.h>

#include "gemm.h"

/* The group (0 or 1 of its pair) each int32 lane of a pair's dot product sums. */
static inline __m512i lane_groups(int q4) {
    return q4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1)
              : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
}

/* A pair's two scales spread over the lanes of their groups: floats, or fp16 bits widened. */
static inline __m512 spread(const float *two, __m512i lanes) {
    const __m128 v = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)two));
    return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(v));
}

static inline __m512 spread_half(const half *two, __m512i lanes) {
    int32_t bits;
    memcpy(&bits, two, sizeof bits);
    return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(bits))));
}

/* x [m, k] as a8_rows: codes per pair in the kind's order, e spread over the lanes [m, k / 64, 16],
 * Q8_0's lane starts c [m, k / 64, 16], es [m, k / 32] (Q4_1's minimums' terms, as the AVX2 path). */
void radixd_quantize_pairs(const float *x, int64_t m, int64_t k, int q4, const a8_rows *out) {
    const int64_t pairs = k / 64, groups = k / 32;
    const __m512i lanes = lane_groups(q4);
    for (int64_t r = 0; r < m; r++)
        for (int64_t p = 0; p < pairs; p++) {
            float e[2];
            float *es = out->es + r * groups + 2 * p;
            const __m256i b0 = quantize_group(x + r * k + p * 64, e, es);
            const __m256i b1 = quantize_group(x + r * k + p * 64 + 32, e + 1, es + 1);
            __m512i v;
            if (q4) /* [b0 low half, b1 low half, b0 high half, b1 high half] */
                v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(b0, b1, 0x20)),
                                       _mm256_permute2x128_si256(b0, b1, 0x31), 1);
            else
                v = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
            _mm512_storeu_si512(out->q + r * k + p * 64, v);
            const int64_t at = (r * pairs + p) * 16;
            _mm512_storeu_ps(out->e + at, spread(e, lanes));
            if (!q4) {
                const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), v);
                _mm512_storeu_si512(out->c + at, _mm512_sub_epi32(_mm512_setzero_si512(), sums));
            }
        }
}

/* A pair's weight codes as vpdpbusd's unsigned operand, and the lanes' starting values. */
static inline __attribute__((always_inline)) __m512i pair_q4_1(const void *codes, int64_t at) {
    const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const uint8_t *)codes + at * 16)));
    return _mm512_and_si512(_mm512_srlv_epi64(b, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)), _mm512_set1_epi8(0x0F));
}

static inline __attribute__((always_inline)) __m512i pair_q8_0(const void *codes, int64_t at) {
    const __m512i w = _mm512_loadu_si512((const int8_t *)codes + at * 32);
    return _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
}

static inline __attribute__((always_inline)) __m512i start_q4_1(const int32_t *c) {
    (void)c;
    return _mm512_setzero_si512();
}

static inline __attribute__((always_inline)) __m512i start_q8_0(const int32_t *c) { return _mm512_loadu_si512(c); }

/* sum over g of mn[g] * es[g], 16 groups a vector in order, then one fixed horizontal sum. */
static inline float mins_dot(const half *mn, const float *es, int64_t groups) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        const __mmask16 live = groups - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (groups - g)) - 1);
        const __m512 m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, mn + g));
        acc = _mm512_fmadd_ps(m, _mm512_maskz_loadu_ps(live, es + g), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* NT outputs from j0 for MT rows of `x` (a8_rows at the tile's first row), weights of KIND. */
#define A8WTILE(KIND, Q4, MT, NT)                                                                       \
    static void a8w_##KIND##_##MT##_##NT(const a8_rows *x, int64_t k, const void *codes, const half *d, \
                                         const half *mn, int64_t j0, float *y, int64_t ldy) {           \
        const int64_t pairs = k / 64, groups = k / 32;                                                 \
        const __m512i lanes = lane_groups(Q4);                                                         \
        __m512 acc[MT][NT];                                                                            \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) acc[i][j] = _mm512_setzero_ps();                              \
        for (int64_t p = 0; p < pairs; p++) {                                                          \
            __m512i a[MT];                                                                             \
            __m512 e[MT];                                                                              \
            for (int i = 0; i < MT; i++) {                                                             \
                a[i] = _mm512_loadu_si512(x->q + i * k + p * 64);                                      \
                e[i] = _mm512_loadu_ps(x->e + (i * pairs + p) * 16);                                   \
            }                                                                                          \
            for (int j = 0; j < NT; j++) {                                                             \
                const int64_t at = (j0 + j) * groups + 2 * p;                                          \
                prefetch_ahead(codes, GROUP_BYTES_##KIND, d, mn, 2, at, groups);                       \
                const __m512i w = pair_##KIND(codes, at);                                              \
                const __m512 dv = spread_half(d + at, lanes);                                          \
                for (int i = 0; i < MT; i++) {                                                         \
                    const __m512i s = _mm512_dpbusd_epi32(start_##KIND(x->c + (i * pairs + p) * 16), w, a[i]); \
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, e[i]), acc[i][j]); \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) {                                                             \
                const float mins = Q4 ? mins_dot(mn + (j0 + j) * groups, x->es + i * groups, groups) : 0.0f; \
                y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]) + mins;                               \
            }                                                                                          \
    }

#define A8WTILES(KIND, Q4) A8WTILE(KIND, Q4, 1, 1) A8WTILE(KIND, Q4, 1, 4) A8WTILE(KIND, Q4, 4, 1) A8WTILE(KIND, Q4, 4, 4)
A8WTILES(q4_1, 1)
A8WTILES(q8_0, 0)

const a8_tile_fn radixd_a8w_tiles[2][2][2] = {
    {{a8w_q4_1_1_1, a8w_q4_1_1_4}, {a8w_q4_1_4_1, a8w_q4_1_4_4}},
    {{a8w_q8_0_1_1, a8w_q8_0_1_4}, {a8w_q8_0_4_1, a8w_q8_0_4_4}}};
