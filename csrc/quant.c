/* Row kernels for every weight storage type: see quant.h. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "cpu.h"

#if QW_HAVE_X86
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- scalar conversions */

float qw_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float qw_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t qw_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below the smallest normal f16: subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 + (112 - e) */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

/* ---------------------------------------------------------------- type table */

int qw_block_size(int dtype) {
    switch (dtype) {
    case QW_F32: case QW_F16: case QW_BF16: return 1;
    case QW_Q4_0: case QW_Q4_1: case QW_Q5_0: case QW_Q5_1: case QW_Q8_0: return 32;
    case QW_Q4_K: case QW_Q5_K: case QW_Q6_K: return 256;
    default: return 0;
    }
}

int qw_block_bytes(int dtype) {
    switch (dtype) {
    case QW_F32: return 4;
    case QW_F16: case QW_BF16: return 2;
    case QW_Q4_0: return 2 + 16;
    case QW_Q4_1: return 4 + 16;
    case QW_Q5_0: return 2 + 4 + 16;
    case QW_Q5_1: return 4 + 4 + 16;
    case QW_Q8_0: return 2 + 32;
    case QW_Q4_K: return 4 + 12 + 128;
    case QW_Q5_K: return 4 + 12 + 32 + 128;
    case QW_Q6_K: return 128 + 64 + 16 + 2;
    default: return 0;
    }
}

int qw_dtype_supported(int dtype) { return qw_block_size(dtype) > 0; }

size_t qw_row_bytes(int dtype, int64_t n) {
    int bs = qw_block_size(dtype);
    return bs ? (size_t)(n / bs) * (size_t)qw_block_bytes(dtype) : 0;
}

/* ---------------------------------------------------------------- float types: plain */

static void dequant_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void dequant_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = qw_f16_to_f32(s[i]);
}

static void dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = qw_bf16_to_f32(s[i]);
}

static float dot_f32(const void *row, const float *x, int64_t n) {
    const float *w = row;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += w[i + j] * x[i + j];
    float s = 0;
    for (; i < n; i++) s += w[i] * x[i];
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

static float dot_f16(const void *row, const float *x, int64_t n) {
    const uint16_t *w = row;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += qw_f16_to_f32(w[i + j]) * x[i + j];
    float s = 0;
    for (; i < n; i++) s += qw_f16_to_f32(w[i]) * x[i];
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

static float dot_bf16(const void *row, const float *x, int64_t n) {
    const uint16_t *w = row;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += qw_bf16_to_f32(w[i + j]) * x[i + j];
    float s = 0;
    for (; i < n; i++) s += qw_bf16_to_f32(w[i]) * x[i];
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

/* ---------------------------------------------------------------- float types: AVX2 */
#if QW_HAVE_X86

QW_TARGET_AVX2 static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

QW_TARGET_AVX2 static inline __m256 load_bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

QW_TARGET_AVX2 static inline __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

QW_TARGET_AVX2 static void dequant_f16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(s + i));
    for (; i < n; i++) dst[i] = qw_f16_to_f32(s[i]);
}

QW_TARGET_AVX2 static void dequant_bf16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(s + i));
    for (; i < n; i++) dst[i] = qw_bf16_to_f32(s[i]);
}

/* Four independent accumulators hide the FMA latency. */
#define QW_DOT_AVX2_BODY(LOAD)                                                              \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                            \
    int64_t i = 0;                                                                          \
    for (; i + 32 <= n; i += 32) {                                                          \
        a0 = _mm256_fmadd_ps(LOAD(w + i), _mm256_loadu_ps(x + i), a0);                     \
        a1 = _mm256_fmadd_ps(LOAD(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);             \
        a2 = _mm256_fmadd_ps(LOAD(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);           \
        a3 = _mm256_fmadd_ps(LOAD(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);           \
    }                                                                                       \
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOAD(w + i), _mm256_loadu_ps(x + i), a0); \
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));

QW_TARGET_AVX2 static float dot_f32_avx2(const void *row, const float *x, int64_t n) {
    const float *w = row;
    QW_DOT_AVX2_BODY(_mm256_loadu_ps)
    for (; i < n; i++) s += w[i] * x[i];
    return s;
}

QW_TARGET_AVX2 static float dot_f16_avx2(const void *row, const float *x, int64_t n) {
    const uint16_t *w = row;
    QW_DOT_AVX2_BODY(load_f16x8)
    for (; i < n; i++) s += qw_f16_to_f32(w[i]) * x[i];
    return s;
}

QW_TARGET_AVX2 static float dot_bf16_avx2(const void *row, const float *x, int64_t n) {
    const uint16_t *w = row;
    QW_DOT_AVX2_BODY(load_bf16x8)
    for (; i < n; i++) s += qw_bf16_to_f32(w[i]) * x[i];
    return s;
}

#endif /* QW_HAVE_X86 */

/* ---------------------------------------------------------------- dispatch */

void qw_dequant_row(int dtype, const void *src, float *dst, int64_t n) {
    int simd = qw_use_avx2();
    (void)simd;
    switch (dtype) {
    case QW_F32: dequant_f32(src, dst, n); return;
#if QW_HAVE_X86
    case QW_F16: if (simd) dequant_f16_avx2(src, dst, n); else dequant_f16(src, dst, n); return;
    case QW_BF16: if (simd) dequant_bf16_avx2(src, dst, n); else dequant_bf16(src, dst, n); return;
#else
    case QW_F16: dequant_f16(src, dst, n); return;
    case QW_BF16: dequant_bf16(src, dst, n); return;
#endif
    default: memset(dst, 0, (size_t)n * sizeof(float)); return;
    }
}

float qw_dot_row(int dtype, const void *row, const float *x, int64_t n) {
    int simd = qw_use_avx2();
    (void)simd;
    switch (dtype) {
#if QW_HAVE_X86
    case QW_F32: return simd ? dot_f32_avx2(row, x, n) : dot_f32(row, x, n);
    case QW_F16: return simd ? dot_f16_avx2(row, x, n) : dot_f16(row, x, n);
    case QW_BF16: return simd ? dot_bf16_avx2(row, x, n) : dot_bf16(row, x, n);
#else
    case QW_F32: return dot_f32(row, x, n);
    case QW_F16: return dot_f16(row, x, n);
    case QW_BF16: return dot_bf16(row, x, n);
#endif
    default: return 0.0f;
    }
}

void qw_quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    (void)src; (void)dst; (void)n; /* TODO(gguf): Q8_0 quantizer */
}
