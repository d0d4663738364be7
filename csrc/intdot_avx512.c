/* AVX-512 VNNI integer products on the row-interleaved layouts (intdot.c), in quant.h's one order.
 *
 * The AVX2 kernels' loop (intdot_x86.h) with vpdpbusd on 256-bit vectors (AVX512-VL): each of a
 * block's 8 step vectors meets its 4 broadcast act codes in one instruction that multiplies the
 * unsigned codes by the signed act codes and adds each row's 4 products into that row's 32-bit
 * lane, where AVX2 needs vpmaddubsw, a 16-bit add and (once per block) vpmaddwd. The lanes hold
 * the same exact integers, and the float work after them is shared, so both paths give the same
 * bits. A k-quant's sub-block scale is one vpmulld of the block sum instead of vpmaddwd's factor.
 * Q8_0's signed codes go in with 128 added (an XOR of the sign bit) and 128 times the act block's
 * code sum comes off in integers.
 *
 * Why 256-bit vectors: an earlier version put two steps in one 512-bit vector, which needs the act
 * codes permuted to match (one vpermd per vpdpbusd) and the halves added per block; on Zen 4, which
 * runs a 512-bit operation as two 256-bit ones, it was slower than the AVX2 kernels at decode
 * (1.5B, int8: 31 against 42 tok/s) and no faster at prefill.
 *
 * Compiled for the AVX-512 machines that have VNNI (cpu.c chooses it at run time). The tests
 * build this same file against SIMDe (QW_SIMDE, tests/test_avx512.py), which runs it on any CPU. */
#include "kernels.h"
#include "qblock.h"

#if defined(QW_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include "simde/x86/avx512.h"
#include "simde/x86/f16c.h"
#include "simde/x86/fma.h"
#define R8_TARGET
#define QW_BUILD_AVX512 1
#elif QW_HAVE_X86
#include <immintrin.h>
#define R8_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define QW_BUILD_AVX512 1
#else
#define QW_BUILD_AVX512 0
#endif

#if QW_BUILD_AVX512

#define R8_GETTER qw_r8_kernel_avx512
#include "intdot_x86.h"

/* Q4_K, Q5_K: the sub-block scale per row as a 32-bit lane; Q6_K: sc_a's and sc_b's. */
R8_TARGET INLINE void scale_factors(int T, const uint8_t *sc, __m256i kab, __m256i *k, __m256i *kb) {
    if (T == QW_Q6_K) {
        *k = _mm256_srai_epi32(_mm256_slli_epi32(kab, 16), 16);
        *kb = _mm256_srai_epi32(kab, 16);
    } else {
        *k = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc));
    }
}

/* Q8_0's codes made unsigned (code + 128); block_sum takes 128 times the act code sum off. */
R8_TARGET INLINE void unpack_q8(const uint8_t *codes, __m256i c[8]) {
    for (int s = 0; s < 8; s++) c[s] = _mm256_xor_si256(load32(codes + 32 * s), _mm256_set1_epi8((char)0x80));
}

/* Steps [first, first + n) of the block summed into each row's lane, in two chains (even and odd
 * steps): with one act row, a single chain of dependent vpdpbusd waited on its latency (1.5B
 * int8 decode 35 tok/s, below the AVX2 kernels' 44). */
R8_TARGET INLINE __m256i dot_steps(const __m256i c[8], const int8_t *x, int first, int n) {
    __m256i a = _mm256_dpbusd_epi32(_mm256_setzero_si256(), c[first], bcast4(x + 4 * first));
    __m256i b = _mm256_dpbusd_epi32(_mm256_setzero_si256(), c[first + 1], bcast4(x + 4 * first + 4));
    for (int s = first + 2; s < first + n; s += 2) {
        a = _mm256_dpbusd_epi32(a, c[s], bcast4(x + 4 * s));
        b = _mm256_dpbusd_epi32(b, c[s + 1], bcast4(x + 4 * s + 4));
    }
    return _mm256_add_epi32(a, b);
}

R8_TARGET INLINE __m256i block_sum(int T, const __m256i c[8], const int8_t *x, const int16_t *bs, __m256i k,
                                   __m256i kb, __m256i kab) {
    switch (T) {
    case QW_Q4_0: return _mm256_sub_epi32(dot_steps(c, x, 0, 8), offset_sums(bs, 8));
    case QW_Q5_0: return _mm256_sub_epi32(dot_steps(c, x, 0, 8), offset_sums(bs, 16));
    case QW_Q8_0: return _mm256_sub_epi32(dot_steps(c, x, 0, 8), offset_sums(bs, 128));
    case QW_Q4_K: case QW_Q5_K: return _mm256_mullo_epi32(dot_steps(c, x, 0, 8), k);
    case QW_Q6_K: {
        __m256i a = _mm256_mullo_epi32(dot_steps(c, x, 0, 4), k), b = _mm256_mullo_epi32(dot_steps(c, x, 4, 4), kb);
        return _mm256_sub_epi32(_mm256_add_epi32(a, b), q6_offsets(kab, bs));
    }
    default: return dot_steps(c, x, 0, 8); /* Q4_1, Q5_1 */
    }
}

#else
qw_r8_fn qw_r8_kernel_avx512(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}
#endif
