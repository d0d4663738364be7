/* AVX2 integer products on the row-interleaved layouts (intdot.c), in quant.h's one order.
 *
 * A record's 32-value block is unpacked once into 8 "step" vectors of unsigned (Q8_0: signed)
 * codes, 4 consecutive codes of each of the 8 rows per vector, and serves every act row of the
 * product: for each, 8 vpmaddubsw by 4 broadcast act codes sum code pairs into 16-bit lanes
 * (two lanes per row), vpmaddwd folds each row's two lanes into one 32-bit lane, so a vector
 * holds the 8 rows' exact block sums with no horizontal reduction; one conversion and one FMA
 * per block (two for Q6_K's two groups) then update the 8 rows' float sums.
 *
 * No 16-bit lane can overflow: a vpmaddubsw lane is at most 2 * 15 * 127 = 3810 for 4-bit codes
 * (8 steps summed: 30480), 2 * 31 * 127 = 7874 for 5-bit codes (4 steps: 31496), 2 * 63 * 127 =
 * 16002 for 6-bit codes (2 steps: 32004), and 2 * 128 * 127 = 32512 for Q8_0's |code| (taken one
 * step at a time, its sign moved onto the act codes with vpsignb). */
#include "kernels.h"
#include "qblock.h"

#if QW_HAVE_X86
#include <immintrin.h>

#define R8_TARGET QW_TARGET_AVX2
#define R8_GETTER qw_r8_kernel_avx2
#include "intdot_x86.h"

/* Q8_0's codes stay signed: sum8 takes their magnitudes and moves their signs onto the act. */
R8_TARGET INLINE void unpack_q8(const uint8_t *codes, __m256i c[8]) {
    for (int s = 0; s < 8; s++) c[s] = load32(codes + 32 * s);
}

/* ---------------------------------------------------------------- block sums */

R8_TARGET INLINE __m256i sum4(const __m256i c[8], const int8_t *x) {
    __m256i p = _mm256_maddubs_epi16(c[0], bcast4(x));
    for (int s = 1; s < 8; s++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(c[s], bcast4(x + 4 * s)));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

R8_TARGET INLINE __m256i sum5(const __m256i c[8], const int8_t *x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_maddubs_epi16(c[0], bcast4(x)), b = _mm256_maddubs_epi16(c[4], bcast4(x + 16));
    for (int s = 1; s < 4; s++) {
        a = _mm256_add_epi16(a, _mm256_maddubs_epi16(c[s], bcast4(x + 4 * s)));
        b = _mm256_add_epi16(b, _mm256_maddubs_epi16(c[s + 4], bcast4(x + 16 + 4 * s)));
    }
    return _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
}

/* Q6_K: steps 0-3 are group a, 4-7 group b (into *b), summed two steps at a time. */
R8_TARGET INLINE __m256i sum6(const __m256i c[8], const int8_t *x, __m256i *b) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i t[4];
    for (int u = 0; u < 4; u++)
        t[u] = _mm256_add_epi16(_mm256_maddubs_epi16(c[2 * u], bcast4(x + 8 * u)),
                                _mm256_maddubs_epi16(c[2 * u + 1], bcast4(x + 8 * u + 4)));
    *b = _mm256_add_epi32(_mm256_madd_epi16(t[2], ones), _mm256_madd_epi16(t[3], ones));
    return _mm256_add_epi32(_mm256_madd_epi16(t[0], ones), _mm256_madd_epi16(t[1], ones));
}

/* Q8_0: signed codes c as |c| with c's sign moved onto the act codes. */
R8_TARGET INLINE __m256i sum8(const __m256i c[8], const int8_t *x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
        __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(c[s]), _mm256_sign_epi8(bcast4(x + 4 * s), c[s]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
    return acc;
}

R8_TARGET INLINE __m256i block_sum(int T, const __m256i c[8], const int8_t *x, const int16_t *bs, __m256i *second) {
    switch (T) {
    case QW_Q4_0: return _mm256_sub_epi32(sum4(c, x), offset_sums(bs, 8));
    case QW_Q4_1: case QW_Q4_K: return sum4(c, x);
    case QW_Q5_0: return _mm256_sub_epi32(sum5(c, x), offset_sums(bs, 16));
    case QW_Q5_1: case QW_Q5_K: return sum5(c, x);
    case QW_Q8_0: return sum8(c, x);
    default: {
        __m256i b, a = sum6(c, x, &b);
        *second = _mm256_sub_epi32(b, q6_offset(bs, 1));
        return _mm256_sub_epi32(a, q6_offset(bs, 0));
    }
    }
}

#else
qw_r8_fn qw_r8_kernel_avx2(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}
#endif /* QW_HAVE_X86 */
