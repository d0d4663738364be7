/* AVX2 integer products on the row-interleaved layouts (intdot.c), in quant.h's one order.
 *
 * A record's 32-value block is unpacked once into 8 "step" vectors of unsigned (Q8_0: signed)
 * codes, 4 consecutive codes of each of the 8 rows per vector, and serves every act row of the
 * product: for each, 8 vpmaddubsw by 4 broadcast act codes sum code pairs into 16-bit lanes
 * (two lanes per row), vpmaddwd folds each row's two lanes (times a k-quant's scale) into one
 * 32-bit lane, so a vector holds the 8 rows' exact block sums with no horizontal reduction; one
 * conversion and one FMA per block then update the 8 rows' float sums.
 *
 * No 16-bit lane can overflow: a vpmaddubsw lane is at most 2 * 15 * 127 = 3810 for 4-bit codes
 * (8 steps summed: 30480), 2 * 31 * 127 = 7874 for 5-bit codes (4 steps: 31496), 2 * 63 * 127 =
 * 16002 for 6-bit codes (2 steps: 32004), and 2 * 128 * 127 = 32512 for Q8_0's |code| (taken one
 * step at a time, its sign moved onto the act codes with vpsignb). */
#include "kernels.h"
#include "qblock.h"

#if QW_HAVE_X86
#include <immintrin.h>

#define INLINE __attribute__((always_inline)) static inline

QW_TARGET_AVX2 INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 4 act codes broadcast to every row's position. */
QW_TARGET_AVX2 INLINE __m256i bcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

/* 8 rows' f16 fields as floats. */
QW_TARGET_AVX2 INLINE __m256 f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* ---------------------------------------------------------------- unpacking a block */

/* The low 4 bits of the 8 steps from 128 bytes of nibbles. */
QW_TARGET_AVX2 INLINE void unpack_nibbles8(const uint8_t *nib, __m256i c[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int v = 0; v < 4; v++) {
        __m256i w = load32(nib + 32 * v);
        c[2 * v] = _mm256_and_si256(w, m4);
        c[2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
    }
}

/* Bit s of each byte of the fifth-bit vector moved to bit 4 of step s (16-bit shifts are safe:
 * the mask keeps only bit 4 of each byte, which came from the same byte). */
QW_TARGET_AVX2 INLINE void add_fifth_bits(const uint8_t *fifth, __m256i c[8]) {
    const __m256i b4 = _mm256_set1_epi8(0x10);
    __m256i h = load32(fifth);
    c[0] = _mm256_or_si256(c[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), b4));
    c[1] = _mm256_or_si256(c[1], _mm256_and_si256(_mm256_slli_epi16(h, 3), b4));
    c[2] = _mm256_or_si256(c[2], _mm256_and_si256(_mm256_slli_epi16(h, 2), b4));
    c[3] = _mm256_or_si256(c[3], _mm256_and_si256(_mm256_slli_epi16(h, 1), b4));
    c[4] = _mm256_or_si256(c[4], _mm256_and_si256(h, b4));
    c[5] = _mm256_or_si256(c[5], _mm256_and_si256(_mm256_srli_epi16(h, 1), b4));
    c[6] = _mm256_or_si256(c[6], _mm256_and_si256(_mm256_srli_epi16(h, 2), b4));
    c[7] = _mm256_or_si256(c[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), b4));
}

/* Q6_K: bits 2t, 2t + 1 of the high-bit vectors moved to bits 4, 5 of step 4 h + t. */
QW_TARGET_AVX2 INLINE void add_high_bits(const uint8_t *high, __m256i c[8]) {
    const __m256i b45 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        __m256i v = load32(high + 32 * h);
        c[4 * h] = _mm256_or_si256(c[4 * h], _mm256_and_si256(_mm256_slli_epi16(v, 4), b45));
        c[4 * h + 1] = _mm256_or_si256(c[4 * h + 1], _mm256_and_si256(_mm256_slli_epi16(v, 2), b45));
        c[4 * h + 2] = _mm256_or_si256(c[4 * h + 2], _mm256_and_si256(v, b45));
        c[4 * h + 3] = _mm256_or_si256(c[4 * h + 3], _mm256_and_si256(_mm256_srli_epi16(v, 2), b45));
    }
}

/* 8 bytes (one per row) as the vpmaddwd factor of each row's two 16-bit lanes. */
QW_TARGET_AVX2 INLINE __m256i row_factors_u8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}

/* ---------------------------------------------------------------- block sums
 *
 * The exact sums of one block's codes times 32 act codes, as 8 rows' 32-bit lanes. k: each
 * row's vpmaddwd factor (ones, or a k-quant's scale). */

QW_TARGET_AVX2 INLINE __m256i sum4(const __m256i c[8], const int8_t *x, __m256i k) {
    __m256i p = _mm256_maddubs_epi16(c[0], bcast4(x));
    for (int s = 1; s < 8; s++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(c[s], bcast4(x + 4 * s)));
    return _mm256_madd_epi16(p, k);
}

QW_TARGET_AVX2 INLINE __m256i sum5(const __m256i c[8], const int8_t *x, __m256i k) {
    __m256i a = _mm256_maddubs_epi16(c[0], bcast4(x)), b = _mm256_maddubs_epi16(c[4], bcast4(x + 16));
    for (int s = 1; s < 4; s++) {
        a = _mm256_add_epi16(a, _mm256_maddubs_epi16(c[s], bcast4(x + 4 * s)));
        b = _mm256_add_epi16(b, _mm256_maddubs_epi16(c[s + 4], bcast4(x + 16 + 4 * s)));
    }
    return _mm256_add_epi32(_mm256_madd_epi16(a, k), _mm256_madd_epi16(b, k));
}

/* Q6_K: steps 0-3 are group a (factor ka), 4-7 group b (kb), summed two steps at a time. */
QW_TARGET_AVX2 INLINE __m256i sum6(const __m256i c[8], const int8_t *x, __m256i ka, __m256i kb) {
    __m256i t[4];
    for (int u = 0; u < 4; u++)
        t[u] = _mm256_add_epi16(_mm256_maddubs_epi16(c[2 * u], bcast4(x + 8 * u)),
                                _mm256_maddubs_epi16(c[2 * u + 1], bcast4(x + 8 * u + 4)));
    return _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(t[0], ka), _mm256_madd_epi16(t[1], ka)),
                            _mm256_add_epi32(_mm256_madd_epi16(t[2], kb), _mm256_madd_epi16(t[3], kb)));
}

/* Q8_0: signed codes c as |c| with c's sign moved onto the act codes. */
QW_TARGET_AVX2 INLINE __m256i sum8(const uint8_t *codes, const int8_t *x) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
        __m256i c = load32(codes + 32 * s);
        __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(c), _mm256_sign_epi8(bcast4(x + 4 * s), c));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
    return acc;
}

/* The act block's code sum (from its two 16-value sums) times `off`, in every lane: the pair
 * broadcast as one 32-bit load, and vpmaddwd by (off, off). */
QW_TARGET_AVX2 INLINE __m256i offset_sums(const int16_t *bs, int off) {
    int32_t pair;
    memcpy(&pair, bs, 4);
    return _mm256_madd_epi16(_mm256_set1_epi32(pair), _mm256_set1_epi16((short)off));
}

/* ---------------------------------------------------------------- the product
 *
 * T and BITS are constants in each instantiation below, so every type test folds away. For each
 * record and sub-block: unpack once, then for each act row (and level) the block sums, their
 * offset, and acc = fma(I, D dx, acc) (and macc = fma(M, s, macc)) on the 8 rows' lanes. */

#define IS_K(T) ((T) == QW_Q4_K || (T) == QW_Q5_K || (T) == QW_Q6_K)

QW_TARGET_AVX2 INLINE void product(const int T, const int BITS, const uint8_t *g, int64_t K, const uint8_t *xq,
                                   size_t xstride, int64_t M, float *out) {
    const int bs = IS_K(T) ? 256 : 32, subs = bs / 32, levels = BITS == 16 ? 2 : 1;
    const int rb = T == QW_Q4_0 ? 144 : T == QW_Q4_1 ? 160 : T == QW_Q5_0 ? 176 : T == QW_Q5_1 ? 192 :
                   T == QW_Q8_0 ? 272 : T == QW_Q4_K ? 1184 : T == QW_Q5_K ? 1440 : 1680;
    const int has_min = T == QW_Q4_1 || T == QW_Q5_1 || T == QW_Q4_K || T == QW_Q5_K;
    const size_t half = ACT_HALF(K);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[QW_R8_MAX_M], macc[QW_R8_MAX_M];
    for (int64_t m = 0; m < M; m++) acc[m] = macc[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < K / bs; i++) {
        const uint8_t *rec = g + (size_t)i * (size_t)rb;
        const __m256 D = f16x8(rec);
        __m256 Mv = _mm256_setzero_ps(), Dmin = _mm256_setzero_ps();
        if (T == QW_Q4_1 || T == QW_Q5_1) Mv = f16x8(rec + 16);
        if (T == QW_Q4_K || T == QW_Q5_K) Dmin = f16x8(rec + 16);
        for (int j = 0; j < subs; j++) {
            const int64_t b = i * subs + j;
            qw_prefetch_share(rec, rb, subs, j);
            __m256i c[8], k = ones, kb = ones, kab = ones;
            switch (T) {
            case QW_Q4_0: case QW_Q4_1: unpack_nibbles8(rec + (T == QW_Q4_0 ? 16 : 32), c); break;
            case QW_Q5_0: unpack_nibbles8(rec + 48, c); add_fifth_bits(rec + 16, c); break;
            case QW_Q5_1: unpack_nibbles8(rec + 64, c); add_fifth_bits(rec + 32, c); break;
            case QW_Q4_K: case QW_Q5_K:
                if (T == QW_Q4_K)
                    unpack_nibbles8(rec + 160 + 128 * j, c);
                else {
                    unpack_nibbles8(rec + 416 + 128 * j, c);
                    add_fifth_bits(rec + 160 + 32 * j, c);
                }
                k = row_factors_u8(rec + 32 + 8 * j);
                Mv = _mm256_mul_ps(Dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 96 + 8 * j)))));
                break;
            case QW_Q6_K: {
                unpack_nibbles8(rec + 656 + 128 * j, c);
                add_high_bits(rec + 144 + 64 * j, c);
                /* (sc_a, sc_b) per row as 16-bit pairs; a's factor in both halves, then b's */
                kab = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + 16 + 16 * j)));
                k = _mm256_or_si256(_mm256_and_si256(kab, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(kab, 16));
                kb = _mm256_or_si256(_mm256_srli_epi32(kab, 16), _mm256_and_si256(kab, _mm256_set1_epi32((int)0xFFFF0000u)));
                break;
            }
            default: break;
            }
            for (int64_t m = 0; m < M; m++) {
                const int8_t *row = (const int8_t *)(xq + (size_t)m * xstride);
                for (int lv = 0; lv < levels; lv++) {
                    const int8_t *xl = row + (size_t)lv * half, *x = xl + 32 * b;
                    const int16_t *bsum = ACT_BSUMS(xl, K) + 2 * b;
                    __m256i I;
                    switch (T) {
                    case QW_Q4_0: I = _mm256_sub_epi32(sum4(c, x, ones), offset_sums(bsum, 8)); break;
                    case QW_Q4_1: I = sum4(c, x, ones); break;
                    case QW_Q5_0: I = _mm256_sub_epi32(sum5(c, x, ones), offset_sums(bsum, 16)); break;
                    case QW_Q5_1: I = sum5(c, x, ones); break;
                    case QW_Q8_0: I = sum8(rec + 16, x); break;
                    case QW_Q4_K: I = sum4(c, x, k); break;
                    case QW_Q5_K: I = sum5(c, x, k); break;
                    default: { /* Q6_K: less 32 (sc_a bsum_a + sc_b bsum_b) */
                        int32_t pair;
                        memcpy(&pair, bsum, 4);
                        __m256i offs = _mm256_slli_epi32(_mm256_madd_epi16(kab, _mm256_set1_epi32(pair)), 5);
                        I = _mm256_sub_epi32(sum6(c, x, k, kb), offs);
                    }
                    }
                    __m256 ddx = _mm256_mul_ps(D, _mm256_broadcast_ss(ACT_D(xl, K) + b));
                    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), ddx, acc[m]);
                    if (has_min) macc[m] = _mm256_fmadd_ps(Mv, _mm256_broadcast_ss(ACT_S(xl, K) + b), macc[m]);
                }
            }
        }
    }
    for (int64_t m = 0; m < M; m++) {
        __m256 r = acc[m];
        if (T == QW_Q4_1 || T == QW_Q5_1) r = _mm256_add_ps(acc[m], macc[m]);
        if (T == QW_Q4_K || T == QW_Q5_K) r = _mm256_sub_ps(acc[m], macc[m]);
        _mm256_storeu_ps(out + 8 * m, r);
    }
}

/* A lone act row (decode) is passed as the constant 1, so that its accumulators live in registers
 * rather than in the M-long arrays' stack slots (about 12% of 1.5B decode). */
#define KERNEL(T, NAME, BITS)                                                                                    \
    QW_TARGET_AVX2 static void r8_##NAME##_##BITS(const uint8_t *g, int64_t K, const uint8_t *xq, size_t xs, int64_t M, \
                                                  float *out) {                                                  \
        if (M == 1)                                                                                              \
            product(T, BITS, g, K, xq, xs, 1, out);                                                              \
        else                                                                                                     \
            product(T, BITS, g, K, xq, xs, M, out);                                                              \
    }
#define KERNELS(T, NAME) KERNEL(T, NAME, 8) KERNEL(T, NAME, 16)
KERNELS(QW_Q4_0, q4_0)
KERNELS(QW_Q4_1, q4_1)
KERNELS(QW_Q5_0, q5_0)
KERNELS(QW_Q5_1, q5_1)
KERNELS(QW_Q8_0, q8_0)
KERNELS(QW_Q4_K, q4_k)
KERNELS(QW_Q5_K, q5_k)
KERNELS(QW_Q6_K, q6_k)

qw_r8_fn qw_r8_kernel_avx2(int dtype, int bits) {
#define CASE(T, NAME) case T: return bits == 16 ? r8_##NAME##_16 : r8_##NAME##_8;
    switch (dtype) {
    CASE(QW_Q4_0, q4_0) CASE(QW_Q4_1, q4_1) CASE(QW_Q5_0, q5_0) CASE(QW_Q5_1, q5_1)
    CASE(QW_Q8_0, q8_0) CASE(QW_Q4_K, q4_k) CASE(QW_Q5_K, q5_k) CASE(QW_Q6_K, q6_k)
    default: return NULL;
    }
#undef CASE
}

#else
qw_r8_fn qw_r8_kernel_avx2(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}
#endif /* QW_HAVE_X86 */
