/* AVX-512 VNNI integer products on the row-interleaved layouts (intdot.c), in quant.h's one order.
 *
 * The same records as intdot_avx2.c's, two steps per 512-bit vector: its low half holds step s
 * (4 codes of each of the 8 rows), its high half step s + 1, and one vpdpbusd multiplies all 64
 * codes by the act codes broadcast to match (steps s, s + 1) and adds each row's 4-code products
 * into a 32-bit lane. The halves are added at the end of a block, so every block sum is the same
 * exact integer as on the AVX2 path, and the float work after it (one FMA per block) is the AVX2
 * path's, on 8 lanes: both paths give the same bits. vpdpbusd multiplies unsigned by signed bytes
 * without saturating; Q8_0's signed codes go in with 128 added (an XOR of the sign bit) and 128
 * times the act block's code sum comes off in integers.
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
#define QW_TARGET_AVX512
#define QW_BUILD_AVX512 1
#elif QW_HAVE_X86
#include <immintrin.h>
#define QW_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define QW_BUILD_AVX512 1
#else
#define QW_BUILD_AVX512 0
#endif

#if QW_BUILD_AVX512

#define INLINE __attribute__((always_inline)) static inline

QW_TARGET_AVX512 INLINE __m256i ld256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 32 bytes in both halves. */
QW_TARGET_AVX512 INLINE __m512i both_halves(const uint8_t *p) { return _mm512_broadcast_i64x4(ld256(p)); }

/* A 16-bit-lane count vector: `lo` in the low half, `hi` in the high half. */
QW_TARGET_AVX512 INLINE __m512i counts(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)lo)), _mm256_set1_epi16((short)hi), 1);
}

/* Bit `from` of each byte moved to bit `to`, per half (from / to differ between the halves);
 * 16-bit shifts are safe because only the target bit is kept, and it came from its own byte. */
QW_TARGET_AVX512 INLINE __m512i move_bits(__m512i v, int from_lo, int from_hi, int to, int mask) {
    int l_lo = to > from_lo ? to - from_lo : 0, r_lo = from_lo > to ? from_lo - to : 0;
    int l_hi = to > from_hi ? to - from_hi : 0, r_hi = from_hi > to ? from_hi - to : 0;
    v = _mm512_srlv_epi16(_mm512_sllv_epi16(v, counts(l_lo, l_hi)), counts(r_lo, r_hi));
    return _mm512_and_si512(v, _mm512_set1_epi8((char)mask));
}

/* c[v]: steps 2v (low half) and 2v + 1 (high half) of a block's low 4 bits. */
QW_TARGET_AVX512 INLINE void nibbles4(const uint8_t *nib, __m512i c[4]) {
    for (int v = 0; v < 4; v++)
        c[v] = _mm512_and_si512(_mm512_srlv_epi16(both_halves(nib + 32 * v), counts(0, 4)), _mm512_set1_epi8(0x0F));
}

QW_TARGET_AVX512 INLINE void fifth_bits4(const uint8_t *fifth, __m512i c[4]) {
    __m512i h = both_halves(fifth);
    for (int v = 0; v < 4; v++) c[v] = _mm512_or_si512(c[v], move_bits(h, 2 * v, 2 * v + 1, 4, 0x10));
}

/* Q6_K: bits 2t, 2t + 1 (t = s % 4) of high-bit vector s / 4 moved to bits 4, 5 of step s. */
QW_TARGET_AVX512 INLINE void high_bits4(const uint8_t *high, __m512i c[4]) {
    for (int v = 0; v < 4; v++) {
        int s = 2 * v, t = s % 4;
        c[v] = _mm512_or_si512(c[v], move_bits(both_halves(high + 32 * (s / 4)), 2 * t, 2 * t + 2, 4, 0x30));
    }
}

/* Act codes 8v .. 8v + 8: the first 4 to every row of the low half, the next 4 to the high. */
QW_TARGET_AVX512 INLINE __m512i act_pair(const int8_t *x) {
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_epi32(idx, _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)x)));
}

/* The 8 rows' sums of the 4 vectors from `first` on (2 per step pair), halves added. */
QW_TARGET_AVX512 INLINE __m256i dot_pairs(const __m512i *c, const int8_t *x, int first, int n) {
    __m512i acc = _mm512_setzero_si512();
    for (int v = first; v < first + n; v++) acc = _mm512_dpbusd_epi32(acc, c[v], act_pair(x + 8 * v));
    return _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
}

QW_TARGET_AVX512 INLINE __m256 f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

#define IS_K(T) ((T) == QW_Q4_K || (T) == QW_Q5_K || (T) == QW_Q6_K)

QW_TARGET_AVX512 INLINE void product(const int T, const int BITS, const uint8_t *g, int64_t K, const uint8_t *xq,
                                     size_t xstride, int64_t M, float *out) {
    const int bs = IS_K(T) ? 256 : 32, subs = bs / 32, levels = BITS == 16 ? 2 : 1;
    const int rb = T == QW_Q4_0 ? 144 : T == QW_Q4_1 ? 160 : T == QW_Q5_0 ? 176 : T == QW_Q5_1 ? 192 :
                   T == QW_Q8_0 ? 272 : T == QW_Q4_K ? 1184 : T == QW_Q5_K ? 1440 : 1680;
    const int has_min = T == QW_Q4_1 || T == QW_Q5_1 || T == QW_Q4_K || T == QW_Q5_K;
    const size_t half = ACT_HALF(K);
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
            __m512i c[4];
            __m256i sa = _mm256_set1_epi32(1), sb = sa;
            switch (T) {
            case QW_Q4_0: case QW_Q4_1: nibbles4(rec + (T == QW_Q4_0 ? 16 : 32), c); break;
            case QW_Q5_0: nibbles4(rec + 48, c); fifth_bits4(rec + 16, c); break;
            case QW_Q5_1: nibbles4(rec + 64, c); fifth_bits4(rec + 32, c); break;
            case QW_Q8_0:
                for (int v = 0; v < 4; v++)
                    c[v] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(rec + 16 + 64 * v)), _mm512_set1_epi8((char)0x80));
                break;
            case QW_Q4_K: case QW_Q5_K:
                if (T == QW_Q4_K)
                    nibbles4(rec + 160 + 128 * j, c);
                else {
                    nibbles4(rec + 416 + 128 * j, c);
                    fifth_bits4(rec + 160 + 32 * j, c);
                }
                sa = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 32 + 8 * j)));
                Mv = _mm256_mul_ps(Dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 96 + 8 * j)))));
                break;
            default: { /* Q6_K: (sc_a, sc_b) per row as 16-bit pairs */
                nibbles4(rec + 656 + 128 * j, c);
                high_bits4(rec + 144 + 64 * j, c);
                __m256i ab = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + 16 + 16 * j)));
                sa = _mm256_srai_epi32(_mm256_slli_epi32(ab, 16), 16);
                sb = _mm256_srai_epi32(ab, 16);
            }
            }
            for (int64_t m = 0; m < M; m++) {
                const int8_t *row = (const int8_t *)(xq + (size_t)m * xstride);
                for (int lv = 0; lv < levels; lv++) {
                    const int8_t *xl = row + (size_t)lv * half, *x = xl + 32 * b;
                    const int16_t *bsum = ACT_BSUMS(xl, K) + 2 * b;
                    __m256i isum;
                    if (T == QW_Q6_K) {
                        __m256i offs = _mm256_add_epi32(_mm256_mullo_epi32(sa, _mm256_set1_epi32(bsum[0])),
                                                        _mm256_mullo_epi32(sb, _mm256_set1_epi32(bsum[1])));
                        isum = _mm256_add_epi32(_mm256_mullo_epi32(dot_pairs(c, x, 0, 2), sa),
                                             _mm256_mullo_epi32(dot_pairs(c, x, 2, 2), sb));
                        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(offs, 5));
                    } else {
                        isum = dot_pairs(c, x, 0, 4);
                        if (T == QW_Q4_K || T == QW_Q5_K) isum = _mm256_mullo_epi32(isum, sa);
                        const int off = T == QW_Q4_0 ? 8 : T == QW_Q5_0 ? 16 : T == QW_Q8_0 ? 128 : 0;
                        if (off) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off * (bsum[0] + bsum[1])));
                    }
                    __m256 ddx = _mm256_mul_ps(D, _mm256_broadcast_ss(ACT_D(xl, K) + b));
                    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), ddx, acc[m]);
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
 * rather than in the M-long arrays' stack slots (as in intdot_avx2.c; not timed on such a CPU). */
#define KERNEL(T, NAME, BITS)                                                                                   \
    QW_TARGET_AVX512 static void r8_##NAME##_##BITS(const uint8_t *g, int64_t K, const uint8_t *xq, size_t xs,   \
                                                    int64_t M, float *out) {                                    \
        if (M == 1)                                                                                             \
            product(T, BITS, g, K, xq, xs, 1, out);                                                             \
        else                                                                                                    \
            product(T, BITS, g, K, xq, xs, M, out);                                                             \
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

qw_r8_fn qw_r8_kernel_avx512(int dtype, int bits) {
#define CASE(T, NAME) case T: return bits == 16 ? r8_##NAME##_16 : r8_##NAME##_8;
    switch (dtype) {
    CASE(QW_Q4_0, q4_0) CASE(QW_Q4_1, q4_1) CASE(QW_Q5_0, q5_0) CASE(QW_Q5_1, q5_1)
    CASE(QW_Q8_0, q8_0) CASE(QW_Q4_K, q4_k) CASE(QW_Q5_K, q5_k) CASE(QW_Q6_K, q6_k)
    default: return NULL;
    }
#undef CASE
}

#else
qw_r8_fn qw_r8_kernel_avx512(int dtype, int bits) {
    (void)dtype;
    (void)bits;
    return NULL;
}
#endif
