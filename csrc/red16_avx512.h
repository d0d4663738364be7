/* Reductions of 16 AVX-512 vectors at once, for the fused act quantizers (intdot_amx.c's for AMX
 * blocks, act_avx512.c's for pair rows). Included after the including file has defined R8_TARGET
 * (its target attribute) and INLINE. */
#ifndef QWENC_RED16_AVX512_H
#define QWENC_RED16_AVX512_H

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

#endif
