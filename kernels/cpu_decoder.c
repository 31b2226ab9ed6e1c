/* The float32 decoder's layers in one call: every layer of a step (norms, projections, rotary, KV
 * store, attention, SwiGLU, residuals) and the final norm, for any mix of prefill and decode rows.
 *
 * It calls the two kernels the layer-by-layer path calls (radixd_gemm, radixd_attend_rows). What it
 * adds is row-wise: RMSNorm, rotary, SiLU * up, the residual adds, the KV store (into fp32 pools, or
 * f16 ones rounded to nearest even as torch rounds them: w4a8's).
 *
 * NOTE: row-invariant like the kernels it calls. Every operation here reads and writes one row (one
 * token) at a time, in a fixed order that depends neither on the number of rows nor on the thread
 * that runs the row; the projections and the attention are row-invariant by construction. So a
 * token's hidden state is bitwise the same alone or in a batch of any size, in a prefill chunk or a
 * decode step. Built with -ffp-contract=off, like the kernels it calls (their arguments rely on it).
 * The numbers are not bitwise those of the torch path (llama.py): RMSNorm's sum and SiLU's exp are
 * computed here, in their own orders; the rotary is the same arithmetic as rope.apply_rotary. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "radixd.h"
#include "vec8.h"

/* Elementwise loops take a second thread only past this many elements (a fork costs microseconds). */
#define PARALLEL_ELEMS 65536

/* out = x / sqrt(mean(x^2) + eps) * w, row by row; n % 8 == 0. The squares sum in 8 lanes
 * (element i in lane i % 8, in increasing i), folded by vec8.h's fixed tree. */
static void rms_norm_rows(const float *x, const float *w, int64_t rows, int64_t n, float eps, float *out) {
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_ELEMS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        v8f acc = {0};
        for (int64_t i = 0; i < n; i += LANES) {
            const v8f v = ld(xr + i);
            acc += v * v;
        }
        const float inv = 1.0f / sqrtf(fold_lanes(acc) / (float)n + eps);
        for (int64_t i = 0; i < n; i += LANES) st(o + i, (ld(xr + i) * inv) * ld(w + i));
    }
}

/* silu(g) * u for every element: silu(x) = x / (1 + e^-x), with e^-|x| (never overflowing) from
 * vec8.h's exp: x >= 0 gives x / (1 + e), x < 0 gives x * e / (1 + e). n % 8 == 0. */
static void silu_mul_rows(const float *gu, int64_t rows, int64_t n, float *out) {
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_ELEMS)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * n, *u = g + n;
        float *o = out + r * n;
        for (int64_t i = 0; i < n; i += LANES) {
            const v8f x = ld(g + i);
            const v8i neg = x < 0.0f;
            const v8f e = exp_nonpos((v8f)(((v8i)(-x) & ~neg) | ((v8i)x & neg))); /* e^-|x| */
            const v8f den = 1.0f + e;
            const v8f num = (v8f)(((v8i)x & ~neg) | ((v8i)(x * e) & neg));
            st(o + i, (num / den) * ld(u + i));
        }
    }
}

/* out[i] = x[i] * cos[i] + x[(i + d/2) % d] * sin[i]: rope.apply_rotary's operations, one head. */
static inline void rotate(const float *x, const float *cos, const float *sin, int64_t d, float *out) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * cos[i] + x[(i + half) % d] * sin[i];
}

/* n floats (n % 8 == 0) into a pool row of `dtype`: fp32 as they are, f16 rounded to nearest even,
 * as torch's .to(torch.float16) rounds them on the layer-by-layer path (store_kv.py). */
static void store_row(const float *src, void *dst, int64_t n, int dtype) {
    if (dtype == RADIXD_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *o = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
}

/* Rotate q into `q` [rows, hq, d]; rotate k and store it and v into their pool slots. */
static void rotate_and_store(const radixd_step *s, const float *qkv, float *q, void *k_cache, void *v_cache) {
    const int64_t d = s->d, hq = s->hq, hkv = s->hkv, width = (hq + 2 * hkv) * d;
    const int64_t row_bytes = hkv * d * (s->kv_dtype == RADIXD_F32 ? 4 : 2);
#pragma omp parallel for schedule(static) if (s->rows * width >= PARALLEL_ELEMS)
    for (int64_t r = 0; r < s->rows; r++) {
        const float *row = qkv + r * width, *cos = s->cos + r * d, *sin = s->sin + r * d;
        for (int64_t h = 0; h < hq; h++) rotate(row + h * d, cos, sin, d, q + (r * hq + h) * d);
        const int64_t slot = s->slots[r];
        if (slot < 0) continue;
        float k[hkv * d]; /* NOTE: hkv * d floats, a few KiB at most */
        for (int64_t h = 0; h < hkv; h++) rotate(row + (hq + h) * d, cos, sin, d, k + h * d);
        store_row(k, (char *)k_cache + slot * row_bytes, hkv * d, s->kv_dtype);
        store_row(row + (hq + hkv) * d, (char *)v_cache + slot * row_bytes, hkv * d, s->kv_dtype);
    }
}

/* y = x W^T (+ bias), or y += x W^T (+ bias) into `acc` (the residual) when it is given. */
static int project(const radixd_proj *p, const float *x, int64_t rows, float *y, float *acc, int threads) {
    if (radixd_gemm(p, x, rows, y, threads)) return -1;
    if (acc != NULL)
        for (int64_t i = 0; i < rows * p->n; i++) acc[i] = acc[i] + y[i];
    return 0;
}

/* Floats of scratch `radixd_decoder_forward` needs for `rows` rows. */
int64_t radixd_decoder_workspace(int64_t rows, int64_t hidden, int64_t hq, int64_t hkv, int64_t d, int64_t inter) {
    const int64_t qkv = (hq + 2 * hkv) * d, wide = qkv > 2 * inter ? qkv : 2 * inter;
    return rows * (hidden + wide + 2 * hq * d + inter + hidden);
}

/* h [rows, hidden]: the embeddings in, the final-normed hidden states out (`out`, may be h). Writes
 * every layer's new K/V into its pool. Returns 0, or -1 where a kernel could not allocate memory. */
int radixd_decoder_forward(const radixd_layer *layers, int64_t num_layers, const float *final_norm, const radixd_step *s,
                           float *h, float *out, float *work) {
    const int64_t rows = s->rows, hd = s->hq * s->d, qkv_w = (s->hq + 2 * s->hkv) * s->d;
    const int64_t wide = qkv_w > 2 * s->inter ? qkv_w : 2 * s->inter;
    float *x = work, *big = x + rows * s->hidden, *q = big + rows * wide, *attn = q + rows * hd;
    float *act = attn + rows * hd, *y = act + rows * s->inter;
    radixd_attn attn_call = {.q = q, .out = attn, .tables = s->tables, .row_table = s->row_table,
                             .row_pos = s->row_pos, .rows = rows, .block_size = s->block_size, .hkv = s->hkv,
                             .group = s->hq / s->hkv, .d = s->d, .width = s->width, .scale = s->scale,
                             .io_dtype = RADIXD_F32, .dtype = s->kv_dtype};
    for (int64_t li = 0; li < num_layers; li++) {
        const radixd_layer *L = layers + li;
        rms_norm_rows(h, L->attn_norm, rows, s->hidden, s->eps, x);
        if (project(&L->qkv, x, rows, big, NULL, s->threads)) return -1;
        rotate_and_store(s, big, q, L->k_cache, L->v_cache);
        attn_call.k = L->k_cache;
        attn_call.v = L->v_cache;
        if (radixd_attend_rows(&attn_call, s->attn_threads)) return -1;
        if (project(&L->o, attn, rows, y, h, s->threads)) return -1;
        rms_norm_rows(h, L->mlp_norm, rows, s->hidden, s->eps, x);
        if (project(&L->gate_up, x, rows, big, NULL, s->threads)) return -1;
        silu_mul_rows(big, rows, s->inter, act);
        if (project(&L->down, act, rows, y, h, s->threads)) return -1;
    }
    rms_norm_rows(h, final_norm, rows, s->hidden, s->eps, out);
    return 0;
}
