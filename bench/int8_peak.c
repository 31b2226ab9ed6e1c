/* One core's int8 multiply-accumulate peak: `vpdpbusd` (AVX512-VNNI, 4 u8 x s8 products into each
 * int32 lane) on 12 independent accumulators, so throughput, not latency, bounds the loop; and the
 * same with a `vpmulld` + `vpaddd` per 8 of them (kernels/kquant_x16.c's mix for the K-quants'
 * exact sub-block scales). The limit bench-kernels.md compares the projection kernels with.
 *
 *     cc -O3 -funroll-all-loops -march=native bench/int8_peak.c -o /tmp/int8_peak && /tmp/int8_peak
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define STEPS 200000000LL

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    __m512i acc[12], sum[4];
    __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(5);
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i);
    double t0 = now();
    for (long long it = 0; it < STEPS / 12; it++) {
        for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], u, v);
        __asm__ volatile("" : "+v"(u)); /* u is unknown to the compiler each round */
    }
    double s = now() - t0;
    printf("vpdpbusd zmm: %.2f G instructions/s = %.1f GMAC/s\n", STEPS / s / 1e9, STEPS * 64.0 / s / 1e9);

    for (int i = 0; i < 4; i++) sum[i] = _mm512_setzero_si512();
    t0 = now();
    for (long long it = 0; it < STEPS / 64; it++) {
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 8; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], u, v);
        for (int i = 0; i < 8; i++) sum[i & 3] = _mm512_add_epi32(sum[i & 3], _mm512_mullo_epi32(acc[i], u));
        __asm__ volatile("" : "+v"(u));
    }
    s = now() - t0;
    __m512i all = _mm512_add_epi32(_mm512_add_epi32(sum[0], sum[1]), _mm512_add_epi32(sum[2], sum[3]));
    for (int i = 0; i < 12; i++) all = _mm512_add_epi32(all, acc[i]);
    printf("8 vpdpbusd + vpmulld + vpaddd (zmm): %.1f GMAC/s (check %d)\n", (double)(STEPS / 64) * 64 * 64 / s / 1e9,
           _mm512_reduce_add_epi32(all));
    return 0;
}
