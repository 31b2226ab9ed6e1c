/* The helpers of the memory benches (attention_read.c, scatter_read.c): a clock, buffers on 2 MiB
 * pages, the floor's read, a median. Included by each bench, which is built alone. */
#ifndef RADIXD_BENCH_READ_FLOOR_H
#define RADIXD_BENCH_READ_FLOOR_H
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define HUGE (2u << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* `bytes` on 2 MiB pages where the kernel lends them, touched (zeroed or set to `fill`). */
static char *huge_alloc(size_t bytes, int fill) {
    bytes = (bytes + HUGE - 1) & ~(size_t)(HUGE - 1);
    char *p = aligned_alloc(HUGE, bytes);
    if (p == NULL) exit(1);
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, fill, bytes);
    return p;
}

/* Sum of `bytes` at `p` by 256-bit loads, split over `threads`. */
static int64_t read_all(const char *p, size_t bytes, int threads) {
    int64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        const int me = omp_get_thread_num(), n = omp_get_num_threads();
        const size_t lo = bytes / 32 * (size_t)me / (size_t)n * 32, hi = bytes / 32 * (size_t)(me + 1) / (size_t)n * 32;
        __m256i acc = _mm256_setzero_si256();
        for (size_t o = lo; o < hi; o += 32) acc = _mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)(p + o)));
        sink += _mm256_extract_epi32(acc, 0);
    }
    return sink;
}

static double median(double *x, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (x[j] < x[i]) {
                const double t = x[i];
                x[i] = x[j];
                x[j] = t;
            }
    return x[n / 2];
}

#endif
