/* Vector math shared by the kernels' AVX2 and AVX-512 paths. */
#ifndef QWENC_VECMATH_H
#define QWENC_VECMATH_H

#include "cpu.h"

#if QW_HAVE_X86
#include <immintrin.h>

/* e^x to about 1 ulp: 2^n times a degree-7 polynomial of the remainder r = x - n ln 2 (ln 2
 * split in two so r is exact), the classic Cephes expf scheme. x is clamped to [-87, 88], where
 * 2^n stays a normal float. The callers only need e^x to saturate there: SiLU's g / (1 + e^-g) is
 * then 0 or g to float precision, and a softmax term e^(s - max) below e^-87 is negligible beside
 * the max's own e^0 = 1. The steps are written once for 8 and 16 lanes (P: the intrinsics'
 * prefix; ROUND: the rounding intrinsic; CASTI: the integer-to-float bit cast), so both give the
 * same bits lane for lane. */
#define QW_EXP_STEPS(P, ROUND, CASTI, x)                                                                    \
    do {                                                                                                   \
        x = P##_min_ps(P##_max_ps(x, P##_set1_ps(-87.0f)), P##_set1_ps(88.0f));                             \
        const __typeof__(x) n = ROUND(P##_mul_ps(x, P##_set1_ps(1.44269504088896341f)),                      \
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                       \
        __typeof__(x) r = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                                   \
        r = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), r);                                              \
        __typeof__(x) p = P##_set1_ps(1.9875691500e-4f);                                                    \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.3981999507e-3f));                                              \
        p = P##_fmadd_ps(p, r, P##_set1_ps(8.3334519073e-3f));                                              \
        p = P##_fmadd_ps(p, r, P##_set1_ps(4.1665795894e-2f));                                              \
        p = P##_fmadd_ps(p, r, P##_set1_ps(1.6666665459e-1f));                                              \
        p = P##_fmadd_ps(p, r, P##_set1_ps(5.0000001201e-1f));                                              \
        p = P##_fmadd_ps(p, P##_mul_ps(r, r), P##_add_ps(r, P##_set1_ps(1.0f)));                             \
        x = P##_mul_ps(p, CASTI(P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23))); \
    } while (0)

/* e^x for 8 floats. */
QW_TARGET_AVX2 static inline __m256 qw_exp8(__m256 x) {
    QW_EXP_STEPS(_mm256, _mm256_round_ps, _mm256_castsi256_ps, x);
    return x;
}

/* e^x for 16 floats. */
QW_TARGET_AVX512F static inline __m512 qw_exp16(__m512 x) {
    QW_EXP_STEPS(_mm512, _mm512_roundscale_ps, _mm512_castsi512_ps, x);
    return x;
}
#endif

#endif
