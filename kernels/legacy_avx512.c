/* The legacy GGUF blocks (Q4_0, Q5_0, Q5_1) times 8-bit activations on CPUs with AVX512-VNNI:
 * legacy_gemm.c runs these tiles where the CPU has it and a call's inputs are whole pairs of groups,
 * over radixd_quantize_pairs' activations in the nibbles' order (a8_avx512.c: a pair's 64 bytes are
 * [g0 0-15, g1 0-15, g0 16-31, g1 16-31], lane l of a vpdpbusd sums group (l / 4) % 2's inputs).
 *
 * A pair's weights come from two blocks as the file stores them: their 16 nibble bytes side by side,
 * unpacked as Q4_1's; the 5th bits of both blocks as one 64-bit byte mask (Q5_0, Q5_1) adding 16
 * to the codes it selects; the blocks' first 4 bytes widened from fp16 together ([d0, x0, d1, x1], x
 * Q5_1's minimum, or bytes of no meaning), d spread over its group's lanes. vpdpbusd multiplies the
 * unsigned codes by the signed activations; the signed formats' lanes start from -offset * the sum of
 * their 4 activation codes, so a lane holds exactly sum((q - offset) * a). Q5_1's minimums are kept
 * per output and dotted with e * sum(a) after the pairs, 16 groups a vector in order.
 *
 * NOTE: row-invariant by construction, as legacy_gemm.c's AVX2 path: the same operations in every tile
 * for an output, its pairs in increasing order. Its results differ from that path's in the last bits
 * (other lanes): for a given k, a CPU runs one path only. */
#include <string.h>

#include "gemm.h"

static inline __attribute__((always_inline)) uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Two blocks' nibbles in the pair's order. */
static inline __attribute__((always_inline)) __m512i pair_nibbles(const uint8_t *qs0, const uint8_t *qs1) {
    const __m256i b = _mm256_loadu2_m128i((const __m128i *)qs1, (const __m128i *)qs0);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(b), b, 1);
    return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)), _mm512_set1_epi8(0x0F));
}

/* Two blocks' 5th bits as a byte mask in the pair's order. */
static inline __attribute__((always_inline)) __mmask64 pair_fifth(const uint8_t *qh0, const uint8_t *qh1) {
    const uint64_t a = load32(qh0), b = load32(qh1);
    return (a & 0xFFFF) | (b & 0xFFFF) << 16 | (a >> 16) << 32 | (b >> 16) << 48;
}

static inline __attribute__((always_inline)) __m512i pair_q4_0(const uint8_t *b0, const uint8_t *b1) {
    return pair_nibbles(b0 + QS_AT_q4_0, b1 + QS_AT_q4_0);
}

static inline __attribute__((always_inline)) __m512i pair_q5_0(const uint8_t *b0, const uint8_t *b1) {
    const __m512i v = pair_nibbles(b0 + QS_AT_q5_0, b1 + QS_AT_q5_0);
    return _mm512_mask_add_epi8(v, pair_fifth(b0 + QH_AT_q5_0, b1 + QH_AT_q5_0), v, _mm512_set1_epi8(16));
}

static inline __attribute__((always_inline)) __m512i pair_q5_1(const uint8_t *b0, const uint8_t *b1) {
    const __m512i v = pair_nibbles(b0 + QS_AT_q5_1, b1 + QS_AT_q5_1);
    return _mm512_mask_add_epi8(v, pair_fifth(b0 + QH_AT_q5_1, b1 + QH_AT_q5_1), v, _mm512_set1_epi8(16));
}

/* A lane's start: -offset * the sum of its 4 activation codes (Q5_1: none). */
static inline __attribute__((always_inline)) __m512i start_of(int offset, __m512i a) {
    if (!offset) return _mm512_setzero_si512();
    const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)offset), a);
    return _mm512_sub_epi32(_mm512_setzero_si512(), sums);
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
        const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2);       \
        float mins[OFFSET_##KIND ? 1 : NT][OFFSET_##KIND ? 1 : groups];                                \
        __m512 acc[MT][NT];                                                                            \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) acc[i][j] = _mm512_setzero_ps();                              \
        for (int64_t p = 0; p < pairs; p++) {                                                          \
            __m512i a[MT], c[MT];                                                                      \
            __m512 e[MT];                                                                              \
            for (int i = 0; i < MT; i++) {                                                             \
                a[i] = _mm512_loadu_si512(x->q + i * k + p * 64);                                      \
                e[i] = _mm512_loadu_ps(x->e + (i * pairs + p) * 16);                                   \
                c[i] = start_of(OFFSET_##KIND, a[i]);                                                  \
            }                                                                                          \
            for (int j = 0; j < NT; j++) {                                                             \
                const uint8_t *b0 = blocks + j * row + 2 * p * BLOCK_BYTES_##KIND;                     \
                const uint8_t *b1 = b0 + BLOCK_BYTES_##KIND;                                           \
                _mm_prefetch((const char *)b0 + PREFETCH_OUTPUTS * row, _MM_HINT_T0);                  \
                const __m512i wv = pair_##KIND(b0, b1);                                                \
                const __m128 heads = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)load32(b0)), \
                                                                   (int)load32(b1), 1));               \
                const __m512 dv = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(heads));         \
                if (!OFFSET_##KIND)                                                                    \
                    _mm_storel_pi((__m64 *)&mins[j][2 * p],                                               \
                                  _mm_shuffle_ps(heads, heads, _MM_SHUFFLE(3, 1, 3, 1)));              \
                for (int i = 0; i < MT; i++) {                                                         \
                    const __m512i s = _mm512_dpbusd_epi32(c[i], wv, a[i]);                             \
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, e[i]), acc[i][j]); \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) {                                                             \
                const float m = OFFSET_##KIND ? 0.0f : mins_dot(mins[j], x->es + i * groups, groups);  \
                y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]) + m;                                  \
            }                                                                                          \
    }

#define LWTILES(KIND, NT4) LWTILE(KIND, 1, 1) LWTILE(KIND, 1, 4) LWTILE(KIND, 4, 1) LWTILE(KIND, 4, NT4)
LWTILES(q4_0, 4)
LWTILES(q5_0, 4)
LWTILES(q5_1, 4)

const a8_tile_fn radixd_legacy_wide_tiles[3][2][2] = {{{lw_q4_0_1_1, lw_q4_0_1_4}, {lw_q4_0_4_1, lw_q4_0_4_4}},
                                                      {{lw_q5_0_1_1, lw_q5_0_1_4}, {lw_q5_0_4_1, lw_q5_0_4_4}},
                                                      {{lw_q5_1_1_1, lw_q5_1_1_4}, {lw_q5_1_4_1, lw_q5_1_4_4}}};
const int radixd_legacy_wide_nt[3][2] = {{4, 4}, {4, 4}, {4, 4}};
