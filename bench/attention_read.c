/* The CPU attention beside a plain read of the same KV blocks: how far the kernel is from the paged
 * read it cannot avoid (docs/bench-kernels.md, fifth run).
 *
 * Pools as the daemon keeps them for SmolLM2-135M: 30 layers, K and V, 16-token blocks of 3 kv heads
 * x 64 dims in f16, 1 GiB in all, on 2 MiB pages (MADV_HUGEPAGE before the first touch); the
 * context's blocks scattered at random over them, or in consecutive ids ("inorder": what one
 * conversation takes from a fresh pool), or as a file lists them ("file:PATH", one id a line: a table
 * that bench/block_layout.py wrote, the pool's own layout after a trace). A step is the 30 layers' calls of one decode row at the
 * last position. Each round times, interleaved, each after a read of a 256 MiB buffer (also on 2 MiB
 * pages) that empties the caches:
 *   floor   that read itself, at the same thread count: the step's K+V bytes at its rate;
 *   read    each thread reads its half of a layer's blocks, K then V, with 256-bit loads, asking for
 *           its next block a cache line with each 64 bytes read (the kernel's prefetch pattern,
 *           without its arithmetic): the paged read the kernel cannot avoid;
 *   kernel  radixd_attend_rows, as the compiled decoder step calls it.
 * Prints the medians of 15 rounds and the medians of the per-round ratios.
 *
 *     gcc -O3 -march=native -ffp-contract=off -fno-fast-math -fopenmp -std=c11 \
 *         bench/attention_read.c kernels/cpu_attention.c -o /tmp/attention_read
 *     for t in 1 2; do for b in scattered inorder; do /tmp/attention_read $t 4000 $b; done; done
 */
#include "read_floor.h"

int radixd_attend_rows(const void *q, int io_dtype, const void *k, const void *v, int dtype, int64_t block_size,
                       int64_t hkv, int64_t group, int64_t d, const int32_t *tables, int64_t width,
                       const int64_t *row_table, const int64_t *row_pos, int64_t rows, float scale, void *out,
                       int threads);

enum { LAYERS = 30, HKV = 3, D = 64, HQ = 9, DT_F16 = 2 };
static int B = 16; /* tokens a block: argv[4], 16 by default (the daemon's) */

/* One thread's share [lo, hi) of a layer's blocks in `table`, K then V, as plain reads. */
static int64_t read_blocks(const char *k, const char *v, const int32_t *table, int lo, int hi) {
    const size_t blk = (size_t)B * HKV * D * 2;
    __m256i acc = _mm256_setzero_si256();
    for (int kv = 0; kv < 2; kv++) {
        const char *base = kv ? v : k;
        for (int i = lo; i < hi; i++) {
            const char *p = base + (size_t)table[i] * blk, *next = base + (size_t)table[i + 1 < hi ? i + 1 : i] * blk;
            for (size_t o = 0; o < blk; o += 32) {
                if (o % 64 == 0) _mm_prefetch(next + o, _MM_HINT_T1);
                acc = _mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)(p + o)));
            }
        }
    }
    return _mm256_extract_epi32(acc, 0);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s THREADS CTX scattered|inorder|file:PATH [BLOCK_TOKENS]\n", argv[0]);
        return 2;
    }
    if (argc > 4) B = atoi(argv[4]);
    if (B < 1) {
        fprintf(stderr, "BLOCK_TOKENS must be >= 1, got %s\n", argv[4]);
        return 2;
    }
    const int threads = atoi(argv[1]), ctx = atoi(argv[2]), inorder = strcmp(argv[3], "inorder") == 0;
    const char *path = strncmp(argv[3], "file:", 5) == 0 ? argv[3] + 5 : NULL;
    const int nb = (ctx + B - 1) / B;
    const size_t blk = (size_t)B * HKV * D * 2, pool = ((size_t)1 << 30) / (2 * LAYERS * blk);
    if ((size_t)nb + 1 > pool) return 2;
    char *pools = huge_alloc(2 * LAYERS * pool * blk, 0);
    int32_t *ids = malloc(pool * sizeof(int32_t));
    if (ids == NULL) return 1;
    for (size_t i = 0; i < pool; i++) ids[i] = (int32_t)i;
    srand(3);
    for (size_t i = pool - 1; !inorder && path == NULL && i > 1; i--) { /* block 0 stays the null block */
        const size_t j = 1 + (size_t)rand() % i;
        const int32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    const int32_t *table = ids + 1;
    if (path != NULL) { /* the file's ids, in table order: every one a block of this pool */
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            fprintf(stderr, "cannot open %s\n", path);
            return 2;
        }
        int got = 0;
        for (long id; got < nb && fscanf(f, "%ld", &id) == 1; got++) {
            if (id < 1 || (size_t)id >= pool) {
                fprintf(stderr, "%s: block %ld is outside this pool's 1..%zu\n", path, id, pool - 1);
                return 2;
            }
            ids[got] = (int32_t)id;
        }
        fclose(f);
        if (got < nb) {
            fprintf(stderr, "%s holds %d blocks; %d tokens need %d\n", path, got, ctx, nb);
            return 2;
        }
        table = ids;
    }
    for (int l = 0; l < 2 * LAYERS; l++)
        for (int i = 0; i < nb; i++) {
            uint16_t *b = (uint16_t *)(pools + ((size_t)l * pool + (size_t)table[i]) * blk);
            for (size_t e = 0; e < blk / 2; e++) b[e] = (uint16_t)(0x3800 ^ (rand() & 0x3ff));
        }
    float q[HQ * D], out[HQ * D];
    for (int i = 0; i < HQ * D; i++) q[i] = (float)(rand() % 100) / 100.0f;
    const int64_t row_table = 0, row_pos = ctx - 1;
    const size_t big_bytes = (size_t)256 << 20, kv_bytes = 2 * LAYERS * (size_t)ctx * HKV * D * 2;
    char *big = huge_alloc(big_bytes, 1);
    enum { ROUNDS = 15 };
    double floor_ms[ROUNDS], read_ms[ROUNDS], kernel_ms[ROUNDS], read_x[ROUNDS], kernel_x[ROUNDS];
    volatile int64_t sink = 0;
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now(), reads[2];
        sink += read_all(big, big_bytes, threads);
        reads[0] = now() - t0;
        t0 = now();
        for (int l = 0; l < LAYERS; l++) {
            const char *k = pools + (size_t)(2 * l) * pool * blk, *v = pools + (size_t)(2 * l + 1) * pool * blk;
#pragma omp parallel num_threads(threads)
            {
                const int me = omp_get_thread_num(), n = omp_get_num_threads();
                const int64_t s = read_blocks(k, v, table, nb * me / n, nb * (me + 1) / n);
#pragma omp atomic
                sink += s;
            }
        }
        read_ms[r] = (now() - t0) * 1e3;
        t0 = now();
        sink += read_all(big, big_bytes, threads);
        reads[1] = now() - t0;
        t0 = now();
        for (int l = 0; l < LAYERS; l++) {
            const char *k = pools + (size_t)(2 * l) * pool * blk, *v = pools + (size_t)(2 * l + 1) * pool * blk;
            if (radixd_attend_rows(q, 0, k, v, DT_F16, B, HKV, HQ / HKV, D, table, nb, &row_table, &row_pos, 1,
                                   0.125f, out, threads))
                return 1;
        }
        kernel_ms[r] = (now() - t0) * 1e3;
        floor_ms[r] = (reads[0] + reads[1]) / 2 * (double)kv_bytes / (double)big_bytes * 1e3;
        read_x[r] = read_ms[r] / floor_ms[r];
        kernel_x[r] = kernel_ms[r] / floor_ms[r];
    }
    printf("%d threads, %d tokens (%.1f MB of K+V), %d-token blocks %s, %d rounds\n", threads, ctx,
           (double)kv_bytes / 1e6, B, path != NULL ? argv[3] : inorder ? "in consecutive ids" : "scattered over 1 GiB", ROUNDS);
    const double floor_med = median(floor_ms, ROUNDS);
    printf("  floor  %.3f ms (%.1f GB/s)\n", floor_med, (double)kv_bytes / floor_med / 1e6);
    printf("  read   %.3f ms, %.2fx the floor\n", median(read_ms, ROUNDS), median(read_x, ROUNDS));
    printf("  kernel %.3f ms, %.2fx the floor\n", median(kernel_ms, ROUNDS), median(kernel_x, ROUNDS));
    return 0;
}
