/* How fast one core reads a paged KV cache with no arithmetic: the memory side of the CPU attention's
 * floor (docs/bench-kernels.md).
 *
 * Pools as bench/kernels_cpu.py builds them (30 layers, K and V, SmolLM2's 3 kv heads x 64 dims in
 * f16: 384 bytes a token), blocks of B tokens in a random order; every layer's K blocks are read in
 * table order with 256-bit loads, then its V blocks, as the kernel's two passes do. Modes: 0 plain
 * loads (the hardware prefetchers alone), 1 each next block prefetched into L1 (prefetcht0) when the
 * block's reads begin, 2 the same into L2 (prefetcht1), 3 into L2 a line with each 64 bytes read
 * (the requests spread over the reads, as the kernel asks). Prints the best of 15 passes.
 *
 *     gcc -O2 -march=native bench/block_read.c -o /tmp/block_read
 *     for m in 0 1 2 3; do /tmp/block_read $m 16; done; /tmp/block_read 0 4096   # 4096: one block a layer
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int layers = 30, ctx = 4096, mode = argc > 1 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 16;
    const size_t row = 384, blk = (size_t)b * row;
    const int nb = ctx / b + 2, used = ctx / b;
    char *pools[2][30];
    for (int l = 0; l < layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            pools[kv][l] = aligned_alloc(64, (size_t)nb * blk);
            if (pools[kv][l] == NULL) return 1;
            memset(pools[kv][l], 1, (size_t)nb * blk);
        }
    int *table = malloc((size_t)nb * sizeof(int));
    for (int i = 0; i < nb; i++) table[i] = i;
    srand(1);
    for (int i = nb - 1; i > 0; i--) {
        const int j = rand() % (i + 1), t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    __m256i acc = _mm256_setzero_si256();
    double best = 1e9;
    for (int r = 0; r < 15; r++) {
        const double t0 = now();
        for (int l = 0; l < layers; l++)
            for (int kv = 0; kv < 2; kv++)
                for (int i = 0; i < used; i++) {
                    const char *p = pools[kv][l] + (size_t)table[i] * blk;
                    const char *next = pools[kv][l] + (size_t)table[i + 1 < used ? i + 1 : i] * blk;
                    if ((mode == 1 || mode == 2) && i + 1 < used) {
                        for (size_t o = 0; o < blk; o += 64) {
                            if (mode == 1) _mm_prefetch(next + o, _MM_HINT_T0);
                            else _mm_prefetch(next + o, _MM_HINT_T1);
                        }
                    }
                    for (size_t o = 0; o < blk; o += 32) {
                        if (mode == 3 && o % 64 == 0) _mm_prefetch(next + o, _MM_HINT_T1);
                        acc = _mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)(p + o)));
                    }
                }
        const double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    const double bytes = 2.0 * layers * used * (double)blk;
    printf("mode %d, %d-token blocks: %.2f ms, %.1f GB/s (%d)\n", mode, b, best * 1e3, bytes / best / 1e9,
           _mm256_extract_epi32(acc, 0) & 1);
    return 0;
}
