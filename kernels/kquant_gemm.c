/* Projections over GGUF K-quant blocks (Q4_K, Q5_K, Q6_K) as the file stores them, times 8-bit
 * activations: radixd_gemm's kinds RADIXD_W_Q4_K_A8, Q5_K_A8 and Q6_K_A8.
 *
 * A super-block holds 256 weights, w = d * sc_i * u - dmin * mn_i with unsigned codes u, integer
 * scales sc_i and minimums mn_i per 32 (Q4_K, Q5_K: 6 bits each) or per 16 (Q6_K: int8 scales,
 * u - 32 signed, so mn_i = 32 * sc_i and dmin = d). A call quantizes each row of x per 256 inputs
 * (codes a = round-to-even(x * 127 / amax), scale e = amax / 127, and the codes' sums per 16). Then
 * for one output and one super-block, exactly in integers:
 *     S1 = sum_i sc_i * sum(u * a over span i)   (maddubs, madd by the scales, int32 adds)
 *     S2 = sum_i mn_i * sum(a over span i)       (one madd on the sums per 16)
 * and in fp32, each operation rounded as written, the super-block's term
 *     Q4_K, Q5_K: (d * e) * S1 - (dmin * e) * S2        Q6_K: (d * e) * (S1 - S2)
 * added to the output's sum in increasing super-block order from 0.
 * NOTE: row-invariant by construction: a row is quantized on its own, S1 and S2 are exact integers
 * (however the lanes split them), and each output adds its terms in one order whatever the tile,
 * the row count, the row's position or the thread count. The integer sums do not depend on the
 * vector width or the instructions, so a build with AVX512-VNNI (vpdpwssd) and one without give the
 * same bits. Threads split the outputs; a tile is one output times one row (a decode step) or
 * four or eight rows sharing each unpacked super-block (batches, prefills), and every tile computes a
 * row's terms with the same fp32 operations (term_1, terms_4, term_rows4 agree lane for lane).
 */
#include <string.h>

#include "gemm.h"

#define QK 256
/* Bytes ahead of the super-block a tile reads that it asks for: a thread's outputs are consecutive
 * rows, so its weights are one stream; a fixed distance (not PREFETCH_OUTPUTS rows, 37 KiB at
 * k = 8192) keeps the lines asked for in L1 until they are read. */
#define KQ_AHEAD 2048
/* Bytes of one super-block, as GGUF stores it. */
#define BYTES_q4_k 144
#define BYTES_q5_k 176
#define BYTES_q6_k 210

/* A super-block's header: its integer scales, laid out so that span c's multipliers are one in-lane
 * shuffle (scales_KIND below: Q4_K, Q5_K their 8 bytes per 32 inputs in each 128-bit lane; Q6_K
 * int16, lane c scale 2c, lane 8 + c scale 2c + 1), its minimums per 16 in input order (int16), and
 * the fp32 multipliers of S1 and S2. */
typedef struct {
    __m256i sc, mn;
    float d, dmin;
} kq_head;

/* A call's activations: codes q [m, k], scales e [m, k / 256], sums per 16 s [m, k / 16]. */
typedef struct {
    const int8_t *q;
    const float *e;
    const int16_t *s;
} kq_rows;

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Q4_K / Q5_K's 12 bytes of 6-bit scales and minimums (from byte 4): bytes 0-3 hold scales 0-3 (low
 * 6 bits) and the top 2 bits of scales 4-7, bytes 4-7 likewise for the minimums, bytes 8-11 the low
 * 4 bits of scales 4-7 (low nibble) and of minimums 4-7 (high nibble). Unpacked in one vector (a
 * scalar unpacking was a quarter of a one-row tile's instructions): bytes [scales 0-7, minimums
 * 0-7], each serving two spans of 16. */
static inline __attribute__((always_inline)) void head_k4(const uint8_t *b, kq_head *h) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(b + 4)); /* 4 bytes past them: codes */
    /* [q0-3, q8-11, q4-7, q8-11]: the low bits' bytes in the output's order */
    const __m128i low = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    /* q0-3 under scales 4-7, q4-7 under minimums 4-7: their top 2 bits */
    const __m128i top = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i keep = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
    const __m128i high_nibble = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
    __m128i sm = _mm_or_si128(_mm_and_si128(low, keep), _mm_and_si128(_mm_srli_epi16(low, 4), high_nibble));
    sm = _mm_or_si128(sm, _mm_and_si128(_mm_srli_epi16(top, 2), _mm_set1_epi8(0x30)));
    h->sc = _mm256_broadcastsi128_si256(sm);
    h->mn = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    h->d = f16(b);
    h->dmin = f16(b + 2);
}

static inline __attribute__((always_inline)) void head_q4_k(const uint8_t *b, kq_head *h) { head_k4(b, h); }
static inline __attribute__((always_inline)) void head_q5_k(const uint8_t *b, kq_head *h) { head_k4(b, h); }

/* Q6_K: 16 int8 scales at 192, fp16 d at 208; w = d * sc * (u - 32), so mn = 32 * sc and dmin = d. */
static inline __attribute__((always_inline)) void head_q6_k(const uint8_t *b, kq_head *h) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(b + 192));
    const __m128i span_order = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    h->sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(v, span_order));
    h->mn = _mm256_slli_epi16(_mm256_cvtepi8_epi16(v), 5);
    h->d = h->dmin = f16(b + 208);
}

/* Codes u of inputs 32c .. 32c + 31 of a super-block, in input order. Q4_K: byte l of the 32 at
 * 16 + 32 (c / 2) holds input l of span c in its low nibble (c even) or high nibble (c odd). */
static inline __attribute__((always_inline)) __m256i nibbles(const uint8_t *p, int c) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 32 * (c / 2)));
    const __m256i lo = _mm256_set1_epi8(0x0F);
    return c & 1 ? _mm256_and_si256(_mm256_srli_epi16(v, 4), lo) : _mm256_and_si256(v, lo);
}

static inline __attribute__((always_inline)) __m256i codes_q4_k(const uint8_t *b, int c) {
    return nibbles(b + 16, c);
}

/* Q5_K: the Q4_K nibbles at 48, and bit c of byte l of the 32 at 16 as the fifth bit. */
static inline __attribute__((always_inline)) __m256i codes_q5_k(const uint8_t *b, int c) {
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, c), _mm256_set1_epi8(1));
    return _mm256_or_si256(nibbles(b + 48, c), _mm256_slli_epi16(hi, 4));
}

/* Q6_K: half h = c / 4 of the super-block, quarter s = c % 4: low 4 bits from byte l of ql (at 64h,
 * + 32 for odd s; high nibble for s >= 2), top 2 bits from bits 2s of byte l of qh (at 128 + 32h). */
static inline __attribute__((always_inline)) __m256i codes_q6_k(const uint8_t *b, int c) {
    const int h = c / 4, s = c % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (s & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
    const __m256i lo = s >= 2 ? _mm256_srli_epi16(ql, 4) : ql;
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), _mm256_set1_epi8(3));
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi8(0x0F)), _mm256_slli_epi16(top, 4));
}

/* Asks for the 3 lines KQ_AHEAD bytes past a super-block (a prefetch never faults); returns b. */
static inline __attribute__((always_inline)) const uint8_t *ask_ahead(const uint8_t *b) {
    _mm_prefetch((const char *)b + KQ_AHEAD, _MM_HINT_T0);
    _mm_prefetch((const char *)b + KQ_AHEAD + 64, _MM_HINT_T0);
    _mm_prefetch((const char *)b + KQ_AHEAD + 128, _MM_HINT_T0);
    return b;
}

/* acc + madd(p, sv): one instruction where the build's CPU has AVX512-VNNI (-march=native), the
 * same exact int32 sums either way. */
static inline __attribute__((always_inline)) __m256i madd_add(__m256i acc, __m256i p, __m256i sv) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, p, sv);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sv));
#endif
}

/* The int16 multipliers of span c's 16 maddubs pairs (lanes 0-7: inputs 0-15, lanes 8-15: inputs
 * 16-31). Q4_K, Q5_K: scale c (one per 32) zero-extended from its byte (index bytes [c, 0x80]: the
 * high byte reads as 0); Q6_K: scales 2c and 2c + 1, words c of the two 128-bit lanes. */
static inline __attribute__((always_inline)) __m256i scales_k4(const kq_head *h, int c) {
    return _mm256_shuffle_epi8(h->sc, _mm256_set1_epi16((short)(0x8000 | c)));
}

static inline __attribute__((always_inline)) __m256i scales_q4_k(const kq_head *h, int c) { return scales_k4(h, c); }
static inline __attribute__((always_inline)) __m256i scales_q5_k(const kq_head *h, int c) { return scales_k4(h, c); }

static inline __attribute__((always_inline)) __m256i scales_q6_k(const kq_head *h, int c) {
    return _mm256_shuffle_epi8(h->sc, _mm256_set1_epi16((short)(0x0100 * (2 * c + 1) + 2 * c)));
}

/* Exact int32 reductions: the sum of v's 8 lanes; [sum of a, sum of b, ...]; lane l = the sum of
 * v[l]'s 8 lanes (4 or 8 vectors). */
static inline __attribute__((always_inline)) int32_t hsum_i32(__m256i v) {
    __m128i a = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(a, _mm_shuffle_epi32(a, 0xB1)));
}

static inline __attribute__((always_inline)) __m128i sum_pair(__m256i a, __m256i b) {
    const __m256i h = _mm256_hadd_epi32(a, b);
    const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    return _mm_hadd_epi32(q, q);
}

static inline __attribute__((always_inline)) __m128i sums4(const __m256i v[4]) {
    const __m256i g = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
}

static inline __attribute__((always_inline)) __m256i sums8(const __m256i v[8]) {
    return _mm256_set_m128i(sums4(v + 4), sums4(v));
}

/* A super-block's fp32 term for one row from its exact S1 and S2 (int32 lanes to sum), in the one
 * order every tile follows: Q4_K, Q5_K [d * e, dmin * e] times [S1, S2] in two lanes, then one
 * minus the other; Q6_K (d * e) times S1 - S2. */
static inline __attribute__((always_inline)) float term_1(const kq_head *h, float e, __m256i s1, __m256i s2, int q6) {
    if (q6) return (h->d * e) * (float)hsum_i32(_mm256_sub_epi32(s1, s2));
    const __m128 de = _mm_mul_ps(_mm_setr_ps(h->d, h->dmin, 0.0f, 0.0f), _mm_set1_ps(e));
    const __m128 t = _mm_mul_ps(de, _mm_cvtepi32_ps(sum_pair(s1, s2)));
    return _mm_cvtss_f32(t) - _mm_cvtss_f32(_mm_movehdup_ps(t));
}

/* Four consecutive super-blocks' fp16 at b + at, b + bytes + at, ...: one each (Q6_K's d) as 4
 * floats, or a pair each (d, dmin) as 8. */
static inline __attribute__((always_inline)) __m128 halves_1(const uint8_t *b, int64_t bytes, int at) {
    uint16_t v[4];
    for (int g = 0; g < 4; g++) memcpy(v + g, b + g * bytes + at, 2);
    return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)v));
}

static inline __attribute__((always_inline)) __m256 halves_2(const uint8_t *b, int64_t bytes, int at) {
    uint32_t v[4];
    for (int g = 0; g < 4; g++) memcpy(v + g, b + g * bytes + at, 4);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)v));
}

/* Four consecutive super-blocks' terms for one row, each lane what term_1 computes: v holds their
 * [S1, S2] (Q6_K: their S1 - S2 in v[0 .. 3]), e their activation scales, b the first's bytes. */
static inline __attribute__((always_inline)) void terms_4(const uint8_t *b, int64_t bytes, const float *e,
                                                           const __m256i v[8], int q6, float t[4]) {
    const __m128 ev = _mm_loadu_ps(e);
    if (q6) {
        _mm_storeu_ps(t, _mm_mul_ps(_mm_mul_ps(halves_1(b, bytes, 208), ev), _mm_cvtepi32_ps(sums4(v))));
        return;
    }
    const __m256 e2 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(ev), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256 p = _mm256_mul_ps(_mm256_mul_ps(halves_2(b, bytes, 0), e2), _mm256_cvtepi32_ps(sums8(v)));
    float all[8];
    _mm256_storeu_ps(all, _mm256_sub_ps(p, _mm256_movehdup_ps(p)));
    for (int g = 0; g < 4; g++) t[g] = all[2 * g];
}

/* Four rows' terms as four lanes (lane i: row i), each what term_1 computes for its row: s the rows'
 * S1, e their scales, sums their sums per 16 (row stride nsb * 16). */
static inline __attribute__((always_inline)) __m128 term_rows4(const kq_head *h, __m128 e, const __m256i s[4],
                                                                const int16_t *sums, int64_t nsb, int q6) {
    __m256i t[8];
    for (int i = 0; i < 4; i++) {
        const __m256i s2 = _mm256_madd_epi16(h->mn, _mm256_loadu_si256((const __m256i *)(sums + i * nsb * 16)));
        t[i] = q6 ? _mm256_sub_epi32(s[i], s2) : s[i];
        t[4 + i] = s2;
    }
    if (q6) return _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(h->d), e), _mm_cvtepi32_ps(sums4(t)));
    const __m256 f = _mm256_cvtepi32_ps(sums8(t));
    const __m128 t1 = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(h->d), e), _mm256_castps256_ps128(f));
    const __m128 t2 = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(h->dmin), e), _mm256_extractf128_ps(f, 1));
    return _mm_sub_ps(t1, t2);
}

/* One row: S1 of the super-block at b against codes q (its spans in two chains of int32 adds), and
 * S2 against its sums per 16. */
#define KQSUMS(KIND)                                                                                   \
    static inline __attribute__((always_inline)) __m256i s1_##KIND(const uint8_t *b, const kq_head *h, \
                                                                   const int8_t *q) {                \
        __m256i s1 = _mm256_setzero_si256(), s1b = _mm256_setzero_si256();                           \
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c += 2) {                                     \
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(q + 32 * c));                    \
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(q + 32 * c + 32));               \
            s1 = madd_add(s1, _mm256_maddubs_epi16(codes_##KIND(b, c), a0), scales_##KIND(h, c));       \
            s1b = madd_add(s1b, _mm256_maddubs_epi16(codes_##KIND(b, c + 1), a1), scales_##KIND(h, c + 1)); \
        }                                                                                            \
        return _mm256_add_epi32(s1, s1b);                                                            \
    }

static inline __attribute__((always_inline)) __m256i s2_of(const kq_head *h, const int16_t *sums) {
    return _mm256_madd_epi16(h->mn, _mm256_loadu_si256((const __m256i *)sums));
}

/* One row times one output (a decode step's tile). Four super-blocks at a time: their S1 and S2
 * reduced together and their fp32 terms computed as lanes, then added to the sum one by one, in
 * order (measured faster than a block at a time); the last k / 256 % 4 one at a time. Two or four
 * outputs a tile measured no faster, nor 512-bit vectors holding two spans (slower: Zen 4 runs them
 * as two halves): the step is bound by its vector instructions, not its loads or latencies. */
#define KQONE(KIND, Q6)                                                                                \
    static void kq_##KIND##_1(const kq_rows *x, int64_t k, const uint8_t *w, float *y, int64_t ldy) { \
        (void)ldy;                                                                                   \
        const int64_t nsb = k / QK;                                                                  \
        float acc = 0.0f;                                                                            \
        int64_t sb = 0;                                                                              \
        for (; sb + 4 <= nsb; sb += 4) {                                                             \
            __m256i v[8];                                                                            \
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                                    \
                const uint8_t *b = w + (sb + g) * BYTES_##KIND;                                      \
                kq_head h;                                                                           \
                head_##KIND(ask_ahead(b), &h);                                                       \
                const __m256i s1 = s1_##KIND(b, &h, x->q + (sb + g) * QK);                           \
                const __m256i s2 = s2_of(&h, x->s + (sb + g) * 16);                                  \
                if (Q6) {                                                                            \
                    v[g] = _mm256_sub_epi32(s1, s2);                                                 \
                } else {                                                                             \
                    v[2 * g] = s1;                                                                   \
                    v[2 * g + 1] = s2;                                                               \
                }                                                                                    \
            }                                                                                        \
            float t[4];                                                                              \
            terms_4(w + sb * BYTES_##KIND, BYTES_##KIND, x->e + sb, v, Q6, t);                       \
            for (int g = 0; g < 4; g++) acc = acc + t[g];                                            \
        }                                                                                            \
        for (; sb < nsb; sb++) {                                                                     \
            const uint8_t *b = w + sb * BYTES_##KIND;                                                \
            kq_head h;                                                                               \
            head_##KIND(ask_ahead(b), &h);                                                           \
            acc = acc + term_1(&h, x->e[sb], s1_##KIND(b, &h, x->q + sb * QK), s2_of(&h, x->s + sb * 16), Q6); \
        }                                                                                            \
        *y = acc;                                                                                    \
    }

/* R rows (4 or 8) times one output (batches and prefills): each span's codes and multipliers
 * unpacked once for the R rows, and their S1 and S2 summed together, their fp32 terms as lanes
 * (lane i of group g: row 4g + i), each computing what the one-row tile computes for its row. Eight
 * rows measured faster than four (the unpacking is shared by twice the rows); twelve rows, two
 * outputs a tile, and vpdpbusd's sums of 4 packed to int16 before the scales (three multiplies a 64
 * inputs instead of four, but more instructions) measured no faster. */
#define KQROWS(KIND, Q6, R)                                                                            \
    static void kq_##KIND##_##R(const kq_rows *x, int64_t k, const uint8_t *w, float *y, int64_t ldy) { \
        const int64_t nsb = k / QK;                                                                  \
        __m128 acc[R / 4];                                                                           \
        for (int g = 0; g < R / 4; g++) acc[g] = _mm_setzero_ps();                                   \
        for (int64_t sb = 0; sb < nsb; sb++) {                                                       \
            const uint8_t *b = w + sb * BYTES_##KIND;                                                \
            kq_head h;                                                                               \
            head_##KIND(ask_ahead(b), &h);                                                           \
            __m256i s[R];                                                                            \
            for (int i = 0; i < R; i++) s[i] = _mm256_setzero_si256();                               \
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {                                    \
                const __m256i u = codes_##KIND(b, c), sv = scales_##KIND(&h, c);                   \
                _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                \
                    const __m256i a = _mm256_loadu_si256((const __m256i *)(x->q + i * k + sb * QK + 32 * c)); \
                    s[i] = madd_add(s[i], _mm256_maddubs_epi16(u, a), sv);                           \
                }                                                                                    \
            }                                                                                        \
            for (int g = 0; g < R / 4; g++) {                                                        \
                const float *e = x->e + 4 * g * nsb + sb;                                            \
                const __m128 ev = _mm_setr_ps(e[0], e[nsb], e[2 * nsb], e[3 * nsb]);                  \
                acc[g] = _mm_add_ps(acc[g], term_rows4(&h, ev, s + 4 * g, x->s + (4 * g * nsb + sb) * 16, nsb, Q6)); \
            }                                                                                        \
        }                                                                                            \
        for (int g = 0; g < R / 4; g++) {                                                            \
            float out[4];                                                                            \
            _mm_storeu_ps(out, acc[g]);                                                              \
            for (int i = 0; i < 4; i++) y[(4 * g + i) * ldy] = out[i];                               \
        }                                                                                            \
    }

#define KQTILES(KIND, Q6) KQSUMS(KIND) KQONE(KIND, Q6) KQROWS(KIND, Q6, 4) KQROWS(KIND, Q6, 8)
KQTILES(q4_k, 0)
KQTILES(q5_k, 0)
KQTILES(q6_k, 1)

typedef void (*kq_tile_fn)(const kq_rows *, int64_t, const uint8_t *, float *, int64_t);
/* [kind - RADIXD_W_Q4_K_A8][rows 1, 4 or 8] */
static const kq_tile_fn KQ_TILES[3][3] = {
    {kq_q4_k_1, kq_q4_k_4, kq_q4_k_8}, {kq_q5_k_1, kq_q5_k_4, kq_q5_k_8}, {kq_q6_k_1, kq_q6_k_4, kq_q6_k_8}};
static const int64_t KQ_BYTES[3] = {BYTES_q4_k, BYTES_q5_k, BYTES_q6_k};

/* Row r of x [m, k] per 256 inputs: codes q, scale e = amax / 127 (codes x * 127 / amax rounded to
 * nearest even, 0 where amax is 0) and the codes' sums per 16. */
void radixd_kquant_quantize_rows(const float *x, int64_t m, int64_t k, int8_t *q, float *e, int16_t *s) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t at = 0; at < m * (k / QK); at++) {
        const float *p = x + at * QK;
        __m256 amax = _mm256_setzero_ps();
        for (int i = 0; i < QK; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(p + i)));
        const float a = hmax(amax);
        const __m256 inv = _mm256_set1_ps(a > 0 ? 127.0f / a : 0.0f);
        e[at] = a / 127.0f;
        for (int g = 0; g < QK / 32; g++) {
            __m256i c[4];
            for (int i = 0; i < 4; i++)
                c[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(p + 32 * g + 8 * i), inv), NEAREST));
            /* packs interleave the 128-bit lanes; the permute puts inputs back in order */
            __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
            b = _mm256_permutevar8x32_epi32(b, order);
            _mm256_storeu_si256((__m256i *)(q + at * QK + 32 * g), b);
            /* pairs' sums, then the 8 pairs of each 16 */
            const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), b);
            const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            int32_t part[8];
            _mm256_storeu_si256((__m256i *)part, s32);
            s[at * 16 + 2 * g] = (int16_t)(part[0] + part[1] + part[2] + part[3]);
            s[at * 16 + 2 * g + 1] = (int16_t)(part[4] + part[5] + part[6] + part[7]);
        }
    }
}

/* y [m, n] (row stride ldy) = x [m, k] . W^T over one part of a K-quant kind, x quantized here.
 * Threads split the outputs into blocks of 4; rows run in tiles of 8, then 4, sharing each unpacked
 * span, the rest one at a time. Returns 0, -1 (no memory for the activations) or -2 (not a K-quant kind). */
int radixd_kquant_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads) {
    const int kind = (int)p->kind - RADIXD_W_Q4_K_A8;
    if (kind < 0 || kind > 2) return -2;
    const int64_t k = p->k, n = p->n, nsb = k / QK, row_bytes = nsb * KQ_BYTES[kind];
    /* NOTE: the calling thread's scratch, as a8_gemm.c: codes, then scales, then the sums per 16. */
    float *buf = radixd_scratch((m * k + 3) / 4 + m * nsb + (m * nsb * 16 * 2 + 3) / 4);
    if (!buf) return -1;
    int8_t *q = (int8_t *)buf;
    float *e = buf + (m * k + 3) / 4;
    int16_t *s = (int16_t *)(e + m * nsb);
    radixd_kquant_quantize_rows(x, m, k, q, e, s);
    const kq_tile_fn *fns = KQ_TILES[kind];
    const uint8_t *w = (const uint8_t *)p->w;
    const int64_t blocks = (n + 3) / 4;
    /* Within a block, row tiles outside and outputs inside: a tile's activations stay in L1 while
     * the block's 4 weight rows serve them. */
#pragma omp parallel for num_threads(threads) schedule(static) if (n * m * k >= PARALLEL_MACS)
    for (int64_t bl = 0; bl < blocks; bl++) {
        const int64_t j1 = 4 * bl + 4 < n ? 4 * bl + 4 : n;
        for (int64_t r = 0; r < m;) {
            const int tile = r + 8 <= m ? 2 : r + 4 <= m ? 1 : 0, rows = tile == 2 ? 8 : tile ? 4 : 1;
            const kq_rows at = {q + r * k, e + r * nsb, s + r * nsb * 16};
            for (int64_t j = 4 * bl; j < j1; j++) fns[tile](&at, k, w + j * row_bytes, y + r * ldy + j, ldy);
            r += rows;
        }
    }
    return 0;
}

/* Row `row` of one part's W as fp32, each weight as gguf-py's dequantize rounds it:
 * Q4_K / Q5_K (d * sc) * u - (dmin * mn), Q6_K (d * sc) * (u - 32). */
void radixd_kquant_dequantize_row(const radixd_proj *p, int64_t row, float *out) {
    const int kind = (int)p->kind - RADIXD_W_Q4_K_A8;
    const int64_t nsb = p->k / QK;
    const uint8_t *w = (const uint8_t *)p->w + row * nsb * KQ_BYTES[kind];
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *b = w + sb * KQ_BYTES[kind];
        kq_head h;
        int16_t sc[8][16], mn[16]; /* sc: each span's multipliers, as the tiles take them */
        uint8_t u[QK];
        if (kind == 2)
            head_q6_k(b, &h);
        else
            head_k4(b, &h);
        for (int c = 0; c < 8; c++) {
            __m256i v = kind == 0 ? codes_q4_k(b, c) : kind == 1 ? codes_q5_k(b, c) : codes_q6_k(b, c);
            _mm256_storeu_si256((__m256i *)(u + 32 * c), v);
            _mm256_storeu_si256((__m256i *)sc[c], kind == 2 ? scales_q6_k(&h, c) : scales_k4(&h, c));
        }
        _mm256_storeu_si256((__m256i *)mn, h.mn);
        float *o = out + sb * QK;
        for (int i = 0; i < QK; i++) {
            const float ds = h.d * (float)sc[i / 32][i % 32 / 16 * 8];
            o[i] = kind == 2 ? ds * (float)((int)u[i] - 32) : ds * (float)u[i] - h.dmin * (float)mn[i / 16];
        }
    }
}
