/* Float rows straight into pair rows (kernels.h) on AVX-512: the bytes act.c's quantizer and
 * qw_pair_act_rows give the same rows, in one pass.
 *
 * In a batched decode step every product first quantizes its act rows. Going through plain rows
 * (act.c, 8 floats a vector, each block's scale from two scalar divisions and its four code sums
 * from four horizontal sums) and then interleaving them into pair rows was about 5% of the demo's
 * 16-row step on a Zen 5 (perf samples). Here a block is quantized for 16 rows at once, as the
 * AMX quantizer does (intdot_amx.c): their maxima reduced together, their scales from one vector
 * of the same IEEE divisions, their code sums from three reductions of 16 vectors, and each
 * pair's codes interleaved in registers and written once (act_avx512.h has what the two share).
 * Zero codes are +0, as integer sums give them (a block of -0 values once had s = -0 here; the
 * byte test caught it).
 *
 * Every value is what act.c computes: the same act_scale (qblock.h; its cases repeated in
 * act_avx512.h, a change to one is a change to both), round to nearest even on the same products,
 * level 2 from the same exact difference, and code sums that are whole numbers far below 2^24,
 * exact as float sums in any order. Compiled for the AVX-512 machines (matmul.c asks qw_use_avx512()); the tests
 * also build it against SIMDe (QW_SIMDE, tests/test_avx512.py), which runs it on any CPU. */
#include <string.h>

#include "cpu.h"
#include "kernels.h"
#include "qblock.h"

#if defined(QW_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include "simde/x86/avx512.h"
#define R8_TARGET
#define QW_BUILD_ACT512 1
#elif QW_HAVE_X86
#include <immintrin.h>
#define R8_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define QW_BUILD_ACT512 1
#else
#define QW_BUILD_ACT512 0
#endif

#if QW_BUILD_ACT512

#define INLINE __attribute__((always_inline)) static inline
#include "act_avx512.h"

/* A pair's 64 code bytes of one block and level: rows a's and b's 32 codes (two halves each)
 * interleaved 4 bytes at a time. */
R8_TARGET INLINE __m512i pair_codes(const __m128i a[2], const __m128i b[2]) {
    const __m512i order = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutex2var_epi32(_mm512_castsi256_si512(_mm256_set_m128i(a[1], a[0])), order,
                                     _mm512_castsi256_si512(_mm256_set_m128i(b[1], b[0])));
}

/* Lanes 2p and 2p + 1 of v (pair p's two rows' 4-byte fields) to dst + p * pstride + off. */
R8_TARGET INLINE void put_fields(__m512i v, uint8_t *dst, size_t pstride, size_t off, int pairs) {
    _Alignas(64) uint64_t f[8];
    _mm512_store_si512((__m512i *)f, v);
    for (int p = 0; p < pairs; p++) memcpy(dst + (size_t)p * pstride + off, &f[p], 8);
}

R8_TARGET void qw_quantize_pairs_avx512(const float *X, size_t ldx, int rows, int64_t n, int bits, uint8_t *dst,
                                        size_t pstride, int64_t b0, int64_t b1) {
    const int levels = bits == 16 ? 2 : 1, pairs = (rows + 1) / 2;
    const size_t nb = (size_t)(n / QK), level2 = 2 * ACT_HALF(n); /* level 2 from a pair row's start */
    const size_t fd = 2 * (size_t)n, fs = fd + 8 * nb, fb = fs + 8 * nb; /* block 0's d, s and code sums */
    const __m512 k256 = _mm512_set1_ps(256.0f), zero = _mm512_setzero_ps();
    for (int64_t b = b0; b < b1; b++) {
        const float *x[16];
        __m512 ab[16];
        for (int m = 0; m < 16; m++) {
            x[m] = X + (size_t)(m < rows ? m : rows - 1) * ldx + 32 * (size_t)b;
            ab[red_at[m]] = amax_halves(x[m]);
        }
        _Alignas(64) float idd[16];
        __m512 dd, vidd;
        const __mmask16 finite = act_scale16(ab, &dd, &vidd);
        _mm512_store_ps(idd, vidd);
        /* each pair's codes, and each row's code sums to reduce: level 1's, level 2's, and the
         * low 16 values' (joined, 256 q1 + q2, for 16 bits) */
        __m512 l1s[16], l2s[16], los[16];
        for (int p = 0; p < 8; p++) {
            __m128i c1[2][2], c2[2][2];
            for (int i = 0; i < 2; i++) {
                const int m = 2 * p + i;
                __m512 l1[2] = {zero, zero}, l2[2] = {zero, zero};
                if (p < pairs) { /* rows past the last pair: zero sums, no codes */
                    if (finite >> m & 1) /* a block with a non-finite value has zero codes */
                        act_levels(x[m], _mm512_set1_ps(idd[m]), levels, l1, l2);
                    for (int h = 0; h < 2; h++) {
                        c1[i][h] = codes16(l1[h]);
                        c2[i][h] = codes16(l2[h]);
                    }
                }
                l1s[red_at[m]] = _mm512_add_ps(l1[0], l1[1]);
                l2s[red_at[m]] = _mm512_add_ps(l2[0], l2[1]);
                los[red_at[m]] = levels == 2 ? _mm512_add_ps(_mm512_mul_ps(l1[0], k256), l2[0]) : l1[0];
            }
            if (p < pairs) {
                uint8_t *q = dst + (size_t)p * pstride + 64 * (size_t)b;
                _mm512_storeu_si512((__m512i *)q, pair_codes(c1[0], c1[1]));
                if (levels == 2) _mm512_storeu_si512((__m512i *)(q + level2), pair_codes(c2[0], c2[1]));
            }
        }
        /* the fields, as act.c and qw_pair_act_rows write them */
        const __m512 s1 = red16_add(l1s), lo = red16_add(los);
        const size_t at = 8 * (size_t)b;
        const __m512i nlo = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_cvtps_epi32(lo));
        put_fields(_mm512_castps_si512(dd), dst, pstride, fd + at, pairs);
        if (levels == 2) {
            const __m512 all = _mm512_add_ps(_mm512_mul_ps(s1, k256), red16_add(l2s)); /* 256 s1 + s2 */
            const __m512 d2 = _mm512_mul_ps(dd, _mm512_set1_ps(1.0f / 256.0f));
            put_fields(_mm512_castps_si512(_mm512_mul_ps(dd, s1)), dst, pstride, fs + at, pairs);
            put_fields(nlo, dst, pstride, fb + at, pairs);
            put_fields(_mm512_castps_si512(d2), dst, pstride, level2 + fd + at, pairs);
            put_fields(_mm512_castps_si512(_mm512_mul_ps(d2, all)), dst, pstride, level2 + fs + at, pairs);
            put_fields(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_cvtps_epi32(all)), dst, pstride,
                       level2 + fb + at, pairs);
        } else { /* the two 16-value sums negated, as int16 */
            const __m512i nhi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_cvtps_epi32(_mm512_sub_ps(s1, lo)));
            put_fields(_mm512_castps_si512(_mm512_mul_ps(dd, s1)), dst, pstride, fs + at, pairs);
            put_fields(_mm512_or_si512(_mm512_slli_epi32(nhi, 16), _mm512_and_si512(nlo, _mm512_set1_epi32(0xffff))),
                       dst, pstride, fb + at, pairs);
        }
    }
}

#else
void qw_quantize_pairs_avx512(const float *X, size_t ldx, int rows, int64_t n, int bits, uint8_t *dst, size_t pstride,
                              int64_t b0, int64_t b1) {
    (void)X, (void)ldx, (void)rows, (void)n, (void)bits, (void)dst, (void)pstride, (void)b0, (void)b1;
}
#endif
