/* Activation rows of the integer path (quant.h): float32 values rounded to 8-bit codes per 32
 * values (or to two 8-bit levels for 16 bits), with the block scales and code sums the dot
 * kernels need. The plain and AVX2 quantizers write the same bytes. */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "kernels.h"
#include "qblock.h"

#if QW_HAVE_X86
#include <immintrin.h>
#endif

/* The types with an integer dot (intdot.c). */
static int has_int_dot(int dtype) {
    switch (dtype) {
    case QW_Q4_0: case QW_Q4_1: case QW_Q5_0: case QW_Q5_1: case QW_Q8_0:
    case QW_Q4_K: case QW_Q5_K: case QW_Q6_K: return 1;
    default: return 0;
    }
}

size_t qw_act_bytes(int dtype, int64_t n, int bits) {
    if (!has_int_dot(dtype) || n % QK || (bits != 8 && bits != 16)) return 0;
    return bits == 16 ? 2 * ACT_HALF(n) : ACT_HALF(n);
}

/* Nearest integer, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits. */
static inline float round_even(float v) {
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

static int sum_codes(const int8_t *q, int len) {
    int s = 0;
    for (int j = 0; j < len; j++) s += q[j];
    return s;
}

static void quantize_act_plain(const float *x, void *dst, int64_t n) {
    int8_t *q = dst;
    float *d = (float *)(q + n), *s = d + n / QK;
    int16_t *bs = (int16_t *)(s + n / QK);
    for (int64_t i = 0; i < n / QK; i++, x += QK, q += QK) {
        uint32_t amax = 0;
        for (int j = 0; j < QK; j++) {
            uint32_t a = f32_bits(x[j]) & 0x7fffffffu;
            amax = a > amax ? a : amax;
        }
        float id;
        if (act_scale(amax, &d[i], &id))
            for (int j = 0; j < QK; j++) q[j] = (int8_t)(int)round_even(x[j] * id);
        else
            memset(q, 0, QK);
        bs[2 * i] = (int16_t)sum_codes(q, 16);
        bs[2 * i + 1] = (int16_t)sum_codes(q + 16, 16);
        s[i] = d[i] * (float)(bs[2 * i] + bs[2 * i + 1]);
    }
}

/* A 16-bit act row is two 8-bit act rows, level 1 then level 2 (see quant.h). With t = x / d:
 * q1 = round(t), q2 = round(256 (t - q1)) clamped to +-127, and level 2's scale is d / 256.
 * t - q1 and the product by 256 are exact in float32, so every path writes the same codes.
 * Level 2's s is the whole row's: (d / 256) (256 sum q1 + sum q2). */
static inline int8_t level2_code(float t, float a) {
    float r = round_even((t - a) * 256.0f);
    return (int8_t)(int)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
}

static void quantize_act16_plain(const float *x, void *dst, int64_t n) {
    int8_t *q = dst, *q2 = q + ACT_HALF(n);
    float *d = (float *)(q + n), *s = d + n / QK, *d2 = (float *)(q2 + n), *s2 = d2 + n / QK;
    int16_t *bs = (int16_t *)(s + n / QK), *bs2 = (int16_t *)(s2 + n / QK);
    for (int64_t i = 0; i < n / QK; i++, x += QK, q += QK, q2 += QK) {
        uint32_t amax = 0;
        for (int j = 0; j < QK; j++) {
            uint32_t a = f32_bits(x[j]) & 0x7fffffffu;
            amax = a > amax ? a : amax;
        }
        float id;
        if (act_scale(amax, &d[i], &id)) {
            for (int j = 0; j < QK; j++) {
                float t = x[j] * id, a = round_even(t);
                q[j] = (int8_t)(int)a;
                q2[j] = level2_code(t, a);
            }
        } else {
            memset(q, 0, QK);
            memset(q2, 0, QK);
        }
        d2[i] = d[i] * (1.0f / 256.0f);
        bs[2 * i] = (int16_t)sum_codes(q, 16);
        bs[2 * i + 1] = (int16_t)sum_codes(q + 16, 16);
        bs2[2 * i] = (int16_t)sum_codes(q2, 16);
        bs2[2 * i + 1] = (int16_t)sum_codes(q2 + 16, 16);
        s[i] = d[i] * (float)(bs[2 * i] + bs[2 * i + 1]);
        s2[i] = d2[i] * (float)(256 * (bs[2 * i] + bs[2 * i + 1]) + bs2[2 * i] + bs2[2 * i + 1]);
    }
}


/* ---------------------------------------------------------------- AVX2 */
#if QW_HAVE_X86

QW_TARGET_AVX2 static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

QW_TARGET_AVX2 static inline int hsum_i32(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4E));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xB1));
    return _mm_cvtsi128_si32(r);
}

/* The largest |x| bit pattern of 32 values. */
QW_TARGET_AVX2 static inline uint32_t amax_bits32(const float *x) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i m = _mm256_and_si256(load32(x), abs_mask);
    m = _mm256_max_epi32(m, _mm256_and_si256(load32(x + 8), abs_mask));
    m = _mm256_max_epi32(m, _mm256_and_si256(load32(x + 16), abs_mask));
    m = _mm256_max_epi32(m, _mm256_and_si256(load32(x + 24), abs_mask));
    __m128i r = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    r = _mm_max_epi32(r, _mm_shuffle_epi32(r, 0x4E));
    r = _mm_max_epi32(r, _mm_shuffle_epi32(r, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(r);
}

/* 32 codes round(x * id) (vcvtps2dq rounds to nearest even, as round_even) stored at q; the sums
 * of codes 0-15 and 16-31 in *lo, *hi. */
QW_TARGET_AVX2 static inline void quant32_avx2(const float *x, __m256 id, int8_t *q, int *lo, int *hi) {
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    /* packing works per 128-bit lane: dwords come out as a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 ... */
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, packed);
    *lo = hsum_i32(_mm256_add_epi32(a, b));
    *hi = hsum_i32(_mm256_add_epi32(c, d));
}

QW_TARGET_AVX2 static void quantize_act_avx2(const float *x, void *dst, int64_t n) {
    int8_t *q = dst;
    float *d = (float *)(q + n), *s = d + n / QK;
    int16_t *bs = (int16_t *)(s + n / QK);
    for (int64_t i = 0; i < n / QK; i++, x += QK, q += QK) {
        float id;
        int lo = 0, hi = 0;
        if (act_scale(amax_bits32(x), &d[i], &id))
            quant32_avx2(x, _mm256_set1_ps(id), q, &lo, &hi);
        else
            memset(q, 0, QK);
        bs[2 * i] = (int16_t)lo;
        bs[2 * i + 1] = (int16_t)hi;
        s[i] = d[i] * (float)(lo + hi);
    }
}

/* ---- products of one 32-value block with 32 activation codes: 8 int32 partial sums */


QW_TARGET_AVX2 static void quantize_act16_avx2(const float *x, void *dst, int64_t n) {
    int8_t *q = dst, *q2 = q + ACT_HALF(n);
    float *d = (float *)(q + n), *s = d + n / QK, *d2 = (float *)(q2 + n), *s2 = d2 + n / QK;
    int16_t *bs = (int16_t *)(s + n / QK), *bs2 = (int16_t *)(s2 + n / QK);
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n / QK; i++, x += QK, q += QK, q2 += QK) {
        float id;
        if (!act_scale(amax_bits32(x), &d[i], &id)) {
            memset(q, 0, QK);
            memset(q2, 0, QK);
            bs[2 * i] = bs[2 * i + 1] = bs2[2 * i] = bs2[2 * i + 1] = 0;
            d2[i] = d[i] * (1.0f / 256.0f);
            s[i] = s2[i] = d[i] * 0.0f;
            continue;
        }
        __m256 vid = _mm256_set1_ps(id);
        __m256i c1[4], c2[4];
        for (int k = 0; k < 4; k++) {
            __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid);
            __m256 a = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            c1[k] = _mm256_cvtps_epi32(a);
            __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(t, a), _mm256_set1_ps(256.0f)));
            c2[k] = _mm256_max_epi32(_mm256_min_epi32(r, lim), nlim);
        }
        __m256i p1 = _mm256_packs_epi16(_mm256_packs_epi32(c1[0], c1[1]), _mm256_packs_epi32(c1[2], c1[3]));
        __m256i p2 = _mm256_packs_epi16(_mm256_packs_epi32(c2[0], c2[1]), _mm256_packs_epi32(c2[2], c2[3]));
        _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p1, order));
        _mm256_storeu_si256((__m256i *)q2, _mm256_permutevar8x32_epi32(p2, order));
        int lo = hsum_i32(_mm256_add_epi32(c1[0], c1[1])), hi = hsum_i32(_mm256_add_epi32(c1[2], c1[3]));
        int lo2 = hsum_i32(_mm256_add_epi32(c2[0], c2[1])), hi2 = hsum_i32(_mm256_add_epi32(c2[2], c2[3]));
        bs[2 * i] = (int16_t)lo;
        bs[2 * i + 1] = (int16_t)hi;
        bs2[2 * i] = (int16_t)lo2;
        bs2[2 * i + 1] = (int16_t)hi2;
        d2[i] = d[i] * (1.0f / 256.0f);
        s[i] = d[i] * (float)(lo + hi);
        s2[i] = d2[i] * (float)(256 * (lo + hi) + lo2 + hi2);
    }
}

#endif /* QW_HAVE_X86 */

/* ---------------------------------------------------------------- pair rows (kernels.h) */

/* The plain reference of the pair rows (the pair kernels' own rows come straight from the float
 * rows, act_avx512.c): a's and b's bytes interleaved 4 at a time, then the offset fields. */
void qw_pair_act_rows(const uint8_t *a, const uint8_t *b, uint8_t *dst, int64_t n, int bits) {
    const size_t used = qw_act_bytes(QW_Q8_0, n, bits), half = ACT_HALF(n);
    for (size_t o = 0; o < used; o += 4) {
        memcpy(dst + 2 * o, a + o, 4);
        memcpy(dst + 2 * o + 4, b + o, 4);
    }
    for (int r = 0; r < 2; r++) {
        const uint8_t *x = r ? b : a;
        const int16_t *s1 = ACT_BSUMS(x, n), *s2 = ACT_BSUMS(x + half, n);
        const size_t field = (size_t)((const uint8_t *)s1 - x); /* of block 0, level 1 */
        for (int64_t i = 0; i < n / QK; i++) {
            uint8_t *f1 = dst + 2 * (field + 4 * (size_t)i) + 4 * (size_t)r, *f2 = f1 + 2 * half;
            if (bits == 16) {
                const int32_t lo = 256 * s1[2 * i] + s2[2 * i], hi = 256 * s1[2 * i + 1] + s2[2 * i + 1];
                const int32_t neg_lo = -lo, neg_all = -(lo + hi);
                memcpy(f1, &neg_lo, 4);
                memcpy(f2, &neg_all, 4);
            } else {
                const int16_t neg[2] = {(int16_t)-s1[2 * i], (int16_t)-s1[2 * i + 1]};
                memcpy(f1, neg, 4);
            }
        }
    }
}

/* ---------------------------------------------------------------- joined rows (kernels.h) */

void qw_join_act_rows(const uint8_t *x, uint8_t *dst, int64_t n) {
    const int8_t *q1 = (const int8_t *)x, *q2 = (const int8_t *)(x + ACT_HALF(n));
    int16_t *j = (int16_t *)dst;
    static const int order[4] = {0, 2, 1, 3};
    for (int64_t v = 0; v < n; v += 4)
        for (int t = 0; t < 4; t++) j[v + t] = (int16_t)(256 * q1[v + order[t]] + q2[v + order[t]]);
    memcpy(dst + 2 * (size_t)n, ACT_D(q2, n), 2 * sizeof(float) * (size_t)(n / QK)); /* d, then s */
}

void qw_vertical_act_rows(const uint8_t *joined, size_t stride, int rows, uint8_t *dst, int64_t n) {
    int32_t *p = (int32_t *)dst;
    float *d = (float *)(dst + 16 * (size_t)n), *s = d + 8 * (size_t)(n / QK);
    if (rows < 8) memset(dst, 0, VERT_BYTES(n)); /* the missing rows: zero codes, scales and sums */
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = joined + (size_t)r * stride;
        for (int64_t k = 0; k < n / 2; k++) memcpy(&p[8 * k + r], row + 4 * (size_t)k, 4); /* pair k */
        for (int64_t b = 0; b < n / QK; b++) {
            d[8 * b + r] = JOINED_D(row, n)[b];
            s[8 * b + r] = JOINED_S(row, n)[b];
        }
    }
}

/* ---------------------------------------------------------------- dispatch */

void qw_quantize_act(int dtype, const float *x, void *dst, int64_t n, int bits) {
    if (!qw_act_bytes(dtype, n, bits)) return;
#if QW_HAVE_X86
    if (qw_use_avx2()) {
        if (bits == 16)
            quantize_act16_avx2(x, dst, n);
        else
            quantize_act_avx2(x, dst, n);
        return;
    }
#endif
    if (bits == 16)
        quantize_act16_plain(x, dst, n);
    else
        quantize_act_plain(x, dst, n);
}

