/* What the fused act quantizers share (intdot_amx.c's into AMX blocks, act_avx512.c's into pair
 * rows): a block of 16 float rows at a time, with act.c's arithmetic. Included after the including
 * file has defined R8_TARGET (its target attribute) and INLINE, and included qblock.h. */
#ifndef QWENC_ACT_AVX512_H
#define QWENC_ACT_AVX512_H

/* 16 vectors reduced at once: lane m of the result is OP over the 16 lanes of the vector at
 * v[red_at[m]] (red_at is its own inverse), in 4 steps of two shuffles and OP where one vector's
 * reduction takes 4 shuffles and 4 OPs (the quantizer's three reductions a row were a third of
 * its work). Used where any order gives the same result: a max, and sums of whole numbers far
 * below 2^24. */
static const int red_at[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

R8_TARGET INLINE __m512 max_u32(__m512 a, __m512 b) {
    return _mm512_castsi512_ps(_mm512_max_epu32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

#define RED16(NAME, OP)                                                                                   \
    R8_TARGET INLINE __m512 NAME(const __m512 v[16]) {                                                    \
        __m512 t[8], u[4], w[2];                                                                          \
        for (int i = 0; i < 8; i++)                                                                       \
            t[i] = OP(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE)); \
        for (int i = 0; i < 4; i++)                                                                       \
            u[i] = OP(_mm512_shuffle_f32x4(t[i], t[i + 4], 0x88), _mm512_shuffle_f32x4(t[i], t[i + 4], 0xDD)); \
        for (int i = 0; i < 2; i++)                                                                       \
            w[i] = OP(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[i]), _mm512_castps_pd(u[i + 2]))), \
                      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[i]), _mm512_castps_pd(u[i + 2])))); \
        return OP(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));               \
    }
RED16(red16_max_u32, max_u32)
RED16(red16_add, _mm512_add_ps)

/* The largest |x| bit pattern of each lane over a block's two halves (x: its 32 values). */
R8_TARGET INLINE __m512 amax_halves(const float *x) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    const __m512i lo = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x)), abs_mask);
    const __m512i hi = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + 16)), abs_mask);
    return _mm512_castsi512_ps(_mm512_max_epu32(lo, hi));
}

/* qblock.h's act_scale for 16 rows at once (its cases and divisions; a change to one is a change
 * to both), from ab[red_at[m]] = amax_halves of row m: the same IEEE divisions, correctly rounded
 * in a vector as one at a time (32 scalar divisions a block were a bottleneck of their own).
 * Lane m of *dd is row m's d (NaN for a block with a non-finite value, 0 for a tiny one), of *idd
 * its 1 / d (0 for both); returns the rows whose blocks are finite. */
R8_TARGET INLINE __mmask16 act_scale16(const __m512 ab[16], __m512 *dd, __m512 *idd) {
    const __m512i am = _mm512_castps_si512(red16_max_u32(ab));
    const __mmask16 finite = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(0x7f800000), am); /* sign bits clear */
    const __m512 a = _mm512_castsi512_ps(am), zero = _mm512_setzero_ps();
    const __mmask16 big = finite & _mm512_cmp_ps_mask(a, _mm512_set1_ps(ACT_TINY), _CMP_GE_OQ);
    const __m512 d = _mm512_div_ps(a, _mm512_set1_ps(127.0f));
    *dd = _mm512_mask_mov_ps(_mm512_mask_mov_ps(_mm512_set1_ps(NAN), finite, zero), big, d);
    *idd = _mm512_maskz_mov_ps(big, _mm512_div_ps(_mm512_set1_ps(1.0f), d));
    return finite;
}

/* A finite block's codes at 1 / d = id (x: its 32 values), as floats, a half per vector: level 1's
 * round(t), t = x id (|t| <= 127 after act_scale16, so no clamp), and with two levels level 2's
 * round(256 (t - q1)) clamped to +-127 (t - q1 and the product are exact, act.c); zeros made +0,
 * the value an integer 0 gives (the bf16 AMX codes and the code sums' signs depend on it). */
R8_TARGET INLINE void act_levels(const float *x, __m512 id, int levels, __m512 l1[2], __m512 l2[2]) {
    const int near = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 zero = _mm512_setzero_ps();
    for (int h = 0; h < 2; h++) {
        const __m512 t = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * h), id);
        const __m512 a = _mm512_roundscale_ps(t, near);
        l1[h] = _mm512_add_ps(a, zero);
        if (levels == 2) {
            const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(t, a), _mm512_set1_ps(256.0f)), near);
            l2[h] = _mm512_add_ps(_mm512_max_ps(_mm512_min_ps(r, _mm512_set1_ps(127.0f)), _mm512_set1_ps(-127.0f)), zero);
        }
    }
}

/* 16 codes (whole-number floats within +-127) as bytes. */
R8_TARGET INLINE __m128i codes16(__m512 v) { return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)); }

#endif
