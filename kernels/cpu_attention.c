/* Paged attention of independent query rows on the CPU: the daemon's prefill and decode attention.
 *
 * A row is one token of one sequence: its query heads attend to the keys at positions 0..pos of the
 * sequence, read through the sequence's block table, or under a sliding window (`window` > 0) to
 * pos - window + 1..pos only. The keys are cut into splits of SPLIT positions (split j holds
 * [j * SPLIT, (j + 1) * SPLIT), the first and last ones partial); a (row, split) pair is one unit of
 * work, computed by one thread with one code path (splits wholly left of a window are no units):
 *   pass 1: s[t] = dot(q * scale, k[t]) for every head of the row and every key t of the split (one
 *           dot: 8 lanes over the head dim, lane i takes the elements i, i+8, ... by fused
 *           multiply-adds; the lanes folded by a fixed tree, 8 keys' dots at once); m_j = max s;
 *   then:   e[t] = exp(s[t] - m_j); l_j = sum e (8 lanes over t mod 8, folded by the same tree);
 *   pass 2: acc_j = sum over t in position order of e[t] * v[t] (one element of the head dim per lane,
 *           fused multiply-adds).
 * Both passes take a kv head's query heads together, so that each key and value row is loaded (and
 * widened, for a 16-bit pool) once for all of them rather than once per query head.
 * A row's splits are then folded in split order: m = max m_j, w_j = exp(m_j - m),
 * out = (sum acc_j w_j) / (sum l_j w_j) + 0.0 (no -0.0).
 * Nothing depends on the other rows of the call, on how many there are, on which thread runs a unit,
 * or on whether the row came from a prefill chunk or a decode step.
 *
 * NOTE: built with -ffp-contract=off and without -ffast-math: the compiler may vectorize the lane loops
 * (each lane keeps its own sequence of IEEE operations) but may neither reassociate a sum nor fuse a
 * multiply-add in one code path and not in another, so a vector loop and its scalar remainder agree;
 * the multiply-adds of the dots and of exp are fused explicitly (fma8), the same in every path of a build.
 * The pool is fp32, bf16 or f16 (widened exactly on load: F16C's vcvtph2ps where the CPU has it).
 * exp is computed here (a Cephes-style polynomial) rather than by libm, so that it vectorizes and its
 * bits do not depend on which libm variant a call site picks.
 */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "radixd.h"
#include "vec8.h"

/* Keys per split: a row's keys are cut at fixed positions, so splits are units of parallel work whose
 * boundaries depend on the position only. */
#define SPLIT 256
/* Keys whose value rows pass 2 reads together where a kv head's query heads take several batches
 * (the rows stay in L1 for each batch). */
#define VCHUNK 16
/* The largest head dim the kernel takes (cpu_attention.py's `supports` checks it). */
#define MAX_D 256
/* Keys whose dots pass 1 computes together (their chains of multiply-adds overlap; 4 spills registers). */
#define UK 2
_Static_assert(LANES % UK == 0, "pass 1 takes a group's keys UK at a time");
/* Query heads of one kv head whose dots pass 1 computes together (one widened key row serves them). */
#define GB 4
/* Vectors of value sums pass 2 keeps in registers: a batch of query heads' d / 8 each, at least one
 * head (then up to MAX_D / 8). 24 leaves AVX512's 32 vector registers room for the rest. */
#define VREGS 24
/* A unit's fixed work (q scaled, softmax, zeroed sums, its part folded) in keys' worth, for sharing a
 * call's units between threads by cost. */
#define UNIT_COST 32

#ifndef __F16C__
/* f16 -> float32 where the CPU has no F16C conversion. */
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
#endif

/* Elements idx..idx+7 of a pool of `dtype` widened to float32 (exactly: every bf16 and f16 value is a
 * float). `dtype` is a constant where the caller is specialized, so the branch folds away. */
static inline __attribute__((always_inline)) v8f ld_kv(const void *base, int64_t idx, int dtype) {
    if (dtype == RADIXD_F32) return ld((const float *)base + idx);
    const uint16_t *p = (const uint16_t *)base + idx;
    if (dtype == RADIXD_BF16) {
        v8i w = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]};
        return (v8f)(w << 16);
    }
#ifdef __F16C__
    return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    v8f r;
    for (int i = 0; i < LANES; i++) r[i] = f16_to_float(p[i]);
    return r;
#endif
}

/* fold_lanes of 8 vectors at once: lane u of the result is fold_lanes(a[u]), by the same additions
 * (pairs of neighbours, then pairs of pairs, then the halves), three shuffle levels for 8 dots. */
static inline v8f fold8(const v8f a[LANES]) {
#ifdef __AVX__
    /* in-lane horizontal adds (neighbours, then pairs of pairs), then the halves: the same tree */
    const __m256 t0 = _mm256_hadd_ps((__m256)a[0], (__m256)a[1]), t1 = _mm256_hadd_ps((__m256)a[2], (__m256)a[3]);
    const __m256 t2 = _mm256_hadd_ps((__m256)a[4], (__m256)a[5]), t3 = _mm256_hadd_ps((__m256)a[6], (__m256)a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return (v8f)_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
#else
#define EVEN(x, y) __builtin_shufflevector(x, y, 0, 2, 4, 6, 8, 10, 12, 14)
#define ODD(x, y) __builtin_shufflevector(x, y, 1, 3, 5, 7, 9, 11, 13, 15)
    v8f p[4], q[2];
    for (int i = 0; i < 4; i++) p[i] = EVEN(a[2 * i], a[2 * i + 1]) + ODD(a[2 * i], a[2 * i + 1]);
    for (int i = 0; i < 2; i++) q[i] = EVEN(p[2 * i], p[2 * i + 1]) + ODD(p[2 * i], p[2 * i + 1]);
    return EVEN(q[0], q[1]) + ODD(q[0], q[1]);
#undef EVEN
#undef ODD
#endif
}

/* Pool rows to prefetch, asked for a few cache lines at a time from inside a loop's arithmetic, so
 * that the requests are spread over it.
 * NOTE: spread, not asked for a row or a block at once: a burst of prefetches fills the core's miss
 * buffers and stalls the loads behind it, so memory and arithmetic take turns instead of overlapping.
 * Into L2 (locality 2, prefetcht1), not L1: a long context's blocks are scattered runs of a few KiB,
 * and L1's few miss buffers cap what one core has in flight; requests for L2 take its larger queue. */
typedef struct {
    const char *base;    /* the pool */
    const int64_t *rows; /* the rows' offsets in elements, in the order asked */
    int64_t n, elem, row_bytes;
    int64_t i, byte; /* the next line: row i, at `byte` */
} prefetch_stream;

static inline prefetch_stream stream_of(const void *base, const int64_t *rows, int64_t n, int64_t elem,
                                        int64_t row_bytes) {
    const prefetch_stream s = {(const char *)base, rows, n > 0 ? n : 0, elem, row_bytes, 0, 0};
    return s;
}

/* Ask for the stream's next `lines` cache lines (fewer at its end). */
static inline void stream_ask(prefetch_stream *s, int lines) {
    for (int k = 0; k < lines && s->i < s->n; k++) {
        __builtin_prefetch(s->base + s->rows[s->i] * s->elem + s->byte, 0, 2);
        s->byte += 64;
        if (s->byte >= s->row_bytes) {
            s->byte = 0;
            s->i++;
        }
    }
}

/* Whether a row's neighbours in the call read other tables: then nothing else of the call brings its
 * keys into cache (the rows of a prefill chunk read one table, and each other's keys). */
static inline int row_alone(const radixd_attn *a, int64_t row) {
    return (row == 0 || a->row_table[row - 1] != a->row_table[row]) &&
           (row == a->rows - 1 || a->row_table[row + 1] != a->row_table[row]);
}

/* A row's first key: pos - window + 1 under a sliding window, else 0 (a function of pos and the
 * window only, like everything else about a row). */
static inline int64_t first_key(const radixd_attn *a, int64_t pos) {
    const int64_t lo = pos - a->window + 1;
    return a->window > 0 && lo > 0 ? lo : 0;
}

/* Split j of a row: keys [max(j * SPLIT, first key), min((j + 1) * SPLIT, pos + 1)), every query
 * head of the row.
 * Writes part = [hq][d + 2]: acc (d), m, l. Scratch: scores [hq][SPLIT], qs [hq][d].
 * Inlined with constant shapes and dtype where the caller specializes them: the same operations in
 * the same order, with the loops over the head dim unrolled and their accumulators in registers. */
static inline __attribute__((always_inline)) void attend_split(const radixd_attn *a, int64_t row, int64_t j,
                                                               float *part, float *scores, float *qs,
                                                               const int64_t d, const int64_t hkv,
                                                               const int64_t g_n, const int dtype) {
    const int64_t b = a->block_size, hq = hkv * g_n, stride_tok = hkv * d, elem = dtype == RADIXD_F32 ? 4 : 2;
    const int64_t pos = a->row_pos[row], j_lo = j * SPLIT, k0 = first_key(a, pos);
    const int64_t t_lo = k0 > j_lo ? k0 : j_lo, t_hi = pos + 1 < j_lo + SPLIT ? pos + 1 : j_lo + SPLIT;
    const int64_t n = t_hi - t_lo, n8 = (n + LANES - 1) / LANES * LANES;
    const int32_t *table = a->tables + a->row_table[row] * a->width;
    /* rows[t - t_lo]: the pool row (in elements) of key t, for this split's keys and, for a row
     * alone (the only one whose next split's keys are asked for), the next split's; filled a block at
     * a time, so that no loop over keys divides by the block size */
    const int alone = row_alone(a, row);
    int64_t rows[2 * SPLIT];
    const int64_t t_end = !alone ? t_hi : pos + 1 < j_lo + 2 * SPLIT ? pos + 1 : j_lo + 2 * SPLIT;
    for (int64_t t = t_lo, blk = t_lo / b, off = t_lo % b; t < t_end; blk++, off = 0) {
        const int64_t base = (int64_t)table[blk] * b;
        for (; off < b && t < t_end; off++, t++) rows[t - t_lo] = (base + off) * stride_tok;
    }
    /* Blocks lie anywhere in the pool, so the hardware prefetcher restarts at every block. Pass 1 asks
     * for this split's value rows (pass 2 reads them from L2) and for its key rows a block ahead; the
     * softmax and pass 2 ask for the next split's key rows when the row is alone (a thread takes a
     * row's splits in order, radixd_attend_rows). Pass 1 asks for its keys even when split j - 1
     * did (docs/measurements/bench-kernels.md). */
    const int64_t row_bytes = stride_tok * elem;
    prefetch_stream values = stream_of(a->v, rows, n, elem, row_bytes);
    prefetch_stream keys = stream_of(a->k, rows + b, b >= n ? 0 : n - b, elem, row_bytes);
    prefetch_stream next = stream_of(a->k, rows + n, t_end - t_hi, elem, row_bytes);
    /* lines asked for with each head of each key: its share of a row */
    const int per_head = (int)((row_bytes / hkv + 63) / 64);
    if (a->io_dtype == RADIXD_F32) {
        const float *q = (const float *)a->q + row * hq * d;
        for (int64_t i = 0; i < hq * d; i++) qs[i] = q[i] * a->scale;
    } else {
        const uint16_t *q = (const uint16_t *)a->q + row * hq * d;
        for (int64_t i = 0; i < hq * d; i++) qs[i] = bf16_to_float(q[i]) * a->scale;
    }
    /* pass 1: per head, the scores of 8 keys at once (8 dots, lanes over the head dim, folded together) */
    for (int64_t t0 = t_lo; t0 < t_hi; t0 += LANES) {
        const int64_t *at = rows + (t0 - t_lo);
        const int live = t_hi - t0 < LANES ? (int)(t_hi - t0) : LANES; /* keys past t_hi read the last one */
        /* a kv head's query heads GB at a time: each key row is widened once for all of them */
        for (int64_t h = 0; h < hkv; h++)
            for (int64_t g0 = 0; g0 < g_n; g0 += GB) {
                const int64_t gb = g_n - g0 < GB ? g_n - g0 : GB;
                const float *qh = qs + (h * g_n + g0) * d;
                v8f acc[GB][LANES];
                /* UK keys at a time: their dots are independent chains of multiply-adds, so that
                 * each chain's latency hides behind the others' (each dot's own order unchanged) */
                for (int u0 = 0; u0 < LANES; u0 += UK) {
                    int64_t kt[UK];
                    for (int uu = 0; uu < UK; uu++) {
                        kt[uu] = at[u0 + uu < live ? u0 + uu : live - 1];
                        if (g0 == 0) {
                            stream_ask(&values, per_head);
                            stream_ask(&keys, per_head);
                        }
                    }
                    v8f sum[UK][GB] = {{{0}}};
                    for (int64_t i = 0; i < d; i += LANES)
                        for (int uu = 0; uu < UK; uu++) {
                            const v8f kv = ld_kv(a->k, kt[uu] + h * d + i, dtype);
                            for (int64_t g = 0; g < gb; g++) sum[uu][g] = fma8(ld(qh + g * d + i), kv, sum[uu][g]);
                        }
                    for (int uu = 0; uu < UK; uu++)
                        for (int64_t g = 0; g < gb; g++) acc[g][u0 + uu] = sum[uu][g];
                }
                for (int64_t g = 0; g < gb; g++) st(scores + (h * g_n + g0 + g) * SPLIT + (t0 - t_lo), fold8(acc[g]));
            }
    }
    for (int64_t hh = 0; hh < hq; hh++) {
        float *s = scores + hh * SPLIT;
        for (int64_t t = n; t < n8; t++) s[t] = -__builtin_inff(); /* exp gives exact zeros */
        /* the max in 8 lanes (a max is exact in any order), not one serial chain of n compares */
        v8f mv = ld(s);
        for (int64_t t = LANES; t < n8; t += LANES) {
            const v8f x = ld(s + t);
            const v8i gt = x > mv;
            mv = (v8f)(((v8i)x & gt) | ((v8i)mv & ~gt));
        }
        float m = mv[0];
        for (int i = 1; i < LANES; i++) m = mv[i] > m ? mv[i] : m;
        v8f lane = {0};
        for (int64_t t = 0; t < n8; t += LANES) {
            stream_ask(&next, 1);
            v8f e = exp_nonpos(ld(s + t) - m);
            st(s + t, e);
            lane += e;
        }
        float *p = part + hh * (d + 2);
        p[d] = m;
        p[d + 1] = fold_lanes(lane);
        for (int64_t i = 0; i < d; i++) p[i] = 0.0f;
    }
    /* pass 2: the weighted sum of the values, in position order. A kv head's query heads go in
     * batches whose sums stay in registers, so that each value row is widened once per batch instead
     * of once per query head. Where one batch holds them all, it sums the whole split at once; else
     * VCHUNK keys at a time, whose value rows stay in L1 for the next batch. */
    const int64_t vb = (VREGS * LANES) / d > 0 ? (VREGS * LANES) / d : 1, chunk = g_n <= vb ? SPLIT : VCHUNK;
    for (int64_t t0 = t_lo; t0 < t_hi; t0 += chunk) {
        const int64_t t1 = t0 + chunk < t_hi ? t0 + chunk : t_hi;
        const int64_t *at = rows + (t0 - t_lo);
        for (int64_t h = 0; h < hkv; h++)
            for (int64_t g0 = 0; g0 < g_n; g0 += vb) {
                const int64_t gb = g_n - g0 < vb ? g_n - g0 : vb;
                v8f acc[MAX_D / LANES > VREGS ? MAX_D / LANES : VREGS];
                for (int64_t g = 0; g < gb; g++)
                    for (int64_t i = 0; i < d; i += LANES) acc[g * (d / LANES) + i / LANES] = ld(part + (h * g_n + g0 + g) * (d + 2) + i);
                for (int64_t t = 0; t < t1 - t0; t++) {
                    if (g0 == 0) stream_ask(&next, per_head);
                    v8f ev[VREGS];
                    for (int64_t g = 0; g < gb; g++) {
                        const float et = scores[(h * g_n + g0 + g) * SPLIT + (t0 - t_lo) + t];
                        ev[g] = (v8f){et, et, et, et, et, et, et, et};
                    }
                    for (int64_t i = 0; i < d; i += LANES) {
                        const v8f vv = ld_kv(a->v, at[t] + h * d + i, dtype);
                        for (int64_t g = 0; g < gb; g++)
                            acc[g * (d / LANES) + i / LANES] = fma8(ev[g], vv, acc[g * (d / LANES) + i / LANES]);
                    }
                }
                for (int64_t g = 0; g < gb; g++)
                    for (int64_t i = 0; i < d; i += LANES) st(part + (h * g_n + g0 + g) * (d + 2) + i, acc[g * (d / LANES) + i / LANES]);
            }
    }
}

/* attend_split specialized for the common shapes (and each pool dtype), generic otherwise. */
static void attend_split_any(const radixd_attn *a, int64_t row, int64_t j, float *part, float *scores,
                             float *qs) {
#define SHAPE(D, HKV, G)                                                                                  \
    if (a->d == D && a->hkv == HKV && a->group == G) {                                                   \
        if (a->dtype == RADIXD_F32) attend_split(a, row, j, part, scores, qs, D, HKV, G, RADIXD_F32);            \
        else if (a->dtype == RADIXD_F16) attend_split(a, row, j, part, scores, qs, D, HKV, G, RADIXD_F16);       \
        else attend_split(a, row, j, part, scores, qs, D, HKV, G, RADIXD_BF16);                              \
        return;                                                                                          \
    }
    SHAPE(64, 3, 3)  /* SmolLM2-135M */
    SHAPE(64, 8, 4)  /* Llama 3.2 1B */
    SHAPE(128, 8, 4) /* Llama 3 8B */
#undef SHAPE
    attend_split(a, row, j, part, scores, qs, a->d, a->hkv, a->group, a->dtype);
}

/* Output row `i` (a query head of a row) from its float32 values `o`: in place for a float32 output,
 * rounded to nearest even for a bfloat16 one (torch's rounding: a NaN becomes 0x7fc0). */
static void put_row(const radixd_attn *a, int64_t i, const float *o) {
    if (a->io_dtype == RADIXD_F32) return;
    uint16_t *dst = (uint16_t *)a->out + i * a->d;
    for (int64_t e = 0; e < a->d; e++) {
        uint32_t u;
        memcpy(&u, &o[e], sizeof u);
        dst[e] = o[e] != o[e] ? 0x7fc0 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

/* One query head's output row `o` (zeroed) from a row's splits, in split order:
 * o = sum_j acc_j w_j / sum_j l_j w_j, w_j = exp(m_j - m). */
static void fold_head(const radixd_attn *a, int64_t hh, const float *parts, int64_t splits, float *o) {
    const int64_t d = a->d, hq = a->hkv * a->group;
    float m = parts[hh * (d + 2) + d];
    for (int64_t j = 1; j < splits; j++) {
        const float mj = parts[(j * hq + hh) * (d + 2) + d];
        m = mj > m ? mj : m;
    }
    float l = 0.0f;
    for (int64_t j = 0; j < splits; j++) {
        const float *p = parts + (j * hq + hh) * (d + 2);
        const v8f diff = {p[d] - m};
        const float w = exp_nonpos(diff)[0];
        l = l + p[d + 1] * w;
        for (int64_t i = 0; i < d; i += LANES) st(o + i, ld(o + i) + ld(p + i) * w);
    }
    for (int64_t i = 0; i < d; i++) o[i] = o[i] / l + 0.0f;
}

/* Fold a row's splits into its output (zeros for a row with no keys), head by head. */
static void fold_row(const radixd_attn *a, int64_t row, const float *parts, int64_t splits) {
    const int64_t d = a->d, hq = a->hkv * a->group;
    float buf[MAX_D];
    for (int64_t hh = 0; hh < hq; hh++) {
        float *o = a->io_dtype == RADIXD_F32 ? (float *)a->out + (row * hq + hh) * d : buf;
        for (int64_t i = 0; i < d; i++) o[i] = 0.0f;
        if (splits > 0) fold_head(a, hh, parts, splits, o);
        put_row(a, row * hq + hh, o);
    }
}

/* The unit u (0 <= u <= units) whose cost[u] is nearest `target`, the later one on a tie (cost rises
 * with u, so the runs of consecutive targets tile [0, units)). */
static int64_t unit_near(const int64_t *cost, int64_t units, int64_t target) {
    int64_t lo = 0, hi = units;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cost[mid] < target) lo = mid + 1;
        else hi = mid;
    }
    return (lo > 0 && target - cost[lo - 1] < cost[lo] - target) ? lo - 1 : lo;
}

#ifdef _OPENMP
static int thread_num(void) { return omp_get_thread_num(); }
static int thread_count(void) { return omp_get_num_threads(); }
#else
static int thread_num(void) { return 0; }
static int thread_count(void) { return 1; }
#endif

/* Attend rows [0, rows) on up to `threads` threads. Returns 0, or -1 when memory is missing.
 * q and out are float32 or bfloat16 (`io_dtype`; the pools' `dtype` is separate), so that a caller
 * with bfloat16 activations passes them as they are.
 * The caller checks shapes: d % LANES == 0, d <= MAX_D, tables and block ids cover every position read. */
int radixd_attend_rows(const radixd_attn *a, int threads) {
    const int64_t rows = a->rows, *row_pos = a->row_pos, d = a->d, hq = a->hkv * a->group, part_n = hq * (d + 2);
    /* units: (row, split) pairs, row-major, from the split of a row's first key to that of its last;
     * first[r] = the first unit of row r */
    int64_t *first = malloc((size_t)(rows + 1) * sizeof(int64_t));
    if (first == NULL) return -1;
    first[0] = 0;
    for (int64_t r = 0; r < rows; r++)
        first[r + 1] = first[r] + (row_pos[r] < 0 ? 0 : row_pos[r] / SPLIT - first_key(a, row_pos[r]) / SPLIT + 1);
    const int64_t units = first[rows];
    int64_t *unit_row = malloc((size_t)(units > 0 ? units : 1) * sizeof(int64_t));
    int64_t *cost = malloc((size_t)(units + 1) * sizeof(int64_t));
    float *parts = malloc((size_t)(units > 0 ? units : 1) * (size_t)part_n * sizeof(float));
    if (unit_row == NULL || cost == NULL || parts == NULL) {
        free(first);
        free(unit_row);
        free(cost);
        free(parts);
        return -1;
    }
    /* cost[u]: the keys of the units before u, plus a unit's fixed work (its softmax, its fold) */
    cost[0] = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t k0 = first_key(a, row_pos[r]), j0 = k0 / SPLIT;
        for (int64_t u = first[r]; u < first[r + 1]; u++) {
            const int64_t lo = (j0 + u - first[r]) * SPLIT, hi = row_pos[r] + 1 < lo + SPLIT ? row_pos[r] + 1 : lo + SPLIT;
            unit_row[u] = r;
            cost[u + 1] = cost[u] + hi - (k0 > lo ? k0 : lo) + UNIT_COST;
        }
    }
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *scratch = malloc((size_t)(hq * SPLIT + hq * d) * sizeof(float));
        /* Each thread takes one contiguous run of units holding about its share of the keys: a row's
         * splits follow each other on one thread, so pass 2 can prefetch the next one's keys, and a
         * prefill chunk's short early rows do not leave one thread the long ones. Which thread runs a
         * unit never changes its bits. */
        const int64_t lo = unit_near(cost, units, cost[units] * thread_num() / thread_count());
        const int64_t hi = unit_near(cost, units, cost[units] * (thread_num() + 1) / thread_count());
        for (int64_t u = lo; u < hi; u++) {
            if (scratch != NULL) {
                const int64_t r = unit_row[u], j = first_key(a, row_pos[r]) / SPLIT + u - first[r];
                attend_split_any(a, r, j, parts + u * part_n, scratch, scratch + hq * SPLIT);
            } else {
#pragma omp atomic write
                failed = 1;
            }
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) fold_row(a, r, parts + first[r] * part_n, first[r + 1] - first[r]);
        free(scratch);
    }
    free(cost);
    free(first);
    free(unit_row);
    free(parts);
    return failed ? -1 : 0;
}
