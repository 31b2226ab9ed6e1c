/* int8 weights with an fp32 scale per 32 inputs (GGUF's Q8_0 layout) times fp32 activations: the
 * int4/int8 modes' lm_head (daemon/model/q8.py), built and loaded by kernels/native.py.
 *
 * NOTE: row-invariant by construction: every output sums its groups of 32 products in one fixed
 * order (fp32 FMAs per group, scaled into an 8-lane accumulator, then one fixed horizontal sum)
 * whatever the call's row count, the row's place in it or the thread count. */
#include <immintrin.h>
#include <stdint.h>

static inline __m256 cvt8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

#define TILE 4

/* y[m, n] for rows m0 .. m0 + mt - 1: each row runs the same operations in the same order. */
static inline void tile(const float *x, int64_t k, const int8_t *qn, const float *sn, int64_t groups,
                        float *y, int64_t n_out, int64_t n, int64_t m0, int mt) {
    __m256 acc[TILE];
    for (int i = 0; i < TILE; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int8_t *qg = qn + g * 32;
        __m256 w0 = cvt8(qg), w1 = cvt8(qg + 8), w2 = cvt8(qg + 16), w3 = cvt8(qg + 24);
        __m256 sc = _mm256_broadcast_ss(sn + g);
        for (int i = 0; i < mt; i++) {
            const float *xg = x + (m0 + i) * k + g * 32;
            __m256 p = _mm256_mul_ps(_mm256_loadu_ps(xg), w0);
            p = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), w1, p);
            p = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), w2, p);
            p = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), w3, p);
            acc[i] = _mm256_fmadd_ps(p, sc, acc[i]);
        }
    }
    for (int i = 0; i < mt; i++) y[(m0 + i) * n_out + n] = hsum(acc[i]);
}

/* y [m, n_out] = x [m, k] . (q [n_out, k] * s [n_out, k / 32] per group of 32)^T, all contiguous. */
void q8_gemm(const float *x, int64_t m, int64_t k, const int8_t *q, const float *s, int64_t n_out,
             float *y, int threads) {
    int64_t groups = k / 32;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < n_out; n++)
        for (int64_t m0 = 0; m0 < m; m0 += TILE)
            tile(x, k, q + n * k, s + n * groups, groups, y, n_out, n, m0,
                 (int)(m - m0 < TILE ? m - m0 : TILE));
}
