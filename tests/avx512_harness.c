/* Test-only entry point to the AVX-512 integer products, for a build against SIMDe (see
 * test_avx512.py): the kernels of csrc/intdot_avx512.c, compiled so that any CPU runs them. */
#include "kernels.h"

int qw_test_r8_avx512(int dtype, int bits, int wide, const uint8_t *group, int64_t K, const uint8_t *xq,
                      size_t xstride, int64_t M, float *out) {
    qw_r8_fn k = wide ? qw_r8_kernel_avx512w(dtype, bits) : qw_r8_kernel_avx512(dtype, bits);
    if (!k) return -1;
    k(group, K, xq, xstride, M, out);
    return 0;
}

int qw_test_r8_two_avx512(int dtype, int bits, const uint8_t *groups, int64_t K, const uint8_t *xq, size_t xstride,
                          int64_t M, float *out) {
    qw_r8_two_fn k = qw_r8_kernel_avx512w2(dtype, bits);
    if (!k) return -1;
    k(groups, K, xq, xstride, M, out);
    return 0;
}
