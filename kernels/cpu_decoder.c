/* The float32 decoder's layers in one call: every layer of a step (norms, projections, rotary, KV
 * store, attention, SwiGLU or GeGLU, residuals) and the final norm, for any mix of prefill and decode
 * rows. A layer's options are data (radixd_layer): QK-norm, the norms after attention and after the
 * MLP, the gate's activation, its rotary table, its sliding window and its KV group (Qwen3, Gemma 3).
 *
 * It calls the two kernels the layer-by-layer path calls (radixd_gemm, radixd_attend_rows). What it
 * adds is row-wise: RMSNorm, rotary, the gate's activation * up, the residual adds, the KV store (into
 * fp32 pools, or f16 ones rounded to nearest even as torch rounds them: w4a8's).
 *
 * NOTE: row-invariant like the kernels it calls. Every operation here reads and writes one row (one
 * token) at a time, in a fixed order that depends neither on the number of rows nor on the thread
 * that runs the row; the projections and the attention are row-invariant by construction. So a
 * token's hidden state is bitwise the same alone or in a batch of any size, in a prefill chunk or a
 * decode step. Built with -ffp-contract=off, like the kernels it calls (their arguments rely on it).
 * The numbers are not bitwise those of the torch path (llama.py): RMSNorm's sum and the activations'
 * exp are computed here, in their own orders; the rotary is the same arithmetic as rope.apply_rotary. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "radixd.h"
#include "vec8.h"

/* Elementwise loops take a second thread only past this many elements (a fork costs microseconds). */
#define PARALLEL_ELEMS 65536

/* out = x / sqrt(mean(x^2) + eps) * w, one row of n % 8 == 0 floats (out may be x). The squares sum
 * in 8 lanes (element i in lane i % 8, in increasing i), folded by vec8.h's fixed tree. */
static inline void rms_norm_row(const float *x, const float *w, int64_t n, float eps, float *out) {
    v8f acc = {0};
    for (int64_t i = 0; i < n; i += LANES) {
        const v8f v = ld(x + i);
        acc += v * v;
    }
    const float inv = 1.0f / sqrtf(fold_lanes(acc) / (float)n + eps);
    for (int64_t i = 0; i < n; i += LANES) st(out + i, (ld(x + i) * inv) * ld(w + i));
}

static void rms_norm_rows(const float *x, const float *w, int64_t rows, int64_t n, float eps, float *out) {
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_ELEMS)
    for (int64_t r = 0; r < rows; r++) rms_norm_row(x + r * n, w, n, eps, out + r * n);
}

/* act(g) * u for every element, act(x) = x * sigmoid(z): SiLU with z = x, GELU-tanh with
 * z = 2 sqrt(2 / pi) (x + 0.044715 x^3) (its 0.5 (1 + tanh(y)) is sigmoid(2 y)). sigmoid from e^-|z|
 * (never overflowing) of vec8.h's exp: z >= 0 gives x / (1 + e), z < 0 gives x * e / (1 + e). n % 8 == 0. */
static void gate_mul_rows(const float *gu, int64_t rows, int64_t n, int gelu, float *out) {
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_ELEMS)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * n, *u = g + n;
        float *o = out + r * n;
        for (int64_t i = 0; i < n; i += LANES) {
            const v8f x = ld(g + i);
            const v8f z = gelu ? 1.5957691216057308f * (x + 0.044715f * (x * x * x)) : x;
            const v8i neg = z < 0.0f;
            const v8f e = exp_nonpos((v8f)(((v8i)(-z) & ~neg) | ((v8i)z & neg))); /* e^-|z| */
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

/* One head of qkv into `out`: RMSNorm'd by `norm` (QK-norm) where it is given, then rotated. */
static inline void head_in(const float *x, const float *norm, const float *cos, const float *sin, int64_t d,
                           float eps, float *out) {
    float normed[d]; /* NOTE: d <= 256 floats */
    if (norm != NULL) {
        rms_norm_row(x, norm, d, eps, normed);
        x = normed;
    }
    rotate(x, cos, sin, d, out);
}

/* Layer L's q into `q` [rows, hq, d]; its k (as q) and v into their slots of the layer's KV group. */
static void rotate_and_store(const radixd_step *s, const radixd_layer *L, const float *qkv, float *q) {
    const int64_t d = s->d, hq = s->hq, hkv = s->hkv, width = (hq + 2 * hkv) * d;
    const int64_t row_bytes = hkv * d * (s->kv_dtype == RADIXD_F32 ? 4 : 2);
    const float *cos_l = s->cos + L->rope * s->rows * d, *sin_l = s->sin + L->rope * s->rows * d;
    const int64_t *slots = s->slots + L->group * s->rows;
#pragma omp parallel for schedule(static) if (s->rows * width >= PARALLEL_ELEMS)
    for (int64_t r = 0; r < s->rows; r++) {
        const float *row = qkv + r * width, *cos = cos_l + r * d, *sin = sin_l + r * d;
        for (int64_t h = 0; h < hq; h++) head_in(row + h * d, L->q_norm, cos, sin, d, s->eps, q + (r * hq + h) * d);
        const int64_t slot = slots[r];
        if (slot < 0) continue;
        float k[hkv * d]; /* NOTE: hkv * d floats, a few KiB at most */
        for (int64_t h = 0; h < hkv; h++) head_in(row + (hq + h) * d, L->k_norm, cos, sin, d, s->eps, k + h * d);
        store_row(k, (char *)L->k_cache + slot * row_bytes, hkv * d, s->kv_dtype);
        store_row(row + (hq + hkv) * d, (char *)L->v_cache + slot * row_bytes, hkv * d, s->kv_dtype);
    }
}

/* h += post_norm(x W^T (+ bias)), the norm where `post` is given; y: the projection's scratch. */
static int project_add(const radixd_proj *p, const float *x, const float *post, const radixd_step *s, float *y,
                       float *h) {
    if (radixd_gemm(p, x, s->rows, y, s->threads)) return -1;
    if (post != NULL) rms_norm_rows(y, post, s->rows, p->n, s->eps, y);
    for (int64_t i = 0; i < s->rows * p->n; i++) h[i] = h[i] + y[i];
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
    radixd_attn attn_call = {.q = q, .out = attn, .row_table = s->row_table, .row_pos = s->row_pos, .rows = rows,
                             .block_size = s->block_size, .hkv = s->hkv, .group = s->hq / s->hkv, .d = s->d,
                             .width = s->width, .scale = s->scale, .io_dtype = RADIXD_F32, .dtype = s->kv_dtype};
    for (int64_t li = 0; li < num_layers; li++) {
        const radixd_layer *L = layers + li;
        rms_norm_rows(h, L->attn_norm, rows, s->hidden, s->eps, x);
        if (radixd_gemm(&L->qkv, x, rows, big, s->threads)) return -1;
        rotate_and_store(s, L, big, q);
        attn_call.k = L->k_cache;
        attn_call.v = L->v_cache;
        attn_call.tables = s->tables + L->group * s->num_tables * s->width;
        attn_call.window = L->window;
        if (radixd_attend_rows(&attn_call, s->attn_threads)) return -1;
        if (project_add(&L->o, attn, L->post_attn_norm, s, y, h)) return -1;
        rms_norm_rows(h, L->mlp_norm, rows, s->hidden, s->eps, x);
        if (radixd_gemm(&L->gate_up, x, rows, big, s->threads)) return -1;
        gate_mul_rows(big, rows, s->inter, L->gelu, act);
        if (project_add(&L->down, act, L->post_mlp_norm, s, y, h)) return -1;
    }
    rms_norm_rows(h, final_norm, rows, s->hidden, s->eps, out);
    return 0;
}
