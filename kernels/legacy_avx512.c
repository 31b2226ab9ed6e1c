/* The legacy GGUF blocks (Q4_0, Q5_0, Q5_1) times 8-bit activations on CPUs with AVX512-VNNI:
 * legacy_gemm.c runs these tiles where the CPU has it and a call's inputs are whole pairs of groups,
 * over radixd_quantize_pairs' activations in input order (as Q8_0's: a pair's 64 bytes are its two
 * groups one after the other, lane l of a vpdpbusd sums group l / 8's inputs).
 *
 * A pair's weights come from two blocks as the file stores them: each block's 16 nibble bytes twice,
 * the second copy shifted by 4, masked to [low nibbles, high nibbles] = inputs 0-31; the 5th bits
 * (Q5_0, Q5_1) of both blocks, one 32-bit word each, are then a 64-bit byte mask that adds 16 to the
 * codes it selects; both blocks' first 8 bytes widened from fp16 hold d (and Q5_1's minimum).
 * vpdpbusd multiplies the unsigned codes by the signed activations; the signed formats' lanes start
 * from -offset * the sum of their 4 activation codes (Q8_0's lane starts, -128 * that sum, divided
 * once a call), so a lane holds exactly sum((q - offset) * a). Q5_1's minimums are kept per output
 * and dotted with e * sum(a) after the pairs, 16 groups a vector in order.
 *
 * NOTE: row-invariant by construction, as legacy_gemm.c's AVX2 path: the same operations in every tile
 * for an output, its pairs in increasing order. Its results differ from that path's in the last bits
 * (other lanes): for a given k, a CPU runs one path only. */
#include <string.h>

#include "gemm.h"

static inline __attribute__((always_inline)) int64_t load64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) uint64_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Two blocks' nibbles in input order: 16 bytes of each block twice, the second copy shifted. */
static inline __attribute__((always_inline)) __m512i pair_nibbles(const uint8_t *qs0, const uint8_t *qs1) {
    const __m256i b0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs0));
    const __m256i b1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs1));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
    return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
}

/* The nibbles plus 16 where a block's 5th bit is set (qh at `at` in each block: bit j, input j). */
static inline __attribute__((always_inline)) __m512i with_fifth(__m512i v, const uint8_t *b0, const uint8_t *b1,
                                                                int at) {
    const __mmask64 bits = _cvtu64_mask64(load32(b0 + at) | load32(b1 + at) << 32);
    return _mm512_mask_add_epi8(v, bits, v, _mm512_set1_epi8(16));
}

/* A pair's codes (unsigned, input order) from its blocks b0, b1. */
static inline __attribute__((always_inline)) __m512i pair_q4_0(const uint8_t *b0, const uint8_t *b1) {
    return pair_nibbles(b0 + QS_AT_q4_0, b1 + QS_AT_q4_0);
}

static inline __attribute__((always_inline)) __m512i pair_q5_0(const uint8_t *b0, const uint8_t *b1) {
    return with_fifth(pair_nibbles(b0 + QS_AT_q5_0, b1 + QS_AT_q5_0), b0, b1, QH_AT_q5_0);
}

static inline __attribute__((always_inline)) __m512i pair_q5_1(const uint8_t *b0, const uint8_t *b1) {
    return with_fifth(pair_nibbles(b0 + QS_AT_q5_1, b1 + QS_AT_q5_1), b0, b1, QH_AT_q5_1);
}

#define OFFSET_q4_0 8
#define OFFSET_q5_0 16
#define OFFSET_q5_1 0

/* sum over g of mn[g] * es[g], 16 groups a vector in order, then one fixed horizontal sum. */
static inline float mins_dot(const float *mn, const float *es, int64_t groups) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        const __mmask16 live = groups - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (groups - g)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(live, mn + g), _mm512_maskz_loadu_ps(live, es + g), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* NT outputs from j0 for MT rows of `x` (a8_rows at the tile's first row); d and mn unused. */
#define LWTILE(KIND, MT, NT)                                                                            \
    static void lw_##KIND##_##MT##_##NT(const a8_rows *x, int64_t k, const void *w, const half *d,     \
                                        const half *mn, int64_t j0, float *y, int64_t ldy) {           \
        (void)d, (void)mn;                                                                             \
        const int64_t pairs = k / 64, groups = k / 32, row = groups * BLOCK_BYTES_##KIND;              \
        const uint8_t *blocks = (const uint8_t *)w + j0 * row;                                         \
        const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);       \
        const __m256i minimums = _mm256_setr_epi32(1, 5, 1, 5, 1, 5, 1, 5);                            \
        float *restrict mins = __builtin_alloca(sizeof(float) * (OFFSET_##KIND ? 1 : NT * groups));    \
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
                const uint8_t *b0 = blocks + j * row + 2 * p * BLOCK_BYTES_##KIND;                     \
                const uint8_t *b1 = b0 + BLOCK_BYTES_##KIND;                                           \
                _mm_prefetch((const char *)b0 + PREFETCH_OUTPUTS * row, _MM_HINT_T0);                  \
                const __m128i heads = _mm_set_epi64x(load64(b1), load64(b0));                         \
                const __m512i wv = pair_##KIND(b0, b1);                                                \
                const __m256 hv = _mm256_cvtph_ps(heads); /* d0 in lane 0, d1 in 4; Q5_1's m: 1, 5 */  \
                const __m512 dv = _mm512_permutexvar_ps(lanes, _mm512_castps256_ps512(hv));            \
                if (!OFFSET_##KIND)                                                                    \
                    _mm_storel_pi((__m64 *)(mins + j * groups + 2 * p),                                \
                                  _mm256_castps256_ps128(_mm256_permutevar8x32_ps(hv, minimums)));     \
                for (int i = 0; i < MT; i++) {                                                         \
                    const __m512i c = OFFSET_##KIND ? _mm512_loadu_si512(x->c + (i * pairs + p) * 16)  \
                                                    : _mm512_setzero_si512();                          \
                    const __m512i s = _mm512_dpbusd_epi32(c, wv, a[i]);                                \
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, e[i]), acc[i][j]); \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) {                                                             \
                const float m = OFFSET_##KIND ? 0.0f : mins_dot(mins + j * groups, x->es + i * groups, groups); \
                y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]) + m;                                  \
            }                                                                                          \
    }

#define LWTILES(KIND) LWTILE(KIND, 1, 1) LWTILE(KIND, 1, 4) LWTILE(KIND, 4, 1) LWTILE(KIND, 4, 4)
LWTILES(q4_0)
LWTILES(q5_0)
LWTILES(q5_1)

const a8_tile_fn radixd_legacy_wide_tiles[3][2][2] = {{{lw_q4_0_1_1, lw_q4_0_1_4}, {lw_q4_0_4_1, lw_q4_0_4_4}},
                                                      {{lw_q5_0_1_1, lw_q5_0_1_4}, {lw_q5_0_4_1, lw_q5_0_4_4}},
                                                      {{lw_q5_1_1_1, lw_q5_1_1_4}, {lw_q5_1_4_1, lw_q5_1_4_4}}};
