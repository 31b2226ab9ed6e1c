/* Paged attention of independent query rows on the CPU: the daemon's prefill and decode attention.
 *
 * A row is one token of one sequence: its query heads attend to the keys at positions 0..pos of the
 * sequence, read through the sequence's block table. The keys are cut into splits of SPLIT positions
 * (split j holds [j * SPLIT, (j + 1) * SPLIT), the last one partial); a (row, split) pair is one unit
 * of work, computed by one thread with one code path:
 *   pass 1: s[t] = dot(q * scale, k[t]) for every head of the row and every key t of the split (one
 *           dot: 8 lanes over the head dim, lane i takes the elements i, i+8, ...; the lanes folded
 *           by a fixed tree); m_j = max s;
 *   then:   e[t] = exp(s[t] - m_j); l_j = sum e (8 lanes over t mod 8, folded by the same tree);
 *   pass 2: acc_j = sum over t in position order of e[t] * v[t] (one element of the head dim per lane).
 * A row's splits are then folded in split order: m = max m_j, w_j = exp(m_j - m),
 * out = (sum acc_j w_j) / (sum l_j w_j) + 0.0 (no -0.0).
 * Nothing depends on the other rows of the call, on how many there are, on which thread runs a unit,
 * or on whether the row came from a prefill chunk or a decode step.
 *
 * NOTE: built with -ffp-contract=off and without -ffast-math: the compiler may vectorize the lane loops
 * (each lane keeps its own sequence of IEEE operations) but may neither reassociate a sum nor fuse a
 * multiply-add in one code path and not in another, so a vector loop and its scalar remainder agree.
 * exp is computed here (a Cephes-style polynomial) rather than by libm, so that it vectorizes and its
 * bits do not depend on which libm variant a call site picks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8
/* Keys per split: a row's keys are cut at fixed positions, so splits are units of parallel work whose
 * boundaries depend on the position only. */
#define SPLIT 256

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

static inline float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu) return bits_to_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return bits_to_float(sign);
        /* subnormal half: exact in float */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

/* One head vector of the pool widened to float32 (fp32 rows are read in place). */
static inline const float *load_row(const void *base, int64_t idx, int64_t d, int dtype, float *buf) {
    if (dtype == DT_F32) return (const float *)base + idx;
    if (dtype == DT_BF16) {
        const uint16_t *p = (const uint16_t *)base + idx;
        for (int64_t i = 0; i < d; i++) buf[i] = bits_to_float((uint32_t)p[i] << 16);
        return buf;
    }
    const uint16_t *p = (const uint16_t *)base + idx;
    for (int64_t i = 0; i < d; i++) buf[i] = f16_to_float(p[i]);
    return buf;
}

/* Eight float lanes (GCC/Clang vector extension: AVX on x86, two NEON registers on Arm). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f ld(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void st(float *p, v8f v) { memcpy(p, &v, sizeof v); }

static inline float fold_lanes(v8f a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static inline void prefetch_row(const void *base, int64_t offset, int64_t bytes) {
    const char *p = (const char *)base + offset;
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 3);
}

/* d is a multiple of LANES (checked by the caller). Lane l sums the elements l, l + 8, ... in order. */
static inline __attribute__((always_inline)) float dot(const float *q, const float *k, int64_t d) {
    v8f a = {0};
    for (int64_t i = 0; i < d; i += LANES) a += ld(q + i) * ld(k + i);
    return fold_lanes(a);
}

/* exp(x) for x <= 0 (0 below -87, where float32 leaves the normal range; -inf gives 0). */
static inline v8f exp_nonpos(v8f x) {
    const v8f lo = {-87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f};
    v8i under = x < lo;
    v8f xc = (v8f)(((v8i)x & ~under) | ((v8i)lo & under));
    /* round to nearest: adding 1.5 * 2^23 leaves the integer part in the low mantissa bits */
    v8f t = xc * 1.44269504088896341f + 12582912.0f;
    v8f n = t - 12582912.0f;
    v8f r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v8f z = r * r;
    v8f y = r * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * z + r + 1.0f;
    v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    return (v8f)((v8i)(y * (v8f)e) & ~under);
}

typedef struct {
    const float *q; /* [rows, hq, d] float32 */
    const void *k, *v; /* [blocks, block_size, hkv, d] */
    int dtype;
    int64_t block_size, hkv, group, d;
    const int32_t *tables; /* [num_tables, width] */
    int64_t width;
    const int64_t *row_table; /* [rows] row of tables */
    const int64_t *row_pos;   /* [rows] last key position (-1: no keys, zero output) */
    float scale;
    float *out; /* [rows, hq, d] float32 */
} attn_args;

/* Split j of a row: keys [j * SPLIT, min((j + 1) * SPLIT, pos + 1)), every query head of the row.
 * Writes part = [hq][d + 2]: acc (d), m, l. Scratch: scores [hq][SPLIT], qs [hq][d], kbuf [hkv * d].
 * Inlined with constant d and hq where the caller knows them: the same operations in the same order. */
static inline __attribute__((always_inline)) void attend_split(const attn_args *a, int64_t row, int64_t j,
                                                               float *part, float *scores, float *qs,
                                                               float *kbuf, const int64_t d,
                                                               const int64_t hq) {
    const int64_t b = a->block_size, hkv = a->hkv, g_n = hq / hkv, stride_tok = hkv * d;
    const int64_t t_lo = j * SPLIT, t_hi = (a->row_pos[row] + 1 < t_lo + SPLIT) ? a->row_pos[row] + 1 : t_lo + SPLIT;
    const int64_t n = t_hi - t_lo, n8 = (n + LANES - 1) / LANES * LANES;
    const int32_t *table = a->tables + a->row_table[row] * a->width;
    const float *q = a->q + row * hq * d;
    for (int64_t i = 0; i < hq * d; i++) qs[i] = q[i] * a->scale;
    const int64_t row_bytes = stride_tok * (a->dtype == DT_F32 ? 4 : 2), pos = a->row_pos[row];
    /* pass 1: scores of every head, one token row (all kv heads, contiguous) at a time */
    for (int64_t t = t_lo; t < t_hi; t++) {
        /* Blocks lie anywhere in the pool, so the hardware prefetcher restarts at every block: ask
         * for the next block's key row now, and for this token's value row (pass 2 reads it from L2). */
        const int64_t slot = (int64_t)table[t / b] * b + t % b;
        if (t + b <= pos) prefetch_row(a->k, ((int64_t)table[(t + b) / b] * b + t % b) * row_bytes, row_bytes);
        prefetch_row(a->v, slot * row_bytes, row_bytes);
        const float *k = load_row(a->k, ((int64_t)table[t / b] * b + t % b) * stride_tok, stride_tok, a->dtype, kbuf);
        for (int64_t h = 0; h < hkv; h++)
            for (int64_t g = 0; g < g_n; g++)
                scores[(h * g_n + g) * SPLIT + (t - t_lo)] = dot(qs + (h * g_n + g) * d, k + h * d, d);
    }
    for (int64_t hh = 0; hh < hq; hh++) {
        float *s = scores + hh * SPLIT;
        float m = s[0];
        for (int64_t t = 1; t < n; t++) m = s[t] > m ? s[t] : m;
        for (int64_t t = n; t < n8; t++) s[t] = -__builtin_inff(); /* exp gives exact zeros */
        v8f lane = {0};
        for (int64_t t = 0; t < n8; t += LANES) {
            v8f e = exp_nonpos(ld(s + t) - m);
            st(s + t, e);
            lane += e;
        }
        float *p = part + hh * (d + 2);
        p[d] = m;
        p[d + 1] = fold_lanes(lane);
        for (int64_t i = 0; i < d; i++) p[i] = 0.0f;
    }
    /* pass 2: the weighted sum of the values, in position order */
    for (int64_t t = t_lo; t < t_hi; t++) {
        const float *v = load_row(a->v, ((int64_t)table[t / b] * b + t % b) * stride_tok, stride_tok, a->dtype, kbuf);
        for (int64_t h = 0; h < hkv; h++)
            for (int64_t g = 0; g < g_n; g++) {
                const int64_t hh = h * g_n + g;
                const float e = scores[hh * SPLIT + (t - t_lo)];
                float *p = part + hh * (d + 2);
                for (int64_t i = 0; i < d; i += LANES) st(p + i, ld(p + i) + e * ld(v + h * d + i));
            }
    }
}

static void attend_split_any(const attn_args *a, int64_t row, int64_t j, float *part, float *scores,
                             float *qs, float *kbuf) {
    const int64_t hq = a->hkv * a->group;
    if (a->d == 64 && hq == 9)
        attend_split(a, row, j, part, scores, qs, kbuf, 64, 9);
    else if (a->d == 64 && hq == 32)
        attend_split(a, row, j, part, scores, qs, kbuf, 64, 32);
    else if (a->d == 128 && hq == 32)
        attend_split(a, row, j, part, scores, qs, kbuf, 128, 32);
    else
        attend_split(a, row, j, part, scores, qs, kbuf, a->d, hq);
}

/* Fold a row's splits in split order: out = sum_j acc_j w_j / sum_j l_j w_j, w_j = exp(m_j - m). */
static void fold_row(const attn_args *a, int64_t row, const float *parts, int64_t splits) {
    const int64_t d = a->d, hq = a->hkv * a->group;
    float *out = a->out + row * hq * d;
    if (splits == 0) {
        memset(out, 0, (size_t)(hq * d) * sizeof(float));
        return;
    }
    for (int64_t hh = 0; hh < hq; hh++) {
        float m = parts[hh * (d + 2) + d];
        for (int64_t j = 1; j < splits; j++) {
            const float mj = parts[(j * hq + hh) * (d + 2) + d];
            m = mj > m ? mj : m;
        }
        float l = 0.0f;
        float *o = out + hh * d;
        for (int64_t i = 0; i < d; i++) o[i] = 0.0f;
        for (int64_t j = 0; j < splits; j++) {
            const float *p = parts + (j * hq + hh) * (d + 2);
            const v8f diff = {p[d] - m};
            const float w = exp_nonpos(diff)[0];
            l = l + p[d + 1] * w;
            for (int64_t i = 0; i < d; i += LANES) st(o + i, ld(o + i) + ld(p + i) * w);
        }
        for (int64_t i = 0; i < d; i++) o[i] = o[i] / l + 0.0f;
    }
}

/* Attend rows [0, rows) on up to `threads` threads. Returns 0, or -1 when memory is missing.
 * The caller checks shapes: d % LANES == 0, tables and block ids cover every position read. */
int radixd_attend_rows(const float *q, const void *k, const void *v, int dtype, int64_t block_size,
                       int64_t hkv, int64_t group, int64_t d, const int32_t *tables, int64_t width,
                       const int64_t *row_table, const int64_t *row_pos, int64_t rows, float scale,
                       float *out, int threads) {
    attn_args a = {q, k, v, dtype, block_size, hkv, group, d, tables, width, row_table, row_pos, scale, out};
    const int64_t hq = hkv * group, part_n = hq * (d + 2);
    /* units: (row, split) pairs, row-major; first[r] = the first unit of row r */
    int64_t *first = malloc((size_t)(rows + 1) * sizeof(int64_t));
    if (first == NULL) return -1;
    first[0] = 0;
    for (int64_t r = 0; r < rows; r++)
        first[r + 1] = first[r] + (row_pos[r] < 0 ? 0 : row_pos[r] / SPLIT + 1);
    const int64_t units = first[rows];
    int64_t *unit_row = malloc((size_t)(units > 0 ? units : 1) * sizeof(int64_t));
    float *parts = malloc((size_t)(units > 0 ? units : 1) * (size_t)part_n * sizeof(float));
    if (unit_row == NULL || parts == NULL) {
        free(first);
        free(unit_row);
        free(parts);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t u = first[r]; u < first[r + 1]; u++) unit_row[u] = r;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *scratch = malloc((size_t)(hq * SPLIT + hq * d + hkv * d) * sizeof(float));
        /* NOTE: every thread runs both worksharing loops (skipping one would hang the others at its end). */
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) {
            if (scratch != NULL) {
                const int64_t r = unit_row[u];
                attend_split_any(&a, r, u - first[r], parts + u * part_n, scratch, scratch + hq * SPLIT,
                                 scratch + hq * SPLIT + hq * d);
            } else {
#pragma omp atomic write
                failed = 1;
            }
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) fold_row(&a, r, parts + first[r] * part_n, first[r + 1] - first[r]);
        free(scratch);
    }
    free(first);
    free(unit_row);
    free(parts);
    return failed ? -1 : 0;
}
