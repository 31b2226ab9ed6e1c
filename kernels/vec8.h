/* Eight float lanes and the arithmetic cpu_attention.c and cpu_decoder.c share: loads, fused
 * multiply-adds, the fixed folding tree, exp. Private to the library's C files.
 *
 * NOTE: the units that include this are built with -ffp-contract=off and without -ffast-math, so
 * every expression here rounds as written; fma8 is the one place a multiply-add fuses, the same in
 * every path of a build.
 */
#ifndef RADIXD_VEC8_H
#define RADIXD_VEC8_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__FMA__) || defined(__AVX__)
#include <immintrin.h>
#endif

#define LANES 8

/* Eight float lanes (GCC/Clang vector extension: AVX on x86, two NEON registers on Arm). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f ld(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void st(float *p, v8f v) { memcpy(p, &v, sizeof v); }

/* a * b + c rounded once where the CPU has FMA (one instruction instead of two in the dots), else
 * rounded twice: a build runs one of them for every row, so the choice never depends on a row. */
static inline __attribute__((always_inline)) v8f fma8(v8f a, v8f b, v8f c) {
#ifdef __FMA__
    return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

static inline float bf16_to_float(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float fold_lanes(v8f a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* a float in every lane */
#define SPLAT(x) ((v8f){x, x, x, x, x, x, x, x})

/* exp(x) for x <= 0 (0 below -87, where float32 leaves the normal range; -inf gives 0). */
static inline v8f exp_nonpos(v8f x) {
    const v8f lo = SPLAT(-87.f);
    v8i under = x < lo;
    v8f xc = (v8f)(((v8i)x & ~under) | ((v8i)lo & under));
    /* round to nearest: adding 1.5 * 2^23 leaves the integer part in the low mantissa bits */
    const v8f t = fma8(xc, SPLAT(1.44269504088896341f), SPLAT(12582912.0f));
    const v8f n = t - 12582912.0f;
    v8f r = fma8(n, SPLAT(-0.693359375f), xc);
    r = fma8(n, SPLAT(2.12194440e-4f), r);
    const v8f z = r * r;
    v8f y = fma8(r, SPLAT(1.9875691500e-4f), SPLAT(1.3981999507e-3f));
    y = fma8(y, r, SPLAT(8.3334519073e-3f));
    y = fma8(y, r, SPLAT(4.1665795894e-2f));
    y = fma8(y, r, SPLAT(1.6666665459e-1f));
    y = fma8(y, r, SPLAT(5.0000001201e-1f));
    y = fma8(y, z, r) + 1.0f;
    v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    return (v8f)((v8i)(y * (v8f)e) & ~under);
}

#endif
