/* Q4_K, Q6_K and Q5_K matrices repacked at load for AVX512-VNNI: radixd_gemm's kinds RADIXD_W_Q4_K_X16,
 * RADIXD_W_Q6_K_X16 and RADIXD_W_Q5_K_X16, the same weights and the same arithmetic as kquant_gemm.c's
 * Q4_K_A8, Q6_K_A8 and Q5_K_A8.
 *
 * The layout: 16 rows' super-blocks interleaved, so that one zmm holds 16 rows x 4 consecutive
 * weights and `vpdpbusd` against 4 activation codes broadcast from memory adds one sub-block's
 * products for 16 outputs at once (64 products an instruction, where kquant_gemm.c's maddubs + madd
 * pair spends two instructions on 32). Each sub-block's exact int32 dot product is multiplied by its
 * integer scale (`vpmulld`, one instruction for 16 outputs) and summed into S1; S2 is one `vpdpwssd`
 * per pair of sub-blocks (the minimums as int16 pairs times the activations' sums). A record of one
 * group of 16 rows and one super-block (all offsets in bytes):
 *   Q4_K (2368): d, dmin fp16 [2][16] at 0; scales [8][16] u8 at 64; minimums as pairs
 *     [4][16][2] u8 at 192 (pair t: sub-blocks 2t, 2t + 1); codes at 320: [4][8][16][4], pair t,
 *     quad j, row r, byte b holds input 64t + 4j + b (low nibble) and 64t + 32 + 4j + b (high nibble):
 *     byte 4j + b of the file's 32 bytes of pair t, so repacking moves 4 bytes at a time.
 *   Q6_K (3392): d fp16 [16] at 0 (then 32 spare bytes); scales as pairs [8][16][2] i8 at 64 (pair p:
 *     sub-blocks 2p, 2p + 1 of 16 inputs); low 4 bits at 320: [8][4][16][4], pair p, quad j: input
 *     32p + 4j + b low, 32p + 16 + 4j + b high; top 2 bits at 2368: [8][2][16][4], pair p, half h:
 *     bits 4-5 / 6-7 of quad 2h of sub-blocks 2p / 2p + 1, bits 0-1 / 2-3 of quad 2h + 1.
 *   Q5_K (2880): Q4_K's record (the codes' low 4 bits), then the 5th bits as byte masks u64 [4][8][2]
 *     at 2368: pair t, quad j, the low nibbles' (sub-block 2t) then the high ones' (2t + 1), bit
 *     4r + b; a tile adds 16 to the masked code bytes (the file's 32 bytes of qh a row, moved: whole
 *     5-bit code bytes would take 1.5x the codes' bytes).
 * NOTE: row-invariant as kquant_gemm.c: S1 and S2 are the same exact integers, and each output's fp32
 * terms are the same operations in the same order (Q4_K, Q5_K (d * e) * S1 - (dmin * e) * S2, Q6_K
 * (d * e) * (S1 - S2), added from 0 in super-block order), so the bits equal kquant_gemm.c's whatever
 * the tile (1 to 4 rows), the row count or the threads. Called only where the CPU has AVX512-VNNI and BW.
 */
#include <string.h>

#include "gemm.h"

#define QK 256
#define REC_q4_k 2368
#define REC_q6_k 3392
#define REC_q5_k 2880
#define SRC_q4_k 144
#define SRC_q6_k 210
#define SRC_q5_k 176
/* Q5_K: where its record's masks of 5th bits start (after Q4_K's record); its block's qh and codes. */
#define MASKS_q5_k 2368
#define QH_q5_k 16
#define QS_q5_k 48
#ifndef X16_AHEAD
#define X16_AHEAD 4096
#endif

/* The repacked kinds by their index in the tables below. */
enum { K_Q4_K, K_Q6_K, K_Q5_K, K_KINDS };
static const int64_t REC[K_KINDS] = {REC_q4_k, REC_q6_k, REC_q5_k};
static const int64_t SRC[K_KINDS] = {SRC_q4_k, SRC_q6_k, SRC_q5_k};

/* A kind's index, or -1 where this file does not run it. */
static int index_of(int64_t kind) {
    if (kind == RADIXD_W_Q4_K_X16) return K_Q4_K;
    if (kind == RADIXD_W_Q6_K_X16) return K_Q6_K;
    return kind == RADIXD_W_Q5_K_X16 ? K_Q5_K : -1;
}

/* Asks for the `lines` cache lines at p + X16_AHEAD (a thread's groups are one stream; a step of a
 * record asks for its share of the lines ahead, so they arrive as fast as they are read). */
static inline __attribute__((always_inline)) void ask_lines(const uint8_t *p, int lines) {
    for (int i = 0; i < lines; i++) _mm_prefetch((const char *)p + X16_AHEAD + 64 * i, _MM_HINT_T0);
}

/* The R rows' activations of a tile: codes (stride k), scales (stride nsb), and S2's sums as int16
 * pairs (Q4_K: per 32, stride nsb * 8; Q6_K: per 16, stride nsb * 16). */
typedef struct {
    const int8_t *q;
    const float *e;
    const int16_t *s;
    int64_t k, nsb, lds;
} x16_rows;

static inline __attribute__((always_inline)) __m512i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The fp32 terms of one super-block for R rows, each lane what kquant_gemm.c's term_1 computes, added
 * to acc: d, dmin per output (Q6_K: dmin unused), S1 and S2 per row. */
static inline __attribute__((always_inline)) void add_terms(__m512 *acc, const x16_rows *x, int64_t sb, __m512 d,
                                                            __m512 dmin, const __m512i *s1, const __m512i *s2,
                                                            int R, int q6) {
    for (int r = 0; r < R; r++) {
        const __m512 e = _mm512_set1_ps(x->e[r * x->nsb + sb]);
        if (q6) {
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(d, e), _mm512_cvtepi32_ps(_mm512_sub_epi32(s1[r], s2[r]))));
        } else {
            const __m512 t1 = _mm512_mul_ps(_mm512_mul_ps(d, e), _mm512_cvtepi32_ps(s1[r]));
            const __m512 t2 = _mm512_mul_ps(_mm512_mul_ps(dmin, e), _mm512_cvtepi32_ps(s2[r]));
            acc[r] = _mm512_add_ps(acc[r], _mm512_sub_ps(t1, t2));
        }
    }
}

static inline __attribute__((always_inline)) __mmask64 mask_at(const uint8_t *p) {
    uint64_t m;
    memcpy(&m, p, 8);
    return _cvtu64_mask64(m);
}

/* Quad j of pair t of a Q4_K record (q5: Q5_K's, the 5th bits added) against R rows: the products of
 * sub-block 2t into da, of 2t + 1 into db. */
static inline __attribute__((always_inline)) void quad_k4(const x16_rows *x, const uint8_t *rec, int64_t sb, int t,
                                                          int j, __m512i *da, __m512i *db, const int R, const int q5) {
    const __m512i low = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
    const __m512i v = _mm512_loadu_si512((const void *)(rec + 320 + 512 * t + 64 * j));
    __m512i ua = _mm512_and_si512(v, low), ub = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if (q5) {
        const uint8_t *m = rec + MASKS_q5_k + 128 * t + 16 * j;
        ua = _mm512_mask_add_epi8(ua, mask_at(m), ua, fifth);
        ub = _mm512_mask_add_epi8(ub, mask_at(m + 8), ub, fifth);
    }
    for (int r = 0; r < R; r++) {
        const int8_t *a = x->q + r * x->k + sb * QK + 64 * t + 4 * j;
        da[r] = _mm512_dpbusd_epi32(da[r], ua, bcast4(a));
        db[r] = _mm512_dpbusd_epi32(db[r], ub, bcast4(a + 32));
    }
}

/* R rows (1 to 4) times one group of 16 Q4_K rows at w (q5: Q5_K rows): y[r * ldy + 0 .. 15]. */
static inline __attribute__((always_inline)) void tile_k4(const x16_rows *x, const uint8_t *w, float *y,
                                                          int64_t ldy, const int R, const int q5) {
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < x->nsb; sb++) {
        const uint8_t *rec = w + sb * (q5 ? REC_q5_k : REC_q4_k);
        __m512i s1[4], s2[4];
        for (int r = 0; r < R; r++) s1[r] = s2[r] = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            __m512i da[4], db[4];
            for (int r = 0; r < R; r++) da[r] = db[r] = _mm512_setzero_si512();
            if (q5) {
                ask_lines(rec + 704 * t, t == 3 ? 12 : 11); /* 11 + 11 + 11 + 12: the record's 45 lines */
                /* unrolled by hand: GCC's own choice left Q5_K's loop rolled, its accumulators spilled */
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) quad_k4(x, rec, sb, t, j, da, db, R, 1);
            } else {
                ask_lines(rec + 640 * t, 10); /* 4 x 10 lines: the record's 37 */
                for (int j = 0; j < 8; j++) quad_k4(x, rec, sb, t, j, da, db, R, 0);
            }
            const __m512i sa = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + 64 + 32 * t)));
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + 80 + 32 * t)));
            const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(rec + 192 + 32 * t)));
            for (int r = 0; r < R; r++) {
                s1[r] = _mm512_add_epi32(s1[r], _mm512_add_epi32(_mm512_mullo_epi32(da[r], sa), _mm512_mullo_epi32(db[r], sc)));
                s2[r] = _mm512_dpwssd_epi32(s2[r], mn, bcast4(x->s + r * x->lds + sb * 8 + 2 * t));
            }
        }
        const __m512i dd = _mm512_loadu_si512((const void *)rec);
        const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(dd));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dd, 1));
        add_terms(acc, x, sb, d, dmin, s1, s2, R, 0);
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

/* R rows (1 to 4) times one group of 16 Q6_K rows at w. */
static inline __attribute__((always_inline)) void tile_q6_k(const x16_rows *x, const uint8_t *w, float *y,
                                                            int64_t ldy, const int R) {
    const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < x->nsb; sb++) {
        const uint8_t *rec = w + sb * REC_q6_k;
        __m512i s1[4], s2[4];
        for (int r = 0; r < R; r++) s1[r] = s2[r] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {
            __m512i da[4], db[4];
            for (int r = 0; r < R; r++) da[r] = db[r] = _mm512_setzero_si512();
            ask_lines(rec + 448 * p, 7); /* 8 x 7 lines: the record's 53 */
            for (int h = 0; h < 2; h++) {
                const __m512i hv = _mm512_loadu_si512((const void *)(rec + 2368 + 128 * p + 64 * h));
                for (int i = 0; i < 2; i++) {
                    const int j = 2 * h + i;
                    const __m512i lv = _mm512_loadu_si512((const void *)(rec + 320 + 256 * p + 64 * j));
                    /* quad j of sub-block 2p (low nibbles) and of 2p + 1 (high nibbles), top bits at 4-5 */
                    const __m512i ha = i ? _mm512_slli_epi16(hv, 4) : hv;
                    const __m512i hb = i ? _mm512_slli_epi16(hv, 2) : _mm512_srli_epi16(hv, 2);
                    const __m512i ua = _mm512_ternarylogic_epi32(lv, _mm512_and_si512(ha, top), low, 0xEC);
                    const __m512i ub = _mm512_ternarylogic_epi32(_mm512_srli_epi16(lv, 4), _mm512_and_si512(hb, top), low, 0xEC);
                    for (int r = 0; r < R; r++) {
                        const int8_t *a = x->q + r * x->k + sb * QK + 32 * p + 4 * j;
                        da[r] = _mm512_dpbusd_epi32(da[r], ua, bcast4(a));
                        db[r] = _mm512_dpbusd_epi32(db[r], ub, bcast4(a + 16));
                    }
                }
            }
            /* the pair's scales as int16 pairs (S2), and each one as int32 (S1) */
            const __m512i sp = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(rec + 64 + 32 * p)));
            const __m512i sa = _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16), sc = _mm512_srai_epi32(sp, 16);
            for (int r = 0; r < R; r++) {
                s1[r] = _mm512_add_epi32(s1[r], _mm512_add_epi32(_mm512_mullo_epi32(da[r], sa), _mm512_mullo_epi32(db[r], sc)));
                s2[r] = _mm512_dpwssd_epi32(s2[r], sp, bcast4(x->s + r * x->lds + sb * 16 + 2 * p));
            }
        }
        for (int r = 0; r < R; r++) s2[r] = _mm512_slli_epi32(s2[r], 5); /* mn = 32 * sc */
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        add_terms(acc, x, sb, d, d, s1, s2, R, 1);
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

static inline __attribute__((always_inline)) void tile_q4_k(const x16_rows *x, const uint8_t *w, float *y,
                                                            int64_t ldy, const int R) {
    tile_k4(x, w, y, ldy, R, 0);
}

static inline __attribute__((always_inline)) void tile_q5_k(const x16_rows *x, const uint8_t *w, float *y,
                                                            int64_t ldy, const int R) {
    tile_k4(x, w, y, ldy, R, 1);
}

#define X16TILES(KIND)                                                                                 \
    static void KIND##_1(const x16_rows *x, const uint8_t *w, float *y, int64_t ldy) { tile_##KIND(x, w, y, ldy, 1); } \
    static void KIND##_2(const x16_rows *x, const uint8_t *w, float *y, int64_t ldy) { tile_##KIND(x, w, y, ldy, 2); } \
    static void KIND##_3(const x16_rows *x, const uint8_t *w, float *y, int64_t ldy) { tile_##KIND(x, w, y, ldy, 3); } \
    static void KIND##_4(const x16_rows *x, const uint8_t *w, float *y, int64_t ldy) { tile_##KIND(x, w, y, ldy, 4); }
X16TILES(q4_k)
X16TILES(q6_k)
X16TILES(q5_k)

typedef void (*x16_tile_fn)(const x16_rows *, const uint8_t *, float *, int64_t);
static const x16_tile_fn X16_TILES[K_KINDS][4] = {
    [K_Q4_K] = {q4_k_1, q4_k_2, q4_k_3, q4_k_4},
    [K_Q6_K] = {q6_k_1, q6_k_2, q6_k_3, q6_k_4},
    [K_Q5_K] = {q5_k_1, q5_k_2, q5_k_3, q5_k_4},
};

/* y [m, n] (row stride ldy) = x [m, k] . W^T over one repacked part, x quantized as kquant_gemm.c
 * does. Threads split the groups of 16 outputs; within a group, tiles of 4 rows (then 1 to 3) share
 * each unpacked zmm of codes (six rows a tile measured slower: 30 zmm registers live). */
int radixd_kquant_x16_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads) {
    const int at = index_of(p->kind), q6 = at == K_Q6_K;
    if (at < 0 || !avx512_vnni()) return -2;
    const int64_t k = p->k, nsb = k / QK, groups = p->n / 16, rec = REC[at];
    /* codes, scales, sums per 16; then (Q4_K, Q5_K) the sums per 32 */
    const int64_t lds = q6 ? nsb * 16 : nsb * 8;
    float *buf = radixd_scratch((m * k + 3) / 4 + m * nsb + (m * nsb * 16 * 2 + 3) / 4 + (m * lds * 2 + 3) / 4);
    if (!buf) return -1;
    int8_t *q = (int8_t *)buf;
    float *e = buf + (m * k + 3) / 4;
    int16_t *s = (int16_t *)(e + m * nsb);
    radixd_kquant_quantize_rows(x, m, k, q, e, s);
    int16_t *s32 = (int16_t *)((float *)s + (m * nsb * 16 * 2 + 3) / 4);
    if (!q6)
        for (int64_t i = 0; i < m * nsb * 8; i++) s32[i] = (int16_t)(s[2 * i] + s[2 * i + 1]);
    const int16_t *sums = q6 ? s : s32;
    const uint8_t *w = (const uint8_t *)p->w;
    const x16_tile_fn *fns = X16_TILES[at];
#pragma omp parallel for num_threads(threads) schedule(static) if (p->n * m * k >= PARALLEL_MACS)
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t r = 0; r < m;) {
            const int64_t rows = m - r < 4 ? m - r : 4;
            const x16_rows at = {q + r * k, e + r * nsb, sums + r * lds, k, nsb, lds};
            fns[rows - 1](&at, w + g * nsb * rec, y + r * ldy + 16 * g, ldy);
            r += rows;
        }
    }
    return 0;
}

/* One Q4_K super-block of 16 rows (src: row r's block at src + r * stride, its codes at codes_at: 16,
 * or Q5_K's 48) into Q4_K's record. */
static void repack_k4(const uint8_t *src, int64_t stride, int codes_at, uint8_t *rec) {
    for (int r = 0; r < 16; r++) {
        const uint8_t *b = src + r * stride, *s = b + 4;
        memcpy(rec + 2 * r, b, 2);
        memcpy(rec + 32 + 2 * r, b + 2, 2);
        for (int i = 0; i < 8; i++) {
            const int sc = i < 4 ? s[i] & 63 : (s[i + 4] & 15) | (s[i - 4] >> 6) << 4;
            const int mn = i < 4 ? s[i + 4] & 63 : (s[i + 4] >> 4) | (s[i] >> 6) << 4;
            rec[64 + 16 * i + r] = (uint8_t)sc;
            rec[192 + 32 * (i / 2) + 2 * r + i % 2] = (uint8_t)mn;
        }
    }
    /* the codes: 64 bytes of the record gather 4 from each row */
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)stride));
    for (int i = 0; i < 32; i++)
        _mm512_storeu_si512((void *)(rec + 320 + 64 * i), _mm512_i32gather_epi32(rows, src + codes_at + 4 * i, 1));
}

/* Q5_K: Q4_K's record of its low 4 bits, then its 5th bits: quad j's 4 qh bytes of each row (byte 4r + b:
 * inputs 4j + b of every sub-block, bit c of sub-block c) tested bit by bit into the masks. */
static void repack_q5_k(const uint8_t *src, int64_t stride, uint8_t *rec) {
    repack_k4(src, stride, QS_q5_k, rec);
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)stride));
    for (int j = 0; j < 8; j++) {
        const __m512i qh = _mm512_i32gather_epi32(rows, src + QH_q5_k + 4 * j, 1);
        for (int c = 0; c < 8; c++) {
            const uint64_t m = _cvtmask64_u64(_mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << c))));
            memcpy(rec + MASKS_q5_k + 128 * (c / 2) + 16 * j + 8 * (c % 2), &m, 8);
        }
    }
}

/* A Q6_K super-block's 256 codes (0 .. 63) in input order: half h, quarter s, input l of 32 take
 * the low 4 bits of ql byte 64h + 32 (s & 1) + l (high nibble for s >= 2) and bits 2s, 2s + 1 of qh
 * byte 32h + l. */
static void codes_q6_k(const uint8_t *b, uint8_t u[QK]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int a = b[64 * h + l], c = b[64 * h + 32 + l], t = b[128 + 32 * h + l];
            u[128 * h + l] = (uint8_t)((a & 15) | (t & 3) << 4);
            u[128 * h + 32 + l] = (uint8_t)((c & 15) | (t >> 2 & 3) << 4);
            u[128 * h + 64 + l] = (uint8_t)((a >> 4) | (t >> 4 & 3) << 4);
            u[128 * h + 96 + l] = (uint8_t)((c >> 4) | (t >> 6) << 4);
        }
}

static void repack_q6_k(const uint8_t *src, int64_t stride, uint8_t *rec) {
    uint8_t u[16][QK];
    for (int r = 0; r < 16; r++) {
        const uint8_t *b = src + r * stride;
        codes_q6_k(b, u[r]);
        memcpy(rec + 2 * r, b + 208, 2);
        for (int i = 0; i < 16; i++) rec[64 + 32 * (i / 2) + 2 * r + i % 2] = b[192 + i];
    }
    memset(rec + 32, 0, 32);
    /* 4 codes of each row a zmm: quad j of sub-blocks 2p (a) and 2p + 1 (b) */
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(QK));
    const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(3);
    for (int p = 0; p < 8; p++)
        for (int h = 0; h < 2; h++) {
            __m512i bits = _mm512_setzero_si512();
            for (int i = 0; i < 2; i++) {
                const int j = 2 * h + i;
                const __m512i a = _mm512_i32gather_epi32(rows, &u[0][32 * p + 4 * j], 1);
                const __m512i b = _mm512_i32gather_epi32(rows, &u[0][32 * p + 16 + 4 * j], 1);
                const __m512i nib = _mm512_or_si512(_mm512_and_si512(a, low), _mm512_slli_epi16(_mm512_and_si512(b, low), 4));
                _mm512_storeu_si512((void *)(rec + 320 + 256 * p + 64 * j), nib);
                /* top bits: quad 2h at 4-5 (2p) and 6-7 (2p + 1), quad 2h + 1 at 0-1 and 2-3 */
                const __m512i ta = _mm512_and_si512(_mm512_srli_epi16(a, 4), top);
                const __m512i tb = _mm512_and_si512(_mm512_srli_epi16(b, 4), top);
                const __m512i pair = _mm512_or_si512(ta, _mm512_slli_epi16(tb, 2));
                bits = _mm512_or_si512(bits, i ? pair : _mm512_slli_epi16(pair, 4));
            }
            _mm512_storeu_si512((void *)(rec + 2368 + 128 * p + 64 * h), bits);
        }
}

int64_t radixd_kquant_repacked_bytes(int64_t kind, int64_t n, int64_t k) {
    const int at = index_of(kind);
    return at < 0 ? 0 : n / 16 * (k / QK) * REC[at];
}

int radixd_kquant_repack(int64_t kind, const void *src, int64_t n, int64_t k, void *dst) {
    const int at = index_of(kind);
    if (at < 0 || n % 16 || k % QK || !avx512_vnni()) return -2;
    const int64_t nsb = k / QK, stride = nsb * SRC[at], rec = REC[at];
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < n / 16; g++)
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *from = (const uint8_t *)src + 16 * g * stride + sb * SRC[at];
            uint8_t *to = (uint8_t *)dst + (g * nsb + sb) * rec;
            if (at == K_Q6_K)
                repack_q6_k(from, stride, to);
            else if (at == K_Q5_K)
                repack_q5_k(from, stride, to);
            else
                repack_k4(from, stride, 16, to);
        }
    return 0;
}

/* Row `row` of a repacked part as fp32: the file's blocks rebuilt, then kquant_gemm.c's dequantization. */
void radixd_kquant_x16_dequantize_row(const radixd_proj *p, int64_t row, float *out) {
    const int at = index_of(p->kind), q6 = at == K_Q6_K, q5 = at == K_Q5_K;
    const int64_t nsb = p->k / QK, rec = REC[at], r = row % 16;
    const uint8_t *w = (const uint8_t *)p->w + row / 16 * nsb * rec;
    uint8_t blocks[SRC_q6_k];
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *c = w + sb * rec;
        memset(blocks, 0, sizeof blocks);
        if (q6) {
            for (int i = 0; i < 16; i++) blocks[192 + i] = c[64 + 32 * (i / 2) + 2 * r + i % 2];
            memcpy(blocks + 208, c + 2 * r, 2);
            for (int i = 0; i < QK; i++) {
                const int p2 = i / 32, hi = i % 32 >= 16, j = i % 16 / 4, b = i % 4;
                const int lo = c[320 + 256 * p2 + 64 * j + 4 * r + b] >> (4 * hi) & 15;
                const int top = c[2368 + 128 * p2 + 64 * (j / 2) + 4 * r + b] >> ((j % 2 ? 0 : 4) + 2 * hi) & 3;
                const int u = lo | top << 4, h = i / 128, s = i % 128 / 32, l = i % 32;
                blocks[64 * h + 32 * (s & 1) + l] |= (uint8_t)((u & 15) << (4 * (s >> 1)));
                blocks[128 + 32 * h + l] |= (uint8_t)((u >> 4) << (2 * s));
            }
        } else {
            memcpy(blocks, c + 2 * r, 2);
            memcpy(blocks + 2, c + 32 + 2 * r, 2);
            uint8_t *s = blocks + 4;
            for (int i = 0; i < 8; i++) {
                const int sc = c[64 + 16 * i + r], mn = c[192 + 32 * (i / 2) + 2 * r + i % 2];
                if (i < 4) {
                    s[i] |= (uint8_t)(sc & 63);
                    s[i + 4] |= (uint8_t)(mn & 63);
                } else {
                    s[i + 4] = (uint8_t)((sc & 15) | (mn & 15) << 4);
                    s[i - 4] |= (uint8_t)((sc >> 4) << 6);
                    s[i] |= (uint8_t)((mn >> 4) << 6);
                }
            }
            const int codes_at = q5 ? QS_q5_k : 16;
            for (int t = 0; t < 4; t++)
                for (int j = 0; j < 8; j++)
                    memcpy(blocks + codes_at + 32 * t + 4 * j, c + 320 + 512 * t + 64 * j + 4 * r, 4);
            /* Q5_K: bit `sub` of qh byte 4j + b is bit 4r + b of sub-block `sub`'s mask of quad j */
            for (int sub = 0; q5 && sub < 8; sub++)
                for (int j = 0; j < 8; j++) {
                    uint64_t m;
                    memcpy(&m, c + MASKS_q5_k + 128 * (sub / 2) + 16 * j + 8 * (sub % 2), 8);
                    for (int b = 0; b < 4; b++)
                        blocks[QH_q5_k + 4 * j + b] |= (uint8_t)((m >> (4 * r + b) & 1) << sub);
                }
        }
        const int64_t stored = q6 ? RADIXD_W_Q6_K_A8 : q5 ? RADIXD_W_Q5_K_A8 : RADIXD_W_Q4_K_A8;
        const radixd_proj one = {stored, blocks, 0, 0, 0, 1, QK, 0};
        radixd_kquant_dequantize_row(&one, 0, out + sb * QK);
    }
}
