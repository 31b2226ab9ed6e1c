/* Projections y = x . W^T with one summation order per output whatever the row count (radixd_gemm):
 * fp32 weights, and GGUF Q4_1 / Q8_0 blocks expanded to fp32 right before the same tiles; the a8
 * kinds go to a8_gemm.c. Also the encoders that recover a matrix's GGUF blocks.
 *
 * NOTE: row-invariant by construction. Output (m, n) accumulates x[m, k] * w[n, k] in 8 lanes, lane j
 * taking k = j, j + 8, j + 16, ... in increasing k by FMA from zero (a short last group of 8 is read
 * masked, as zeros), then one fixed horizontal sum. Tile shapes, blocking and threads only decide
 * which outputs are computed together, never how one is summed: a row's result is bitwise the same
 * in a call of 1 row or 512, at any position, on any number of threads. */
#include <stdlib.h>

#include "gemm.h"

/* Lanes below `r` on, the rest off (for the masked last group of a row). */
static inline __m256i tail_mask(int64_t r) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), lane);
}

/* One tile: MT rows of x (stride ldx) times NT rows of w (stride k) -> y (stride ldy). */
#define TILE(MT, NT)                                                                                   \
    static void tile_##MT##_##NT(const float *x, int64_t ldx, const float *w, int64_t k, float *y,    \
                                 int64_t ldy) {                                                      \
        __m256 acc[MT][NT];                                                                            \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();                              \
        int64_t kk = 0;                                                                                \
        for (; kk + 8 <= k; kk += 8) {                                                                 \
            __m256 wv[NT];                                                                             \
            for (int j = 0; j < NT; j++) wv[j] = _mm256_loadu_ps(w + j * k + kk);                      \
            for (int i = 0; i < MT; i++) {                                                             \
                __m256 xv = _mm256_loadu_ps(x + i * ldx + kk);                                         \
                for (int j = 0; j < NT; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);        \
            }                                                                                          \
        }                                                                                              \
        if (kk < k) {                                                                                  \
            __m256i mask = tail_mask(k - kk);                                                          \
            __m256 wv[NT];                                                                             \
            for (int j = 0; j < NT; j++) wv[j] = _mm256_maskload_ps(w + j * k + kk, mask);             \
            for (int i = 0; i < MT; i++) {                                                             \
                __m256 xv = _mm256_maskload_ps(x + i * ldx + kk, mask);                                \
                for (int j = 0; j < NT; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);        \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) y[i * ldy + j] = hsum(acc[i][j]);                             \
    }

#define ROW_OF_TILES(MT) TILE(MT, 1) TILE(MT, 2) TILE(MT, 3) TILE(MT, 4) TILE(MT, 5) TILE(MT, 6) \
    TILE(MT, 7) TILE(MT, 8)
ROW_OF_TILES(1)
ROW_OF_TILES(2)
ROW_OF_TILES(3)
ROW_OF_TILES(4)

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t);

#define ROW_OF_FNS(MT) {tile_##MT##_1, tile_##MT##_2, tile_##MT##_3, tile_##MT##_4, tile_##MT##_5, \
    tile_##MT##_6, tile_##MT##_7, tile_##MT##_8}
static const tile_fn TILES[4][8] = {ROW_OF_FNS(1), ROW_OF_FNS(2), ROW_OF_FNS(3), ROW_OF_FNS(4)};

/* How many outputs a tile of `mt` rows takes at once: 8-12 accumulators, so that enough independent
 * FMA chains hide the FMA latency while the tile's accumulators and weights stay in 16 registers. */
static const int TILE_OUTPUTS[4] = {8, 4, 4, 3};
#define ROWS 4

/* Where a call's weights come from (radixd_weights): fp32 rows, or GGUF's Q4_1 / Q8_0 blocks of 32 inputs that a block of
 * rows is expanded from, into a per-thread buffer, right before the tiles read it. The expansion
 * computes each weight exactly as the GGUF reader does (Q4_1: (d * q) + m, Q8_0: q * d, fp32, each
 * operation rounded on its own), so the tiles see bitwise the fp32 weights and the result equals the
 * fp32 call's bit for bit, while a call streams 6 (Q4_1) or 9 (Q8_0) bits per weight instead of 32
 * (scales in fp32). */
/* Group `at` (32 inputs) of a coded matrix as 4 vectors of fp32 weights, inputs 0-7, 8-15, 16-23, 24-31:
 * the one definition of the expansion, shared by the buffered and the in-register paths below. */
static inline __attribute__((always_inline)) void group_q4_1(const void *codes, const float *d, const float *mn,
                                                             int64_t at, __m256 w[4]) {
    /* byte j holds input j in its low nibble and input j + 16 in its high one */
    __m128i b = _mm_loadu_si128((const __m128i *)((const uint8_t *)codes + at * 16));
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    __m256i v[4] = {_mm256_cvtepu8_epi32(lo), _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), _mm256_cvtepu8_epi32(hi),
                    _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))};
    __m256 dv = _mm256_set1_ps(d[at]), mv = _mm256_set1_ps(mn[at]);
    for (int i = 0; i < 4; i++) w[i] = _mm256_add_ps(_mm256_mul_ps(dv, _mm256_cvtepi32_ps(v[i])), mv);
}

static inline __attribute__((always_inline)) void group_q8_0(const void *codes, const float *d, const float *mn,
                                                             int64_t at, __m256 w[4]) {
    (void)mn;
    const int8_t *q = (const int8_t *)codes + at * 32;
    __m256 dv = _mm256_set1_ps(d[at]);
    for (int i = 0; i < 4; i++)
        w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * i)))), dv);
}

/* Rows [n0, n1) of a coded matrix with k inputs (k % 32 == 0), as fp32 rows of stride k. */
static void expand(int kind, const void *codes, const float *d, const float *mn, int64_t k, int64_t n0,
                   int64_t n1, float *out) {
    int64_t groups = k / 32;
    for (int64_t r = n0; r < n1; r++) {
        for (int64_t g = 0; g < groups; g++) {
            __m256 w[4];
            if (kind == RADIXD_W_Q4_1)
                group_q4_1(codes, d, mn, r * groups + g, w);
            else
                group_q8_0(codes, d, mn, r * groups + g, w);
            for (int i = 0; i < 4; i++) _mm256_storeu_ps(out + (r - n0) * k + g * 32 + 8 * i, w[i]);
        }
    }
}

/* A tile of MT rows (MT <= 4) times NT coded weight rows from j0, its weights expanded in registers
 * and used at once (no buffer): for the few rows of a decode step, where writing and reading back
 * the expanded block costs as much as the products. The same weights and the same FMAs in the same
 * order as the buffered tiles: bitwise their result. */
#define FUSED(KIND, MT, NT)                                                                              \
    static void fused_##KIND##_##MT##_##NT(const float *x, int64_t k, const void *codes, const float *d, \
                                           const float *mn, int64_t j0, float *y, int64_t ldy) {        \
        __m256 acc[MT][NT];                                                                              \
        for (int i = 0; i < MT; i++)                                                                     \
            for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();                                \
        const int64_t groups = k / 32;                                                                   \
        for (int64_t g = 0; g < groups; g++)                                                             \
            for (int j = 0; j < NT; j++) {                                                               \
                __m256 w[4];                                                                             \
                prefetch_ahead(codes, GROUP_BYTES_##KIND, d, mn, 4, (j0 + j) * groups + g, groups);      \
                group_##KIND(codes, d, mn, (j0 + j) * groups + g, w);                                    \
                for (int i = 0; i < MT; i++)                                                             \
                    for (int s = 0; s < 4; s++)                                                          \
                        acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * k + g * 32 + 8 * s), w[s],   \
                                                    acc[i][j]);                                          \
            }                                                                                            \
        for (int i = 0; i < MT; i++)                                                                     \
            for (int j = 0; j < NT; j++) y[i * ldy + j] = hsum(acc[i][j]);                               \
    }

#define FUSED_ROW(KIND, MT) FUSED(KIND, MT, 1) FUSED(KIND, MT, 2) FUSED(KIND, MT, 3) FUSED(KIND, MT, 4)
FUSED_ROW(q4_1, 1)
FUSED_ROW(q4_1, 2)
FUSED_ROW(q4_1, 3)
FUSED_ROW(q4_1, 4)
FUSED_ROW(q8_0, 1)
FUSED_ROW(q8_0, 2)
FUSED_ROW(q8_0, 3)
FUSED_ROW(q8_0, 4)

typedef void (*fused_fn)(const float *, int64_t, const void *, const float *, const float *, int64_t, float *,
                         int64_t);
#define FUSED_FNS(KIND, MT) {fused_##KIND##_##MT##_1, fused_##KIND##_##MT##_2, fused_##KIND##_##MT##_3, \
    fused_##KIND##_##MT##_4}
static const fused_fn FUSED_TILES[2][4][4] = {
    {FUSED_FNS(q4_1, 1), FUSED_FNS(q4_1, 2), FUSED_FNS(q4_1, 3), FUSED_FNS(q4_1, 4)},
    {FUSED_FNS(q8_0, 1), FUSED_FNS(q8_0, 2), FUSED_FNS(q8_0, 3), FUSED_FNS(q8_0, 4)}};
/* Outputs a fused tile of `mt` rows takes at once: accumulators and one group's 4 weight vectors fit
 * the 16 registers. */
static const int FUSED_OUTPUTS[4] = {4, 4, 3, 2};

/* y [m, n] (row stride ldy) = x [m, k] . W [n, k]^T; W from `kind` (see above): fp32 rows `w`, or the
 * codes `w` with per-group scales `d` (and minimums `mn` for Q4_1). Threads split the outputs into
 * blocks whose weights fit in a core's L2 (reused by every row tile of the call); within a block,
 * tiles of up to 4 rows run across it, their x rows staying in L1. A call of at most 4 rows over
 * coded weights runs the fused tiles instead, which never write the expanded weights out. Returns 0, or -1 where a buffer
 * could not be allocated (y is then incomplete). */
static int gemm(int kind, const float *x, int64_t m, int64_t k, const void *w, const float *d,
                const float *mn, int64_t n, float *y, int64_t ldy, int threads) {
    int64_t block = (128 * 1024 / 4) / (k > 0 ? k : 1);
    block = block < 24 ? 24 : block - block % 24; /* a multiple of every tile width */
    int64_t blocks = (n + block - 1) / block;
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : failed)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * block, n1 = n0 + block < n ? n0 + block : n;
        const float *wb = (const float *)w + n0 * k; /* row n0 of the block's fp32 rows */
        if (kind != RADIXD_W_F32 && m <= ROWS) {
            int nt = FUSED_OUTPUTS[m - 1];
            for (int64_t j0 = n0; j0 < n1; j0 += nt) {
                int ntt = (int)(n1 - j0 < nt ? n1 - j0 : nt);
                FUSED_TILES[kind - 1][m - 1][ntt - 1](x, k, w, d, mn, j0, y + j0, ldy);
            }
            continue;
        }
        if (kind != RADIXD_W_F32) {
            float *buf = radixd_scratch(block * k);
            if (!buf) {
                failed = 1;
                continue;
            }
            expand(kind, w, d, mn, k, n0, n1, buf);
            wb = buf;
        }
        for (int64_t m0 = 0; m0 < m; m0 += ROWS) {
            int mt = (int)(m - m0 < ROWS ? m - m0 : ROWS);
            int nt = TILE_OUTPUTS[mt - 1];
            for (int64_t j0 = n0; j0 < n1; j0 += nt) {
                int ntt = (int)(n1 - j0 < nt ? n1 - j0 : nt);
                TILES[mt - 1][ntt - 1](x + m0 * k, k, wb + (j0 - n0) * k, k, y + m0 * ldy + j0, ldy);
            }
        }
    }
    return failed ? -1 : 0;
}

float *radixd_scratch(int64_t n) {
    static _Thread_local float *buf = 0;
    static _Thread_local int64_t cap = 0;
    if (n > cap) {
        free(buf);
        cap = n;
        buf = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    }
    return buf;
}

/* Which unit of the library runs a kind. */
typedef enum { UNIT_NONE, UNIT_FP32, UNIT_A8, UNIT_KQUANT, UNIT_KQUANT_X16, UNIT_LEGACY, UNIT_LEGACY_X16 } gemm_unit;

static gemm_unit unit_of(int64_t kind) {
    switch (kind) {
    case RADIXD_W_F32:
    case RADIXD_W_Q4_1:
    case RADIXD_W_Q8_0:
        return UNIT_FP32;
    case RADIXD_W_Q4_1_A8:
    case RADIXD_W_Q8_0_A8:
        return UNIT_A8;
    case RADIXD_W_Q4_K_A8:
    case RADIXD_W_Q5_K_A8:
    case RADIXD_W_Q6_K_A8:
        return UNIT_KQUANT;
    case RADIXD_W_Q4_K_X16:
    case RADIXD_W_Q6_K_X16:
    case RADIXD_W_Q5_K_X16:
        return UNIT_KQUANT_X16;
    case RADIXD_W_Q4_1_X16:
    case RADIXD_W_Q8_0_X16:
    case RADIXD_W_Q5_0_X16:
    case RADIXD_W_Q4_0_X16:
    case RADIXD_W_Q5_1_X16:
        return UNIT_LEGACY_X16;
    case RADIXD_W_Q4_0_A8:
    case RADIXD_W_Q5_0_A8:
    case RADIXD_W_Q5_1_A8:
    case RADIXD_W_F16:
    case RADIXD_W_BF16:
        return UNIT_LEGACY;
    default:
        return UNIT_NONE;
    }
}

/* One part of a projection into y's columns from 0 (row stride ldy); -1: no memory, -2: a kind this
 * build does not run. */
static int gemm_part(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads) {
    const int kind = (int)p->kind;
    int rc;
    switch (unit_of(kind)) {
    case UNIT_FP32:
        rc = gemm(kind, x, m, p->k, p->w, p->d, p->mn, p->n, y, ldy, threads);
        break;
    case UNIT_A8:
        rc = radixd_a8_gemm(kind, x, m, p->k, p->w, p->d, p->mn, p->n, y, ldy, threads);
        break;
    case UNIT_KQUANT:
        rc = radixd_kquant_gemm(p, x, m, y, ldy, threads);
        break;
    case UNIT_KQUANT_X16:
        rc = radixd_kquant_x16_gemm(p, x, m, y, ldy, threads);
        break;
    case UNIT_LEGACY:
        rc = radixd_legacy_gemm(p, x, m, y, ldy, threads);
        break;
    case UNIT_LEGACY_X16:
        rc = radixd_legacy_x16_gemm(p, x, m, y, ldy, threads);
        break;
    default:
        return -2;
    }
    if (rc) return rc;
    if (p->bias != NULL)
        for (int64_t r = 0; r < m; r++)
            for (int64_t j = 0; j < p->n; j++) y[r * ldy + j] = y[r * ldy + j] + p->bias[j];
    return 0;
}

int radixd_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int threads) {
    int64_t width = 0;
    for (const radixd_proj *q = p; q != NULL; q = q->next) width += q->n;
    int64_t col = 0;
    for (const radixd_proj *q = p; q != NULL; q = q->next) {
        const int rc = gemm_part(q, x, m, y + col, width, threads);
        if (rc) return rc;
        col += q->n;
    }
    return 0;
}

/* Row r of the split Q4_1_A8 / Q8_0_A8 layout: w = d * q (+ mn), fp16 scales widened. */
static void a8_dequantize_row(const radixd_proj *p, int64_t r, float *o) {
    const int64_t k = p->k, groups = k / 32;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t at = r * groups + g;
        const float d = _cvtsh_ss(((const half *)p->d)[at]);
        for (int c = 0; c < 32; c++) {
            if (p->kind == RADIXD_W_Q8_0_A8) {
                o[g * 32 + c] = d * (float)((const int8_t *)p->w)[r * k + g * 32 + c];
            } else {
                const uint8_t b = ((const uint8_t *)p->w)[at * 16 + (c & 15)];
                const int q = c < 16 ? b & 0x0F : b >> 4;
                o[g * 32 + c] = d * (float)q + _cvtsh_ss(((const half *)p->mn)[at]);
            }
        }
    }
}

int radixd_dequantize_rows(const radixd_proj *p, const int64_t *rows, int64_t count, float *out) {
    const int64_t k = p->k;
    const gemm_unit unit = unit_of(p->kind);
    if (unit == UNIT_NONE) return -2;
    for (int64_t i = 0; i < count; i++) {
        const int64_t r = rows[i];
        float *o = out + i * k;
        if (p->kind == RADIXD_W_F32)
            for (int64_t c = 0; c < k; c++) o[c] = ((const float *)p->w)[r * k + c];
        else if (unit == UNIT_FP32)
            expand((int)p->kind, p->w, p->d, p->mn, k, r, r + 1, o);
        else if (unit == UNIT_A8)
            a8_dequantize_row(p, r, o);
        else if (unit == UNIT_KQUANT)
            radixd_kquant_dequantize_row(p, r, o);
        else if (unit == UNIT_KQUANT_X16)
            radixd_kquant_x16_dequantize_row(p, r, o);
        else if (unit == UNIT_LEGACY_X16)
            radixd_legacy_x16_dequantize_row(p, r, o);
        else
            radixd_legacy_dequantize_row(p, r, o);
    }
    return 0;
}

static float half_round(float v) { return _cvtsh_ss(_cvtss_sh(v, 0)); }


static float hmin(__m256 v) {
    __m128 a = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_min_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_min_ss(a, _mm_movehdup_ps(a)));
}

/* Whether every lane of a and b holds the same bits (0.0 and -0.0 differ here). */
static int same_bits(__m256 a, __m256 b) {
    __m256i eq = _mm256_cmpeq_epi32(_mm256_castps_si256(a), _mm256_castps_si256(b));
    return _mm256_movemask_epi8(eq) == -1;
}

/* The Q4_1 blocks (scale and minimum fp16 values, codes 0..15) that the fp32 matrix w [n, k] was
 * expanded from, as GGUF's quantizer lays them out (the group's minimum has code 0, its maximum 15).
 * Returns 1 when every weight is recovered bit for bit by (d * q) + m, else 0 (the outputs are then
 * meaningless: the matrix is not Q4_1 data). A code is only a candidate until that check passes.
 * One thread: it runs once per matrix at load, where waking a second thread on a busy machine can
 * cost more than the work. */
int radixd_q4_1_encode(const float *w, int64_t n, int64_t k, uint8_t *codes, float *d, float *mn) {
    int64_t groups = k / 32;
    int ok = 1;
    for (int64_t at = 0; at < n * groups; at++) {
        const float *p = w + at * 32;
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(p + 8 * i);
        float lo = hmin(_mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3])));
        float hi = hmax(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])));
        float dd = half_round((hi - lo) / 15.0f);
        __m256 dv = _mm256_set1_ps(dd), lv = _mm256_set1_ps(lo);
        __m256 inv = _mm256_set1_ps(dd > 0 ? 1.0f / dd : 0.0f);
        int good = half_round(lo) == lo;
        int32_t q[32];
        for (int i = 0; i < 4; i++) {
            __m256 c = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v[i], lv), inv), NEAREST);
            c = _mm256_min_ps(_mm256_max_ps(c, _mm256_setzero_ps()), _mm256_set1_ps(15.0f));
            good &= same_bits(_mm256_add_ps(_mm256_mul_ps(dv, c), lv), v[i]);
            _mm256_storeu_si256((__m256i *)(q + 8 * i), _mm256_cvtps_epi32(c));
        }
        for (int j = 0; j < 16; j++) codes[at * 16 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
        d[at] = dd;
        mn[at] = lo;
        ok &= good;
    }
    return ok;
}

/* Likewise for Q8_0 (fp16 scale, codes -127..127, weight = q * d). */
int radixd_q8_0_encode(const float *w, int64_t n, int64_t k, int8_t *codes, float *d) {
    int64_t groups = k / 32;
    int ok = 1;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t at = 0; at < n * groups; at++) {
        const float *p = w + at * 32;
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(p + 8 * i);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
        }
        float dd = half_round(hmax(amax) / 127.0f);
        __m256 dv = _mm256_set1_ps(dd), inv = _mm256_set1_ps(dd > 0 ? 1.0f / dd : 0.0f);
        int good = 1;
        for (int i = 0; i < 4; i++) {
            __m256 c = _mm256_round_ps(_mm256_mul_ps(v[i], inv), NEAREST);
            c = _mm256_min_ps(_mm256_max_ps(c, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
            good &= same_bits(_mm256_mul_ps(c, dv), v[i]);
            int32_t q[8];
            _mm256_storeu_si256((__m256i *)q, _mm256_cvtps_epi32(c));
            for (int j = 0; j < 8; j++) codes[at * 32 + 8 * i + j] = (int8_t)q[j];
        }
        d[at] = dd;
        ok &= good;
    }
    return ok;
}
