/* Projections over the weights a GGUF stores beside its main format, read as the file stores them:
 * the legacy blocks Q4_0, Q5_0 and Q5_1 times 8-bit activations (radixd_gemm's kinds Q4_0_A8, Q5_0_A8,
 * Q5_1_A8), and rows of 16-bit floats (F16, BF16) in fp32 arithmetic.
 *
 * The legacy kinds quantize x as the a8 kinds do (gemm.h's quantize_group; radixd_quantize_pairs on
 * the AVX512-VNNI path, legacy_avx512.c) and multiply codes in integers. A block's codes enter the
 * byte products unsigned (Q4_0: q 0..15, Q5_0 / Q5_1: q 0..31); the signed formats' offset (8 or 16)
 * comes off in integers, as offset * (the activation codes' pair sums), so each lane holds exactly
 * sum((q - offset) * a) and the arithmetic is the Q8_0 kind's:
 *     sum(w * x) ~ d * e * sum((q - offset) * a)          (Q4_0, Q5_0: w = d * (q - offset))
 *     sum(w * x) ~ d * e * sum(q * a) + m * (e * sum(a))  (Q5_1: w = d * q + m, as Q4_1)
 * The 16-bit kinds widen 8 weights at a time (F16C; a shift for bf16) right before the FMAs, in the
 * fp32 kind's order (f32_gemm.c): bitwise the fp32 kind's result over the widened matrix.
 *
 * NOTE: row-invariant by construction, as a8_gemm.c: a row is quantized on its own, each output sums
 * its groups in increasing order with the same operations in every tile (8 int32 lanes a group, one
 * FMA each; Q5_1's minimums' terms in a scalar in the same order; one fixed horizontal sum last),
 * whatever the row count, the row's position or the thread count; the path (AVX2 or AVX512-VNNI)
 * depends on the CPU and on k only. */
#include <string.h>

#include "gemm.h"

static inline __attribute__((always_inline)) uint16_t load16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* A block's 16 nibble bytes as 32 unsigned codes in input order. */
static inline __attribute__((always_inline)) __m256i nibbles(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    return _mm256_set_m128i(hi, lo);
}

/* A block's 32 fifth bits (bit j: input j) as 16 or 0 per input byte. */
static inline __attribute__((always_inline)) __m256i fifth_bits(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    /* byte j takes qh's byte j / 8 (the shuffle works within 128-bit halves: inputs 16..31 in the upper) */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                            3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i select = _mm256_set1_epi64x((int64_t)0x8040201008040201);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, select), select), _mm256_set1_epi8(16));
}

static inline __attribute__((always_inline)) __m256i codes_q4_0(const uint8_t *b) { return nibbles(b + QS_AT_q4_0); }

static inline __attribute__((always_inline)) __m256i codes_q5_0(const uint8_t *b) {
    return _mm256_or_si256(nibbles(b + QS_AT_q5_0), fifth_bits(b + QH_AT_q5_0));
}

static inline __attribute__((always_inline)) __m256i codes_q5_1(const uint8_t *b) {
    return _mm256_or_si256(nibbles(b + QS_AT_q5_1), fifth_bits(b + QH_AT_q5_1));
}

/* offset * (the pair sums of a group's activation codes) in int16, what maddubs' unsigned codes gain over
 * the signed ones (|sum| <= 16 * 254: no saturation). */
static inline __attribute__((always_inline)) __m256i offset_q4_0(__m256i a) {
    return _mm256_maddubs_epi16(_mm256_set1_epi8(8), a);
}

static inline __attribute__((always_inline)) __m256i offset_q5_0(__m256i a) {
    return _mm256_maddubs_epi16(_mm256_set1_epi8(16), a);
}

static inline __attribute__((always_inline)) __m256i offset_q5_1(__m256i a) {
    (void)a;
    return _mm256_setzero_si256();
}

#define MINS_q4_0 0
#define MINS_q5_0 0
#define MINS_q5_1 1

/* NT outputs from j0 for MT rows of the quantized x (a8_rows at the tile's first row; d and mn unused:
 * they are in the blocks). The same operations in the same order for an output whatever the tile. */
#define LTILE(KIND, MT, NT)                                                                             \
    static void l_##KIND##_##MT##_##NT(const a8_rows *x, int64_t k, const void *w, const half *d,      \
                                       const half *mn, int64_t j0, float *y, int64_t ldy) {            \
        (void)d, (void)mn;                                                                             \
        const int64_t groups = k / 32, row = groups * BLOCK_BYTES_##KIND;                              \
        const uint8_t *blocks = (const uint8_t *)w + j0 * row;                                         \
        __m256 acc[MT][NT];                                                                            \
        float macc[MT][NT];                                                                            \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps(), macc[i][j] = 0.0f;           \
        for (int64_t g = 0; g < groups; g++) {                                                         \
            __m256i a[MT], off[MT];                                                                    \
            for (int i = 0; i < MT; i++) {                                                             \
                a[i] = _mm256_loadu_si256((const __m256i *)(x->q + i * k + g * 32));                   \
                off[i] = offset_##KIND(a[i]);                                                          \
            }                                                                                          \
            for (int j = 0; j < NT; j++) {                                                             \
                const uint8_t *b = blocks + j * row + g * BLOCK_BYTES_##KIND;                          \
                _mm_prefetch((const char *)b + PREFETCH_OUTPUTS * row, _MM_HINT_T0);                   \
                const __m256i u = codes_##KIND(b);                                                     \
                const float dd = _cvtsh_ss(load16(b));                                                 \
                for (int i = 0; i < MT; i++) {                                                         \
                    const __m256i s = _mm256_sub_epi16(_mm256_maddubs_epi16(u, a[i]), off[i]);         \
                    const __m256i p = _mm256_madd_epi16(s, _mm256_set1_epi16(1));                      \
                    const __m256 sc = _mm256_set1_ps(dd * x->e[i * groups + g]);                       \
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[i][j]);                 \
                    if (MINS_##KIND) macc[i][j] += _cvtsh_ss(load16(b + 2)) * x->es[i * groups + g];   \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) y[i * ldy + j] = hsum(acc[i][j]) + macc[i][j];                \
    }

#define LTILES(KIND) LTILE(KIND, 1, 1) LTILE(KIND, 1, 4) LTILE(KIND, 4, 1) LTILE(KIND, 4, 2)
LTILES(q4_0)
LTILES(q5_0)
LTILES(q5_1)

/* [Q4_0, Q5_0, Q5_1][rows 1 or 4][outputs 1, or the wide tile's: 4 for one row, 2 for four] */
static const a8_tile_fn LEGACY_TILES[3][2][2] = {{{l_q4_0_1_1, l_q4_0_1_4}, {l_q4_0_4_1, l_q4_0_4_2}},
                                                 {{l_q5_0_1_1, l_q5_0_1_4}, {l_q5_0_4_1, l_q5_0_4_2}},
                                                 {{l_q5_1_1_1, l_q5_1_1_4}, {l_q5_1_4_1, l_q5_1_4_2}}};

/* The legacy kinds: x [m, k] quantized into the calling thread's scratch, then threads over blocks of 4
 * outputs, rows in tiles of 4 (each unpacked weight group serves 4 rows), the rest one at a time. */
static int legacy_a8(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads) {
    const int64_t k = p->k, n = p->n, groups = k / 32;
    const int f = (int)p->kind - RADIXD_W_Q4_0_A8;
    /* NOTE: the path depends on the build and on k only, so a row's result never depends on its call. */
    const int wide = groups % 2 == 0 && avx512_vnni();
    const int64_t per_row = wide ? groups * 8 : groups; /* entries of e and c a row */
    float *buf = radixd_scratch(m * (2 * per_row + groups) + (m * k + 3) / 4);
    if (!buf) return -1;
    a8_rows rows = {(int8_t *)(buf + m * (2 * per_row + groups)), buf, buf + m * 2 * per_row,
                    (int32_t *)(buf + m * per_row)};
    const a8_tile_fn(*fns)[2] = LEGACY_TILES[f];
    int nt4 = 2; /* outputs a tile of 4 rows takes (one row: 4) */
    if (wide) {
        /* input order, as Q8_0's; its lane starts -128 * sum(a) become -offset * sum(a) (exactly) */
        radixd_quantize_pairs(x, m, k, 0, &rows);
        const int32_t div = p->kind == RADIXD_W_Q4_0_A8 ? 128 / 8 : 128 / 16;
        for (int64_t i = 0; i < m * per_row; i++) rows.c[i] = p->kind == RADIXD_W_Q5_1_A8 ? 0 : rows.c[i] / div;
        fns = radixd_legacy_wide_tiles[f];
        nt4 = 4;
    } else
        for (int64_t r = 0; r < m; r++)
            for (int64_t g = 0; g < groups; g++) {
                const int64_t at = r * groups + g;
                const __m256i b = quantize_group(x + r * k + g * 32, rows.e + at, rows.es + at);
                _mm256_storeu_si256((__m256i *)(rows.q + r * k + g * 32), b);
            }
    const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (n * m * k >= PARALLEL_MACS)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t j0 = 4 * b, j1 = j0 + 4 < n ? j0 + 4 : n;
        for (int64_t r = 0; r < m;) {
            const int mt = r + 4 <= m ? 4 : 1;
            const int nt = mt == 4 ? nt4 : 4;
            const a8_rows at = {rows.q + r * k, rows.e + r * per_row, rows.es + r * groups, rows.c + r * per_row};
            for (int64_t j = j0; j < j1;) {
                const int wide_tile = j + nt <= j1;
                fns[mt == 4][wide_tile](&at, k, p->w, 0, 0, j, y + r * ldy + j, ldy);
                j += wide_tile ? nt : 1;
            }
            r += mt;
        }
    }
    return 0;
}

/* 8 weights of a 16-bit row as fp32, exactly. */
static inline __attribute__((always_inline)) __m256 widen_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __attribute__((always_inline)) __m256 widen_bf16(const uint16_t *p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* MT rows of x (stride k) times NT 16-bit rows of w (stride k) -> y (stride ldy), in the fp32 kind's
 * order: lane l sums inputs l, l + 8, ... by FMA from zero, a short last 8 read as zeros, then hsum. */
#define HTILE(KIND, MT, NT)                                                                            \
    static void h_##KIND##_##MT##_##NT(const float *x, int64_t k, const uint16_t *w, float *y,         \
                                       int64_t ldy) {                                                  \
        __m256 acc[MT][NT];                                                                            \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();                              \
        int64_t kk = 0;                                                                                \
        for (; kk + 8 <= k; kk += 8) {                                                                 \
            __m256 wv[NT];                                                                             \
            for (int j = 0; j < NT; j++) wv[j] = widen_##KIND(w + j * k + kk);                         \
            for (int i = 0; i < MT; i++) {                                                             \
                const __m256 xv = _mm256_loadu_ps(x + i * k + kk);                                     \
                for (int j = 0; j < NT; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);        \
            }                                                                                          \
        }                                                                                              \
        if (kk < k) {                                                                                  \
            __m256 wv[NT];                                                                             \
            for (int j = 0; j < NT; j++) {                                                             \
                uint16_t t[8] = {0};                                                                   \
                memcpy(t, w + j * k + kk, (size_t)(k - kk) * sizeof *t);                               \
                wv[j] = widen_##KIND(t);                                                               \
            }                                                                                          \
            for (int i = 0; i < MT; i++) {                                                             \
                float t[8] = {0};                                                                      \
                memcpy(t, x + i * k + kk, (size_t)(k - kk) * sizeof *t);                               \
                const __m256 xv = _mm256_loadu_ps(t);                                                  \
                for (int j = 0; j < NT; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);        \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < MT; i++)                                                                   \
            for (int j = 0; j < NT; j++) y[i * ldy + j] = hsum(acc[i][j]);                             \
    }

#define HTILES(KIND) HTILE(KIND, 1, 1) HTILE(KIND, 1, 8) HTILE(KIND, 4, 1) HTILE(KIND, 4, 3)
HTILES(f16)
HTILES(bf16)

typedef void (*h_tile_fn)(const float *, int64_t, const uint16_t *, float *, int64_t);
/* [F16, BF16][rows 1 or 4][outputs 1 or H_OUTPUTS'] */
static const h_tile_fn H_TILES[2][2][2] = {{{h_f16_1_1, h_f16_1_8}, {h_f16_4_1, h_f16_4_3}},
                                           {{h_bf16_1_1, h_bf16_1_8}, {h_bf16_4_1, h_bf16_4_3}}};
/* Outputs a tile of 1 or 4 rows takes at once: 8-12 accumulators hide the FMA latency, and they, the
 * widened weights and a row of x fit the 16 registers. */
static const int H_OUTPUTS[2] = {8, 3};

/* The 16-bit kinds: threads over blocks of outputs whose weights fit a core's L2 (reused by every row
 * tile), rows in tiles of 4 within a block (the rest one at a time). */
static int legacy_16(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads) {
    const int64_t k = p->k, n = p->n;
    const uint16_t *w = (const uint16_t *)p->w;
    const h_tile_fn(*fns)[2] = H_TILES[p->kind == RADIXD_W_BF16];
    int64_t block = (128 * 1024 / 2) / (k > 0 ? k : 1);
    block = block < 24 ? 24 : block - block % 24; /* a multiple of both tile widths */
    const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for num_threads(threads) schedule(static) if (blocks > 1 && m * n * k >= PARALLEL_MACS)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t n0 = b * block, n1 = n0 + block < n ? n0 + block : n;
        for (int64_t r = 0; r < m;) {
            const int mt = r + 4 <= m ? 4 : 1, nt = H_OUTPUTS[mt == 4];
            for (int64_t j = n0; j < n1;) {
                const int wide_tile = j + nt <= n1;
                fns[mt == 4][wide_tile](x + r * k, k, w + j * k, y + r * ldy + j, ldy);
                j += wide_tile ? nt : 1;
            }
            r += mt;
        }
    }
    return 0;
}

int radixd_legacy_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int64_t ldy, int threads) {
    if (p->kind == RADIXD_W_F16 || p->kind == RADIXD_W_BF16) return legacy_16(p, x, m, y, ldy, threads);
    return legacy_a8(p, x, m, y, ldy, threads);
}

/* As gguf-py's dequantize computes them, bit for bit: Q4_0 d * (q - 8), Q5_0 d * (q - 16) (exact
 * products), Q5_1 (d * q) + m (the sum rounded once), fp16 and bf16 widened exactly; save an fp16
 * signalling NaN, which F16C (the tiles' widening too) returns quiet and numpy keeps signalling. */
void radixd_legacy_dequantize_row(const radixd_proj *p, int64_t row, float *out) {
    const int64_t k = p->k;
    const int kind = (int)p->kind;
    if (kind == RADIXD_W_F16 || kind == RADIXD_W_BF16) {
        const uint16_t *w = (const uint16_t *)p->w + row * k;
        for (int64_t c = 0; c < k; c++) {
            const uint32_t bits = (uint32_t)w[c] << 16;
            if (kind == RADIXD_W_F16)
                out[c] = _cvtsh_ss(w[c]);
            else
                memcpy(out + c, &bits, sizeof bits);
        }
        return;
    }
    const int64_t bytes = kind == RADIXD_W_Q4_0_A8   ? BLOCK_BYTES_q4_0
                          : kind == RADIXD_W_Q5_0_A8 ? BLOCK_BYTES_q5_0
                                                     : BLOCK_BYTES_q5_1;
    const int64_t qs_at = kind == RADIXD_W_Q4_0_A8 ? QS_AT_q4_0 : kind == RADIXD_W_Q5_0_A8 ? QS_AT_q5_0 : QS_AT_q5_1;
    const int64_t groups = k / 32;
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = (const uint8_t *)p->w + (row * groups + g) * bytes;
        const float d = _cvtsh_ss(load16(b));
        uint32_t qh = 0;
        if (kind != RADIXD_W_Q4_0_A8) memcpy(&qh, b + (kind == RADIXD_W_Q5_0_A8 ? QH_AT_q5_0 : QH_AT_q5_1), 4);
        for (int c = 0; c < 32; c++) {
            const uint8_t nib = b[qs_at + (c & 15)];
            const int q = (c < 16 ? nib & 0x0F : nib >> 4) | (int)((qh >> c) & 1) << 4;
            float *o = out + g * 32 + c;
            if (kind == RADIXD_W_Q4_0_A8)
                *o = d * (float)(q - 8);
            else if (kind == RADIXD_W_Q5_0_A8)
                *o = d * (float)(q - 16);
            else
                *o = d * (float)q + _cvtsh_ss(load16(b + 2));
        }
    }
}
