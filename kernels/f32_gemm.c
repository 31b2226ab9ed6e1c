/* fp32 projections y = x . W^T with one summation order per output whatever the row count: the
 * float32 mode's projections and lm_head (daemon/model/f32.py), built and loaded by kernels/native.py.
 *
 * NOTE: row-invariant by construction. Output (m, n) accumulates x[m, k] * w[n, k] in 8 lanes, lane j
 * taking k = j, j + 8, j + 16, ... in increasing k by FMA from zero (a short last group of 8 is read
 * masked, as zeros), then one fixed horizontal sum. Tile shapes, blocking and threads only decide
 * which outputs are computed together, never how one is summed: a row's result is bitwise the same
 * in a call of 1 row or 512, at any position, on any number of threads. */
#include <immintrin.h>
#include <stdint.h>

static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

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

/* y [m, n] = x [m, k] . w [n, k]^T, all contiguous. Threads split the outputs into blocks whose
 * weights fit in a core's L2 (reused by every row tile of the call); within a block, tiles of up to
 * 4 rows run across it, their x rows staying in L1. */
void f32_gemm(const float *x, int64_t m, int64_t k, const float *w, int64_t n, float *y, int threads) {
    int64_t block = (128 * 1024 / 4) / (k > 0 ? k : 1);
    block = block < 24 ? 24 : block - block % 24; /* a multiple of every tile width */
    int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * block, n1 = n0 + block < n ? n0 + block : n;
        for (int64_t m0 = 0; m0 < m; m0 += ROWS) {
            int mt = (int)(m - m0 < ROWS ? m - m0 : ROWS);
            int nt = TILE_OUTPUTS[mt - 1];
            for (int64_t j0 = n0; j0 < n1; j0 += nt) {
                int ntt = (int)(n1 - j0 < nt ? n1 - j0 : nt);
                TILES[mt - 1][ntt - 1](x + m0 * k, k, w + j0 * k, k, y + m0 * n + j0, n);
            }
        }
    }
}
