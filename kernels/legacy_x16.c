/* Q4_1, Q8_0, Q5_0, Q4_0 and Q5_1 matrices repacked at load for AVX512-VNNI: radixd_gemm's kinds
 * RADIXD_W_Q4_1_X16, RADIXD_W_Q8_0_X16, RADIXD_W_Q5_0_X16, RADIXD_W_Q4_0_X16 and RADIXD_W_Q5_1_X16, the
 * same weights and the same 8-bit activations (radixd_quantize_pairs) as a8_avx512.c's Q4_1_A8 and
 * Q8_0_A8 and legacy_avx512.c's Q5_0_A8, Q4_0_A8 and Q5_1_A8.
 *
 * Why: one zmm holds 4 code bytes of each of 16 outputs, so one `vpdpbusd` against 4 activation codes
 * broadcast from memory advances 16 outputs at once, and a record (16 outputs x one pair of groups)
 * stays in L1 while tiles of up to X16_ROWS rows go over it. Each output sums a whole group (32
 * inputs, one block) in int32 (exact: two chains, added), then ONE conversion and ONE FMA by the
 * group's scale d x e: a `vcvtdq2ps` and a `vfmadd` per 8 `vpdpbusd` instead of per one (a8_avx512.c
 * keeps an int32 lane per 4 inputs of a pair and converts each lane), hence the last bits differ from
 * the stored kinds'.
 *
 * A record, 16 rows x one pair of groups (64 inputs), offsets in bytes (the file's bytes, moved):
 *   Q4_1 (640): codes [8][16][4] at 0: chunk c, row r, byte b is byte 4c + b of the row's 32 code
 *     bytes of the pair (group 0's 16, then group 1's); its low nibble meets activation bytes 4c..4c + 3
 *     of the pair (a8_avx512.c's order), its high one 4c + 32..; chunks 0-3 are group 0, 4-7 group 1.
 *     d fp16 [2][16] at 512 (group, row), minimums fp16 [2][16] at 576.
 *   Q8_0 (1088): codes + 128 [16][16][4] at 0: chunk c, row r, byte b is code 4c + b of the row's 64
 *     (chunks 0-7 group 0); d fp16 [2][16] at 1024.
 *   Q4_0 (576): Q4_1's codes and d, no minimums.
 *   Q5_0 (704): Q4_0's record (the codes' low 4 bits), then at 576 the 5th bits as byte masks
 *     u64 [8][2] (chunk c's low nibbles', bit 4r + b, then its high ones'): a tile adds 16 to the
 *     masked code bytes (the file's bytes, where bytes of 0..31 would take 1.5x).
 *   Q5_1 (768): Q4_1's record, then Q5_0's masks at 640.
 * The offset formats (Q4_0: d x (q - 8), Q5_0: d x (q - 16)) start a group's int32 sum of codes from
 * -offset x the activation codes' sum: exactly the sum over the values code - offset, with no
 * minimums' term (Q4_1 with m = -8d would add an FMA a group). Q4_1 and Q5_1 (d x q + m) add their
 * minimums' terms m x es.
 * NOTE: row-invariant: every output runs the same operations in the same order whatever the tile, the
 * row count or the threads: per group in order, acc = fma(cvt(int32 sum), d x e, acc); the minimums'
 * terms mins = fma(m, es, mins) in the same order; y = acc + mins. Called only where the CPU has
 * AVX512-VNNI and BW.
 */
#include <string.h>

#include "gemm.h"

/* The kinds, by their index in the tables below. */
enum { X_Q4_1, X_Q8_0, X_Q5_0, X_Q4_0, X_Q5_1, X_KINDS };
#define D_AT 512 /* the nibble kinds' d; Q8_0's at D_AT_q8_0 */
#define D_AT_q8_0 1024
#define MN_AT 576
#define X16_ROWS 4
#ifndef X16_AHEAD
#define X16_AHEAD 12288
#endif

/* A nibble kind's traits, constants wherever a tile is instantiated: 5th bits, minimums, offset. */
static inline __attribute__((always_inline)) int has_fifth(int at) { return at == X_Q5_0 || at == X_Q5_1; }
static inline __attribute__((always_inline)) int has_mins(int at) { return at == X_Q4_1 || at == X_Q5_1; }
static inline __attribute__((always_inline)) int offset_of(int at) {
    return at == X_Q5_0 ? 16 : at == X_Q4_0 ? 8 : 0;
}
/* A record's bytes: codes, d, then the minimums and the 5th bits' masks where the kind has them. */
static inline __attribute__((always_inline)) int record_bytes(int at) {
    return at == X_Q8_0 ? 1088 : 576 + 64 * has_mins(at) + 128 * has_fifth(at);
}
static inline __attribute__((always_inline)) int masks_at(int at) { return 576 + 64 * has_mins(at); }

/* The file's block of a kind: its bytes, where its codes, 5th bits (qh) and fp16 minimum start (0: none). */
typedef struct {
    int bytes, codes, qh, mn;
} x16_block;
static const x16_block BLOCK[X_KINDS] = {
    [X_Q4_1] = {20, 4, 0, 2},
    [X_Q8_0] = {34, 2, 0, 0},
    [X_Q5_0] = {BLOCK_BYTES_q5_0, QS_AT_q5_0, QH_AT_q5_0, 0},
    [X_Q4_0] = {BLOCK_BYTES_q4_0, QS_AT_q4_0, 0, 0},
    [X_Q5_1] = {BLOCK_BYTES_q5_1, QS_AT_q5_1, QH_AT_q5_1, 2},
};

/* The tiles' loops over rows, lanes and chunks unrolled, so that the accumulators stay in registers. */
#define UNROLL _Pragma("GCC unroll 8")

static inline __attribute__((always_inline)) __m512i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Asks for the lines of the record X16_AHEAD bytes past rec: a column's first tile streams it from
 * memory (a decode step), its later tiles find it in L1 and ask nothing. */
static inline __attribute__((always_inline)) void ask_record(const uint8_t *rec, int bytes) {
    UNROLL for (int i = 0; i < bytes; i += 64) _mm_prefetch((const char *)rec + X16_AHEAD + i, _MM_HINT_T0);
}

/* The R rows' quantized activations (radixd_quantize_pairs' a8_rows, each row's own pointer) and, per
 * group, es (Q4_1, Q5_1: the minimums' factor) or s0 (Q8_0, Q5_0, Q4_0: the int32 a group's sum starts
 * from). */
typedef struct {
    const int8_t *q[X16_ROWS];
    const float *e[X16_ROWS];
    const float *es[X16_ROWS];
    const int32_t *s0[X16_ROWS];
} x16_in;

/* Adds one group's exact int32 dot products (16 outputs, R rows) into acc: one conversion and one FMA by
 * the group's scale d x e (e: the row's lane `lane` of pair p, the group's activation scale). */
static inline __attribute__((always_inline)) void add_group(const uint8_t *rec, int d_at, const x16_in *x, int64_t p,
                                                            int lane, const __m512i (*s)[2], __m512 *acc,
                                                            const int R) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + d_at)));
    UNROLL for (int r = 0; r < R; r++) {
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(x->e[r][p * 16 + lane]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s[r][0], s[r][1])), scale, acc[r]);
    }
}

static inline __attribute__((always_inline)) __mmask64 mask_at(const uint8_t *p) {
    uint64_t m;
    memcpy(&m, p, 8);
    return _cvtu64_mask64(m);
}

/* R rows x one column of 16 outputs of nibble kind `at` at w, every pair: group h is chunks 4h..4h + 3
 * (their low nibbles against activation bytes 4c.., their high ones against 4c + 32..; the 5th bits
 * added where the kind has them), summed in two int32 chains a row (the offset kinds' starting from
 * s0); the minimums' terms m x es go to a second accumulator, added to the first at the end. */
static inline __attribute__((always_inline)) void tile_nibbles(const x16_in *x, const uint8_t *w, int64_t pairs,
                                                               float *y, int64_t ldy, int ask, const int R,
                                                               const int at) {
    const __m512i low = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
    const int bytes = record_bytes(at), q5 = has_fifth(at), mn = has_mins(at), hb = masks_at(at);
    __m512 acc[X16_ROWS], mins[X16_ROWS];
    UNROLL for (int r = 0; r < R; r++) acc[r] = mins[r] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) {
        const uint8_t *rec = w + p * bytes;
        if (ask) ask_record(rec, bytes);
        UNROLL for (int h = 0; h < 2; h++) {
            __m512i s[X16_ROWS][2];
            UNROLL for (int r = 0; r < R; r++) {
                s[r][0] = offset_of(at) ? _mm512_set1_epi32(x->s0[r][2 * p + h]) : _mm512_setzero_si512();
                s[r][1] = _mm512_setzero_si512();
            }
            UNROLL for (int j = 0; j < 4; j++) {
                const int c = 4 * h + j;
                const __m512i v = _mm512_loadu_si512((const void *)(rec + 64 * c));
                __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                if (q5) {
                    lo = _mm512_mask_add_epi8(lo, mask_at(rec + hb + 16 * c), lo, fifth);
                    hi = _mm512_mask_add_epi8(hi, mask_at(rec + hb + 16 * c + 8), hi, fifth);
                }
                UNROLL for (int r = 0; r < R; r++) {
                    const int8_t *a = x->q[r] + p * 64 + 4 * c;
                    s[r][0] = _mm512_dpbusd_epi32(s[r][0], lo, bcast4(a));
                    s[r][1] = _mm512_dpbusd_epi32(s[r][1], hi, bcast4(a + 32));
                }
            }
            add_group(rec, D_AT + 32 * h, x, p, 4 * h, s, acc, R);
            if (!mn) continue;
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + MN_AT + 32 * h)));
            UNROLL for (int r = 0; r < R; r++)
                mins[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(x->es[r][2 * p + h]), mins[r]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * ldy, mn ? _mm512_add_ps(acc[r], mins[r]) : acc[r]);
}

/* The same for 16 Q8_0 outputs: group h is chunks 8h..8h + 7 (codes + 128), its sum starting from s0. */
static inline __attribute__((always_inline)) void tile_q8_0(const x16_in *x, const uint8_t *w, int64_t pairs,
                                                            float *y, int64_t ldy, int ask, const int R) {
    __m512 acc[X16_ROWS];
    UNROLL for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) {
        const uint8_t *rec = w + p * record_bytes(X_Q8_0);
        if (ask) ask_record(rec, record_bytes(X_Q8_0));
        UNROLL for (int h = 0; h < 2; h++) {
            __m512i s[X16_ROWS][2];
            UNROLL for (int r = 0; r < R; r++) {
                s[r][0] = _mm512_set1_epi32(x->s0[r][2 * p + h]);
                s[r][1] = _mm512_setzero_si512();
            }
            UNROLL for (int j = 0; j < 8; j++) {
                const int c = 8 * h + j;
                const __m512i v = _mm512_loadu_si512((const void *)(rec + 64 * c));
                UNROLL for (int r = 0; r < R; r++)
                    s[r][j % 2] = _mm512_dpbusd_epi32(s[r][j % 2], v, bcast4(x->q[r] + p * 64 + 4 * c));
            }
            add_group(rec, D_AT_q8_0 + 32 * h, x, p, 8 * h, s, acc, R);
        }
    }
    UNROLL for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

#define X16TILE(KIND, R, CALL)                                                                             \
    static void KIND##_##R(const x16_in *x, const uint8_t *w, int64_t pairs, float *y, int64_t ldy, int ask) { \
        CALL;                                                                                              \
    }
#define X16NIBBLES(KIND, AT)                                                                               \
    X16TILE(KIND, 1, tile_nibbles(x, w, pairs, y, ldy, ask, 1, AT))                                        \
    X16TILE(KIND, 2, tile_nibbles(x, w, pairs, y, ldy, ask, 2, AT))                                        \
    X16TILE(KIND, 3, tile_nibbles(x, w, pairs, y, ldy, ask, 3, AT))                                        \
    X16TILE(KIND, 4, tile_nibbles(x, w, pairs, y, ldy, ask, 4, AT))
X16NIBBLES(q4_1, X_Q4_1)
X16NIBBLES(q5_0, X_Q5_0)
X16NIBBLES(q4_0, X_Q4_0)
X16NIBBLES(q5_1, X_Q5_1)
X16TILE(q8_0, 1, tile_q8_0(x, w, pairs, y, ldy, ask, 1))
X16TILE(q8_0, 2, tile_q8_0(x, w, pairs, y, ldy, ask, 2))
X16TILE(q8_0, 3, tile_q8_0(x, w, pairs, y, ldy, ask, 3))
X16TILE(q8_0, 4, tile_q8_0(x, w, pairs, y, ldy, ask, 4))

typedef void (*x16_tile_fn)(const x16_in *, const uint8_t *, int64_t, float *, int64_t, int);
static const x16_tile_fn X16_TILES[X_KINDS][X16_ROWS] = {
    [X_Q4_1] = {q4_1_1, q4_1_2, q4_1_3, q4_1_4}, [X_Q8_0] = {q8_0_1, q8_0_2, q8_0_3, q8_0_4},
    [X_Q5_0] = {q5_0_1, q5_0_2, q5_0_3, q5_0_4}, [X_Q4_0] = {q4_0_1, q4_0_2, q4_0_3, q4_0_4},
    [X_Q5_1] = {q5_1_1, q5_1_2, q5_1_3, q5_1_4}};

/* A kind's index in X16_TILES, -1 for another. */
static int x16_index(int64_t kind) {
    switch (kind) {
    case RADIXD_W_Q4_1_X16:
        return X_Q4_1;
    case RADIXD_W_Q8_0_X16:
        return X_Q8_0;
    case RADIXD_W_Q5_0_X16:
        return X_Q5_0;
    case RADIXD_W_Q4_0_X16:
        return X_Q4_0;
    case RADIXD_W_Q5_1_X16:
        return X_Q5_1;
    default:
        return -1;
    }
}

/* y [m, n] (row stride ldy) = x [m, k] . W^T over one repacked part, x quantized as a8_gemm.c does on
 * its AVX512-VNNI path. Threads split the columns of 16 outputs; within one, tiles of X16_ROWS rows
 * (then fewer) go over the column's records while they stay in L1. */
int radixd_legacy_x16_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads) {
    const int at = x16_index(p->kind), q8 = at == X_Q8_0;
    if (at < 0 || p->k % 64 || p->n % 16 || !avx512_vnni()) return -2;
    const int64_t k = p->k, groups = k / 32, per_row = groups * 8, cols = p->n / 16;
    const int64_t rec = record_bytes(at), pairs = k / 64;
    /* e, c [m, per_row]; es, s0 [m, groups]; codes [m, k] bytes */
    float *buf = radixd_scratch(m * (2 * per_row + 2 * groups) + (m * k + 3) / 4);
    if (!buf) return -1;
    const a8_rows rows = {(int8_t *)(buf + m * (2 * per_row + 2 * groups)), buf, buf + m * 2 * per_row,
                          (int32_t *)(buf + m * per_row)};
    int32_t *s0 = (int32_t *)(buf + m * (2 * per_row + groups));
    radixd_quantize_pairs(x, m, k, !q8, &rows);
    if (q8) /* a group's lane starts (-128 x its activation codes' sum, 4 at a time) as one int32 */
        for (int64_t g = 0; g < m * groups; g++) {
            int32_t sum = 0;
            for (int l = 0; l < 8; l++) sum += rows.c[g / 2 * 16 + 8 * (g % 2) + l];
            s0[g] = sum;
        }
    if (offset_of(at)) /* -offset x the group's activation codes' sum: bytes 16h.. and 32 + 16h.. of its pair */
        for (int64_t g = 0; g < m * groups; g++) {
            const int8_t *a = rows.q + g / 2 * 64 + 16 * (g % 2);
            int32_t sum = 0;
            for (int i = 0; i < 16; i++) sum += a[i] + a[32 + i];
            s0[g] = -offset_of(at) * sum;
        }
    const uint8_t *w = (const uint8_t *)p->w;
    const x16_tile_fn *tiles = X16_TILES[at];
#pragma omp parallel for num_threads(threads) schedule(static) if (p->n * m * k >= PARALLEL_MACS)
    for (int64_t col = 0; col < cols; col++)
        for (int64_t r0 = 0; r0 < m; r0 += X16_ROWS) {
            const int R = m - r0 < X16_ROWS ? (int)(m - r0) : X16_ROWS;
            x16_in in;
            for (int r = 0; r < R; r++) {
                in.q[r] = rows.q + (r0 + r) * k;
                in.e[r] = rows.e + (r0 + r) * per_row;
                in.es[r] = rows.es + (r0 + r) * groups;
                in.s0[r] = s0 + (r0 + r) * groups;
            }
            tiles[R - 1](&in, w + col * pairs * rec, pairs, y + r0 * ldy + 16 * col, ldy, r0 == 0);
        }
    return 0;
}

int64_t radixd_legacy_repacked_bytes(int64_t kind, int64_t n, int64_t k) {
    const int at = x16_index(kind);
    return at < 0 ? 0 : n / 16 * (k / 64) * record_bytes(at);
}

int radixd_legacy_repack(int64_t kind, const void *src, int64_t n, int64_t k, void *dst) {
    const int at = x16_index(kind), q8 = at == X_Q8_0;
    if (at < 0 || n % 16 || k % 64 || !avx512_vnni()) return -2;
    const x16_block blk = BLOCK[at];
    const int q5 = has_fifth(at), hb = masks_at(at);
    const int64_t pairs = k / 64, stride = k / 32 * blk.bytes, rec = record_bytes(at), code_bytes = q8 ? 32 : 16;
#pragma omp parallel for schedule(static)
    for (int64_t col = 0; col < n / 16; col++)
        for (int64_t p = 0; p < pairs; p++) {
            uint8_t *to = (uint8_t *)dst + (col * pairs + p) * rec;
            uint64_t fifth[8][2] = {{0}}; /* the 5th bits: chunk c's low nibbles', its high ones' */
            for (int r = 0; r < 16; r++) {
                const uint8_t *b = (const uint8_t *)src + (16 * col + r) * stride + 2 * p * blk.bytes;
                uint8_t codes[64];
                for (int h = 0; h < 2; h++) {
                    const uint8_t *block = b + h * blk.bytes;
                    memcpy(codes + h * code_bytes, block + blk.codes, (size_t)code_bytes);
                    memcpy(to + (q8 ? D_AT_q8_0 : D_AT) + 32 * h + 2 * r, block, 2);
                    if (blk.mn) memcpy(to + MN_AT + 32 * h + 2 * r, block + blk.mn, 2);
                    if (q5) {
                        uint32_t qh;
                        memcpy(&qh, block + blk.qh, 4);
                        for (int j = 0; j < 16; j++) /* code byte j: inputs j (low nibble) and j + 16 */
                            for (int half = 0; half < 2; half++)
                                fifth[4 * h + j / 4][half] |= (uint64_t)(qh >> (j + 16 * half) & 1) << (4 * r + j % 4);
                    }
                }
                const uint32_t flip = q8 ? 0x80808080u : 0; /* Q8_0's codes as vpdpbusd's unsigned operand */
                for (int c = 0; c < 2 * code_bytes / 4; c++) {
                    uint32_t four;
                    memcpy(&four, codes + 4 * c, 4);
                    four ^= flip;
                    memcpy(to + 64 * c + 4 * r, &four, 4);
                }
            }
            if (q5) memcpy(to + hb, fifth, sizeof fifth);
        }
    return 0;
}

/* Row `row` of a repacked part as fp32, as f32_gemm.c / legacy_gemm.c dequantize the stored rows. */
void radixd_legacy_x16_dequantize_row(const radixd_proj *p, int64_t row, float *out) {
    const int at = x16_index(p->kind), q8 = at == X_Q8_0, q5 = has_fifth(at), mn = has_mins(at);
    const int64_t pairs = p->k / 64, rec = record_bytes(at), r = row % 16;
    const uint8_t *w = (const uint8_t *)p->w + row / 16 * pairs * rec;
    for (int64_t pr = 0; pr < pairs; pr++) {
        const uint8_t *c = w + pr * rec;
        for (int h = 0; h < 2; h++) {
            uint16_t dh, mh = 0;
            memcpy(&dh, c + (q8 ? D_AT_q8_0 : D_AT) + 32 * h + 2 * r, 2);
            if (mn) memcpy(&mh, c + MN_AT + 32 * h + 2 * r, 2);
            const float d = _cvtsh_ss(dh);
            float *o = out + pr * 64 + 32 * h;
            for (int i = 0; i < 32; i++) {
                if (q8) {
                    const int at8 = 32 * h + i;
                    o[i] = d * (float)(int8_t)(c[64 * (at8 / 4) + 4 * r + at8 % 4] ^ 0x80);
                    continue;
                }
                const int byte = 16 * h + i % 16; /* the code byte */
                const uint8_t b = c[64 * (byte / 4) + 4 * r + byte % 4];
                int q = i < 16 ? b & 0x0F : b >> 4;
                if (q5) {
                    uint64_t fifth;
                    memcpy(&fifth, c + masks_at(at) + 16 * (byte / 4) + 8 * (i >= 16), 8);
                    q |= (int)(fifth >> (4 * r + byte % 4) & 1) << 4;
                }
                /* the stored kinds' expressions: d x (q - offset), or d x q + m */
                o[i] = mn ? d * (float)q + _cvtsh_ss(mh) : d * (float)(q - offset_of(at));
            }
        }
    }
}
