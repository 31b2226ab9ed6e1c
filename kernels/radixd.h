/* radixd's native CPU kernels: every entry point, struct and enum of the one library that
 * kernels/native.py builds from this package's C files (native.py mirrors them in ctypes, and
 * tests/kernels/test_header.py checks the mirror against this file).
 *
 * NOTE: every kernel here is row-invariant: a row's result depends on its own inputs only, never on
 * the other rows of a call, their number, or the thread count. The library is built with
 * -ffp-contract=off and without -ffast-math, which that argument relies on.
 */
#ifndef RADIXD_H
#define RADIXD_H

#include <stdint.h>

/* Element types of the KV pools and of the attention's query and output. */
typedef enum { RADIXD_F32 = 0, RADIXD_BF16 = 1, RADIXD_F16 = 2 } radixd_dtype;

/* How a projection's weights are stored (radixd_proj.kind). */
typedef enum {
    RADIXD_W_F32 = 0,     /* fp32 rows w [n, k] */
    RADIXD_W_Q4_1 = 1,    /* GGUF Q4_1: codes [n, k / 2], fp32 scales d and minimums mn [n, k / 32] */
    RADIXD_W_Q8_0 = 2,    /* GGUF Q8_0: int8 codes [n, k], fp32 scales d [n, k / 32] */
    RADIXD_W_Q4_1_A8 = 3, /* Q4_1 times 8-bit activations: d and mn fp16 */
    RADIXD_W_Q8_0_A8 = 4, /* Q8_0 times 8-bit activations: d fp16 */
    /* GGUF blocks as the file stores them (row r's blocks at w + r * the row's bytes; d, mn NULL),
     * times 8-bit activations: a scale per 32 inputs for the legacy formats, per 256 for K-quants. */
    RADIXD_W_Q4_0_A8 = 5,
    RADIXD_W_Q5_0_A8 = 6,
    RADIXD_W_Q5_1_A8 = 7,
    RADIXD_W_Q4_K_A8 = 8,
    RADIXD_W_Q5_K_A8 = 9,
    RADIXD_W_Q6_K_A8 = 10,
    RADIXD_W_F16 = 11,  /* fp16 rows w [n, k], fp32 arithmetic */
    RADIXD_W_BF16 = 12, /* bf16 rows w [n, k], fp32 arithmetic */
    /* Q4_K / Q6_K rows repacked by radixd_kquant_repack (16 rows' blocks interleaved; n % 16 == 0),
     * the same arithmetic and bits as Q4_K_A8 / Q6_K_A8; AVX512-VNNI CPUs only (-2 elsewhere). */
    RADIXD_W_Q4_K_X16 = 13,
    RADIXD_W_Q6_K_X16 = 14,
    /* Q4_1 / Q8_0 / Q5_0 rows repacked by radixd_legacy_repack (16 rows' blocks interleaved a pair of
     * blocks at a time; n % 16 == 0, k % 64 == 0), Q4_1_A8 / Q8_0_A8 / Q5_0_A8's weights and 8-bit
     * activations, each group's products summed in int32 before its scale (other last bits); AVX512-VNNI
     * CPUs only (-2 elsewhere). */
    RADIXD_W_Q4_1_X16 = 15,
    RADIXD_W_Q8_0_X16 = 16,
    RADIXD_W_Q5_0_X16 = 17,
    /* Q4_0 / Q5_1 rows repacked the same way (Q4_0: codes and d, its sum started from -8 x the activation
     * codes' sum; Q5_1: Q4_1's record and Q5_0's 5th bits), Q4_0_A8 / Q5_1_A8's weights and 8-bit
     * activations, other last bits; AVX512-VNNI CPUs only (-2 elsewhere). */
    RADIXD_W_Q4_0_X16 = 18,
    RADIXD_W_Q5_1_X16 = 19,
    /* Q5_K rows repacked by radixd_kquant_repack as Q4_K's (its 5th bits as byte masks), the same
     * arithmetic and bits as Q5_K_A8; AVX512-VNNI CPUs only (-2 elsewhere). */
    RADIXD_W_Q5_K_X16 = 20,
} radixd_weights;

/* One attention call: rows of queries, each attending to keys 0..row_pos through its table, or to the
 * last `window` of them (row_pos - window + 1..row_pos) under a sliding window. */
typedef struct {
    const void *q;                      /* [rows, hkv * group, d] of io_dtype */
    void *out;                          /* like q */
    const void *k, *v;                  /* pools [blocks, block_size, hkv, d] of dtype */
    const int32_t *tables;              /* [num_tables, width] block ids */
    const int64_t *row_table, *row_pos; /* [rows]: a row's table, its last key (-1: none, zeros) */
    int64_t rows, block_size, hkv, group, d, width;
    int64_t window; /* keys a row sees, its own included (0: all of them) */
    float scale;
    int32_t io_dtype; /* RADIXD_F32 or RADIXD_BF16 */
    int32_t dtype;    /* the pools' radixd_dtype */
} radixd_attn;

/* One projection y = x W^T (+ bias), or one part of it: a fused projection whose parts are stored in
 * different kinds (a GGUF's q, k and v, say) chains them, each part's outputs after the previous'. */
typedef struct radixd_proj {
    int64_t kind; /* radixd_weights */
    const void *w;
    const void *d, *mn; /* block scales and minimums (NULL where the kind has none) */
    const float *bias;  /* [n] or NULL */
    int64_t n, k;       /* this part's outputs and inputs */
    const struct radixd_proj *next; /* the next part, or NULL */
} radixd_proj;

/* One decoder layer. The parts only some families have are NULL where a layer lacks them. */
typedef struct {
    const float *attn_norm, *mlp_norm;           /* [hidden] */
    const float *q_norm, *k_norm;                /* [d]: RMSNorm of every q / k head before rotary (QK-norm) */
    const float *post_attn_norm, *post_mlp_norm; /* [hidden]: on the attention's / MLP's output (before the add) */
    radixd_proj qkv, o, gate_up, down;           /* qkv rows: q heads, k heads, v heads; gate_up: gate then up */
    void *k_cache, *v_cache;                     /* [blocks, block_size, hkv, d] of radixd_step.kv_dtype */
    int64_t window;                              /* keys a row attends to, its own included (0: all of them) */
    int32_t rope;                                /* the step's rotary table this layer rotates with */
    int32_t group;                               /* the step's KV group (block tables, slots) it stores and reads in */
    int32_t gelu;                                /* the gate: 1 GELU-tanh (GeGLU), 0 SiLU (SwiGLU) */
} radixd_layer;

/* A decoder step's rows: shapes, rotary tables, KV slots and the attention's rows (checked by
 * cpu_attention.py: every table entry and position stays inside the pool). A KV group is a set of
 * block tables (kv_layout.py: the sequences' own, or a sliding group's) and the slots the rows store at
 * in it; every group has the same rows and positions. */
typedef struct {
    int64_t rows, hidden, hq, hkv, d, inter, block_size, width, num_tables;
    float eps, scale;
    int32_t threads, attn_threads;
    int32_t kv_dtype;                   /* RADIXD_F32 or RADIXD_F16 */
    const float *cos, *sin;             /* [ropes, rows, d]: halves duplicated; sin signed (-sin, sin) */
    const int64_t *slots;               /* [groups, rows] block * block_size + offset; -1 stores nothing */
    const int32_t *tables;              /* [groups, num_tables, width] */
    const int64_t *row_table, *row_pos; /* [rows] */
} radixd_step;

/* cpu_attention.c: attend a->rows rows on up to `threads` threads. The caller checks shapes
 * (d % 8 == 0, d <= 256) and every index. Returns 0, or -1 when memory is missing. */
int radixd_attend_rows(const radixd_attn *a, int threads);

/* f32_gemm.c: y [m, n] = x [m, k] W^T (+ bias), n the outputs of every part of the chain, every kind
 * of radixd_weights (k a whole number of the kind's blocks; the a8 kinds need AVX2 only, AVX512-VNNI
 * where the CPU has it). 0, -1 (no memory) or -2 (a kind this build does not run). */
int radixd_gemm(const radixd_proj *p, const float *x, int64_t m, float *y, int threads);

/* f32_gemm.c: rows `rows` [count] of one part's W as fp32 out [count, k], exactly the weights its
 * kernels multiply by (an embedding lookup, a reference). 0, or -2 (a kind this build does not run). */
int radixd_dequantize_rows(const radixd_proj *p, const int64_t *rows, int64_t count, float *out);

/* f32_gemm.c: the GGUF blocks the fp32 matrix w [n, k] was expanded from; 1 where every weight is
 * recovered bit for bit (the outputs hold them), else 0. */
int radixd_q4_1_encode(const float *w, int64_t n, int64_t k, uint8_t *codes, float *d, float *mn);
int radixd_q8_0_encode(const float *w, int64_t n, int64_t k, int8_t *codes, float *d);

/* kquant_x16.c: the Q4_K (kind RADIXD_W_Q4_K_X16), Q6_K (RADIXD_W_Q6_K_X16) or Q5_K (RADIXD_W_Q5_K_X16)
 * matrix src [n, k] as the GGUF stores it, repacked into dst (radixd_kquant_repacked_bytes(kind, n, k) bytes). 0, or -2
 * (another kind, n not a multiple of 16, or a CPU without AVX512-VNNI). */
int radixd_kquant_repack(int64_t kind, const void *src, int64_t n, int64_t k, void *dst);
int64_t radixd_kquant_repacked_bytes(int64_t kind, int64_t n, int64_t k);

/* legacy_x16.c: the Q4_1 (kind RADIXD_W_Q4_1_X16), Q8_0 (RADIXD_W_Q8_0_X16), Q5_0 (RADIXD_W_Q5_0_X16),
 * Q4_0 (RADIXD_W_Q4_0_X16) or Q5_1 (RADIXD_W_Q5_1_X16) matrix src [n, k] as the GGUF stores it, repacked into dst (radixd_legacy_repacked_bytes(kind, n, k) bytes). 0, or -2 (another
 * kind, n not a multiple of 16, k not of 64, or a CPU without AVX512-VNNI). */
int radixd_legacy_repack(int64_t kind, const void *src, int64_t n, int64_t k, void *dst);
int64_t radixd_legacy_repacked_bytes(int64_t kind, int64_t n, int64_t k);

/* cpu_decoder.c: floats of scratch radixd_decoder_forward needs for `rows` rows. */
int64_t radixd_decoder_workspace(int64_t rows, int64_t hidden, int64_t hq, int64_t hkv, int64_t d, int64_t inter);

/* cpu_decoder.c: every layer of a step and the final norm. h [rows, hidden]: the embeddings in (the
 * residual stream), out: the final-normed hidden states (may be h). 0, or -1 (no memory). */
int radixd_decoder_forward(const radixd_layer *layers, int64_t num_layers, const float *final_norm,
                           const radixd_step *s, float *h, float *out, float *work);

#endif
