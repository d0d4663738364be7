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

/* ---------------------------------------------------------------- block layouts
 *
 * Block-quantized rows (GGML layouts; all multi-byte fields little-endian, blocks packed with no
 * padding, so fields are read with memcpy rather than through casts):
 *   Q4_0  [d:f16][qs:16]            32 values d * (q - 8); value j < 16 is the low nibble of
 *                                   qs[j], value j + 16 its high nibble.
 *   Q4_1  [d:f16][m:f16][qs:16]     d * q + m, nibbles as Q4_0.
 *   Q5_0  [d:f16][qh:u32][qs:16]    d * (q - 16), q = nibble | (bit j of qh) << 4.
 *   Q5_1  [d:f16][m:f16][qh:u32][qs:16]   d * q + m.
 *   Q8_0  [d:f16][qs:i8 x 32]       d * q.
 *   Q4_K  [d:f16][dmin:f16][scales:12][qs:128]   256 values in 8 sub-blocks of 32, each with a
 *         6-bit scale sc and min m: d * sc * q - dmin * m. qs holds 4 chunks of 32 bytes; chunk c
 *         carries sub-block 2c in its low nibbles and 2c + 1 in its high nibbles.
 *   Q5_K  [d][dmin][scales:12][qh:32][qs:128]    as Q4_K plus a fifth bit: sub-block j takes bit j
 *         of qh[l] for its value l.
 *   Q6_K  [ql:128][qh:64][scales:i8 x 16][d:f16] 256 values d * sc * (q - 32), 16 per scale. Each
 *         half h of 128 values uses ql[64h..64h+64) and qh[32h..32h+32); its value 32k + l
 *         (k < 4, l < 32) has low bits from ql[64h + l + 32 (k & 1)] (low nibble for k < 2, high
 *         for k >= 2) and high bits (qh[32h + l] >> 2k) & 3.
 *
 * The dequantizers evaluate each value with the same operations in the same order as the
 * reference formula (e.g. (d * sc) * q - dmin * m, no fused multiply-add), so both paths give the
 * reference's float32 bit for bit. The dot kernels are free to regroup: they sum q * x per
 * (sub-)block and scale the sum once, or form a value's weight by one FMA where there is a min
 * to subtract; they agree with the float64 dot of the dequantized row to float32 rounding.
 */

enum { QK = 32, QKK = 256 };

static inline uint16_t rd_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float rd_f16(const uint8_t *p) { return qw_f16_to_f32(rd_u16(p)); }

/* Q4_K/Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes. The first four
 * sub-blocks keep theirs in the low 6 bits of bytes j and j + 4; the last four split theirs into a
 * nibble of byte j + 4 and the top two bits of bytes j - 4 (scale) and j (min). */
static inline void kquant_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Tables indexed by a byte of Q5 high bits, built at compile time: QW_ROWS256(R) expands to
 * R(0), R(1), ..., R(255). */
#define QW_BIT(b, i) (((b) >> (i)) & 1)
#define QW_ROWS4(R, b) R(b), R((b) + 1), R((b) + 2), R((b) + 3)
#define QW_ROWS16(R, b) QW_ROWS4(R, b), QW_ROWS4(R, (b) + 4), QW_ROWS4(R, (b) + 8), QW_ROWS4(R, (b) + 12)
#define QW_ROWS64(R, b) QW_ROWS16(R, b), QW_ROWS16(R, (b) + 16), QW_ROWS16(R, (b) + 32), QW_ROWS16(R, (b) + 48)
#define QW_ROWS256(R) QW_ROWS64(R, 0), QW_ROWS64(R, 64), QW_ROWS64(R, 128), QW_ROWS64(R, 192)

/* Byte i of row b is bit i of b moved to bit 4 (the fifth bit of a Q5 code). */
#define QW_BIT4_ROW(b) {QW_BIT(b, 0) << 4, QW_BIT(b, 1) << 4, QW_BIT(b, 2) << 4, QW_BIT(b, 3) << 4, \
    QW_BIT(b, 4) << 4, QW_BIT(b, 5) << 4, QW_BIT(b, 6) << 4, QW_BIT(b, 7) << 4}
static const uint8_t q5_bit4[256][8] = {QW_ROWS256(QW_BIT4_ROW)};

/* Q6_K: the 6-bit code (0..63) of value 32k + l of half h (see the layout above). */
static inline int q6k_code(const uint8_t *ql, const uint8_t *qh, int k, int l) {
    int lo = ql[l + 32 * (k & 1)];
    lo = (k < 2) ? (lo & 0x0F) : (lo >> 4);
    return lo | (((qh[l] >> (2 * k)) & 3) << 4);
}

/* ---------------------------------------------------------------- block types: plain
 *
 * Blocks are first unpacked into their small integer codes (simple loops that compilers vectorize
 * for whatever SIMD the target has), then widened: scaled for dequantization, or dotted with x
 * using 8 separate partial sums, which keeps the float additions independent and vectorizable. */

/* Codes of a 32-value nibble block (low nibbles, then high nibbles), minus `offset`. */
static inline void unpack_nibbles(const uint8_t *qs, int offset, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((qs[j] & 0x0F) - offset);
        q[j + 16] = (int8_t)((qs[j] >> 4) - offset);
    }
}

/* The same with Q5's fifth bits from the 4 bytes at qh, 8 codes at a time in 64-bit words. */
static inline void unpack_nibbles5(const uint8_t *qs, const uint8_t *qh, int offset, int8_t *q) {
    const uint64_t low4 = 0x0F0F0F0F0F0F0F0FULL;
    for (int k = 0; k < 2; k++) {
        uint64_t w, hlo, hhi;
        memcpy(&w, qs + 8 * k, 8);
        memcpy(&hlo, q5_bit4[qh[k]], 8);
        memcpy(&hhi, q5_bit4[qh[k + 2]], 8);
        uint64_t lo = (w & low4) | hlo, hi = ((w >> 4) & low4) | hhi;
        for (int j = 0; j < 8; j++) {
            q[8 * k + j] = (int8_t)((int)((lo >> (8 * j)) & 0xFF) - offset);
            q[16 + 8 * k + j] = (int8_t)((int)((hi >> (8 * j)) & 0xFF) - offset);
        }
    }
}

/* Q4_K/Q5_K codes (0..31) of sub-block j; qh is NULL for Q4_K. */
static inline void unpack_kquant(const uint8_t *qs, const uint8_t *qh, int j, int8_t *q) {
    const uint8_t *v = qs + 32 * (j / 2);
    int shift = 4 * (j & 1);
    for (int l = 0; l < 32; l++) q[l] = (int8_t)((v[l] >> shift) & 0x0F);
    if (qh)
        for (int l = 0; l < 32; l++) q[l] = (int8_t)(q[l] | ((qh[l] >> j) & 1) << 4);
}

/* Q6_K codes minus 32 of a whole super-block. */
static inline void unpack_q6_k(const uint8_t *b, int8_t *q) {
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++)
                q[128 * h + 32 * k + l] = (int8_t)(q6k_code(b + 64 * h, b + 128 + 32 * h, k, l) - 32);
}

/* y = d * q + m over 32 codes (separate multiply and add, as the reference; m = 0 is not used
 * for the scale-only types because d * q + 0 turns a -0 product into +0). */
static inline void scale_codes(const int8_t *q, float d, float *y) {
    for (int j = 0; j < QK; j++) y[j] = d * (float)q[j];
}

static inline void affine_codes(const int8_t *q, float d, float m, float *y) {
    for (int j = 0; j < QK; j++) y[j] = d * (float)q[j] + m;
}

static void dequant_q4_0(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    int8_t q[QK];
    for (int64_t i = 0; i < n; i += QK, b += 18, y += QK) {
        unpack_nibbles(b + 2, 8, q);
        scale_codes(q, rd_f16(b), y);
    }
}

static void dequant_q4_1(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    int8_t q[QK];
    for (int64_t i = 0; i < n; i += QK, b += 20, y += QK) {
        unpack_nibbles(b + 4, 0, q);
        affine_codes(q, rd_f16(b), rd_f16(b + 2), y);
    }
}

static void dequant_q5_0(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    int8_t q[QK];
    for (int64_t i = 0; i < n; i += QK, b += 22, y += QK) {
        unpack_nibbles5(b + 6, b + 2, 16, q);
        scale_codes(q, rd_f16(b), y);
    }
}

static void dequant_q5_1(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    int8_t q[QK];
    for (int64_t i = 0; i < n; i += QK, b += 24, y += QK) {
        unpack_nibbles5(b + 8, b + 4, 0, q);
        affine_codes(q, rd_f16(b), rd_f16(b + 2), y);
    }
}

static void dequant_q8_0(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 34, y += QK) scale_codes((const int8_t *)(b + 2), rd_f16(b), y);
}

/* Q4_K/Q5_K: (d * sc) * q - (dmin * m), the reference's grouping. */
static void dequant_kquant_4_5(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, float *y) {
    float d = rd_f16(b), dmin = rd_f16(b + 2);
    int8_t q[32];
    for (int j = 0; j < 8; j++, y += 32) {
        int sc, m;
        kquant_scale_min(b + 4, j, &sc, &m);
        unpack_kquant(qs, qh, j, q);
        /* - ml as + (-ml): IEEE subtraction is defined as that addition */
        affine_codes(q, d * (float)sc, -(dmin * (float)m), y);
    }
}

static void dequant_q4_k(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QKK, b += 144, y += QKK) dequant_kquant_4_5(b, b + 16, NULL, y);
}

static void dequant_q5_k(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QKK, b += 176, y += QKK) dequant_kquant_4_5(b, b + 48, b + 16, y);
}

static void dequant_q6_k(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    int8_t q[QKK];
    for (int64_t i = 0; i < n; i += QKK, b += 210) {
        float d = rd_f16(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        unpack_q6_k(b, q);
        for (int g = 0; g < 16; g++, y += 16) {
            float dl = d * (float)sc[g];
            for (int l = 0; l < 16; l++) y[l] = dl * (float)q[16 * g + l];
        }
    }
}

/* sum over n (a multiple of 16) of q[i] * x[i]. */
static inline float dot_codes(const int8_t *q, const float *x, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i += 16) {
        float qf[16];
        for (int j = 0; j < 16; j++) qf[j] = (float)q[i + j];
        for (int k = 0; k < 8; k++) acc[k] += qf[k] * x[i + k] + qf[k + 8] * x[i + k + 8];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static inline float sum_f32(const float *x, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += x[i + j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static float dot_q4_0(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    int8_t q[QK];
    float s = 0;
    for (int64_t i = 0; i < n; i += QK, b += 18, x += QK) {
        unpack_nibbles(b + 2, 8, q);
        s += rd_f16(b) * dot_codes(q, x, QK);
    }
    return s;
}

static float dot_q4_1(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    int8_t q[QK];
    float s = 0;
    for (int64_t i = 0; i < n; i += QK, b += 20, x += QK) {
        unpack_nibbles(b + 4, 0, q);
        s += rd_f16(b) * dot_codes(q, x, QK) + rd_f16(b + 2) * sum_f32(x, QK);
    }
    return s;
}

static float dot_q5_0(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    int8_t q[QK];
    float s = 0;
    for (int64_t i = 0; i < n; i += QK, b += 22, x += QK) {
        unpack_nibbles5(b + 6, b + 2, 16, q);
        s += rd_f16(b) * dot_codes(q, x, QK);
    }
    return s;
}

static float dot_q5_1(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    int8_t q[QK];
    float s = 0;
    for (int64_t i = 0; i < n; i += QK, b += 24, x += QK) {
        unpack_nibbles5(b + 8, b + 4, 0, q);
        s += rd_f16(b) * dot_codes(q, x, QK) + rd_f16(b + 2) * sum_f32(x, QK);
    }
    return s;
}

static float dot_q8_0(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    float s = 0;
    for (int64_t i = 0; i < n; i += QK, b += 34, x += QK) s += rd_f16(b) * dot_codes((const int8_t *)(b + 2), x, QK);
    return s;
}

/* Q4_K and Q5_K share everything but the fifth bit: qh is NULL for Q4_K. */
static float dot_kquant_4_5(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, const float *x) {
    float d = rd_f16(b), dmin = rd_f16(b + 2), s = 0;
    int8_t q[32];
    for (int j = 0; j < 8; j++, x += 32) {
        int sc, m;
        kquant_scale_min(b + 4, j, &sc, &m);
        unpack_kquant(qs, qh, j, q);
        s += d * (float)sc * dot_codes(q, x, 32) - dmin * (float)m * sum_f32(x, 32);
    }
    return s;
}

static float dot_q4_k(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    float s = 0;
    for (int64_t i = 0; i < n; i += QKK, b += 144, x += QKK) s += dot_kquant_4_5(b, b + 16, NULL, x);
    return s;
}

static float dot_q5_k(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    float s = 0;
    for (int64_t i = 0; i < n; i += QKK, b += 176, x += QKK) s += dot_kquant_4_5(b, b + 48, b + 16, x);
    return s;
}

static float dot_q6_k(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    int8_t q[QKK];
    float s = 0;
    for (int64_t i = 0; i < n; i += QKK, b += 210, x += QKK) {
        const int8_t *sc = (const int8_t *)(b + 192);
        unpack_q6_k(b, q);
        float bs = 0;
        for (int g = 0; g < 16; g++) bs += (float)sc[g] * dot_codes(q + 16 * g, x + 16 * g, 16);
        s += rd_f16(b + 208) * bs;
    }
    return s;
}

/* ---------------------------------------------------------------- block types: AVX2
 *
 * Dequantizers unpack a block with byte-wide integer SIMD into its 32 codes (one __m256i in value
 * order), widen them 8 at a time to float and scale them with a separate multiply (and add), as
 * the reference does. The dot kernels, which decode runs on, are further down.
 */
#if QW_HAVE_X86

QW_TARGET_AVX2 static inline float f16_avx2(const uint8_t *p) { return _cvtsh_ss(rd_u16(p)); }

/* The low 8 signed bytes of v as 8 floats. */
QW_TARGET_AVX2 static inline __m256 s8x8_ps(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

/* y[0..32) = d * q + m for 32 signed bytes q, as a separate multiply and add: no FMA, so the
 * rounding is the reference formula's. */
QW_TARGET_AVX2 static inline void store32_affine(__m256i q, __m256 d, __m256 m, float *y) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i parts[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(y + 8 * k, _mm256_add_ps(_mm256_mul_ps(s8x8_ps(parts[k]), d), m));
}

/* y[0..32) = d * q (exactly the reference product, sign of zero included). */
QW_TARGET_AVX2 static inline void store32_scaled(__m256i q, __m256 d, float *y) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i parts[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(s8x8_ps(parts[k]), d));
}

/* 16 packed bytes -> 32 nibbles in value order: low nibbles first, then high nibbles. */
QW_TARGET_AVX2 static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}

/* A 32-bit word spread over 32 bytes: byte i is 0xFF when bit i is set, else 0. Each byte first
 * receives the word's byte i / 8, then keeps only its own bit. */
QW_TARGET_AVX2 static inline __m256i bits32_mask(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, select), select);
}

/* Signed codes q - 8 of a Q4_0 block. */
QW_TARGET_AVX2 static inline __m256i codes_q4_0(const uint8_t *b) {
    return _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8));
}

/* Signed codes q - 16 of a Q5_0 block: a clear fifth bit means nibble - 16, i.e. the nibble with
 * the top four bits of the byte set. */
QW_TARGET_AVX2 static inline __m256i codes_q5_0(const uint8_t *b) {
    __m256i high = bits32_mask(rd_u32(b + 2));
    return _mm256_or_si256(nibbles32(b + 6), _mm256_andnot_si256(high, _mm256_set1_epi8((char)0xF0)));
}

/* Unsigned codes 0..31 of a Q5_1 block. */
QW_TARGET_AVX2 static inline __m256i codes_q5_1(const uint8_t *b) {
    __m256i high = bits32_mask(rd_u32(b + 4));
    return _mm256_or_si256(nibbles32(b + 8), _mm256_and_si256(high, _mm256_set1_epi8(0x10)));
}

QW_TARGET_AVX2 static void dequant_q4_0_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 18, y += QK)
        store32_scaled(codes_q4_0(b), _mm256_set1_ps(f16_avx2(b)), y);
}

QW_TARGET_AVX2 static void dequant_q4_1_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 20, y += QK)
        store32_affine(nibbles32(b + 4), _mm256_set1_ps(f16_avx2(b)), _mm256_set1_ps(f16_avx2(b + 2)), y);
}

QW_TARGET_AVX2 static void dequant_q5_0_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 22, y += QK)
        store32_scaled(codes_q5_0(b), _mm256_set1_ps(f16_avx2(b)), y);
}

QW_TARGET_AVX2 static void dequant_q5_1_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 24, y += QK)
        store32_affine(codes_q5_1(b), _mm256_set1_ps(f16_avx2(b)), _mm256_set1_ps(f16_avx2(b + 2)), y);
}

QW_TARGET_AVX2 static void dequant_q8_0_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 34, y += QK)
        store32_scaled(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_ps(f16_avx2(b)), y);
}

/* Q4_K/Q5_K: the 8 (d * sc) and (dmin * m) of a super-block, as the reference computes them. */
QW_TARGET_AVX2 static inline void kquant_scales(const uint8_t *b, float *dl, float *ml) {
    float d = f16_avx2(b), dmin = f16_avx2(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kquant_scale_min(b + 4, j, &sc, &m);
        dl[j] = d * (float)sc;
        ml[j] = dmin * (float)m;
    }
}

/* Q4_K/Q5_K codes of sub-blocks 2c (*lo) and 2c + 1 (*hi); qh is NULL for Q4_K. */
QW_TARGET_AVX2 static inline void kquant_codes(const uint8_t *qs, const uint8_t *qh, int c, __m256i *lo, __m256i *hi) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
    *lo = _mm256_and_si256(v, low4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    if (qh) {
        /* bit 2c (and 2c + 1) of each qh byte moved to bit 4; 16-bit shifts are safe because
         * the mask keeps only bit 4 of each byte, which came from the same byte */
        const __m256i bit4 = _mm256_set1_epi8(0x10);
        __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        __m256i h_lo, h_hi;
        switch (c) {
        case 0: h_lo = _mm256_slli_epi16(h, 4); h_hi = _mm256_slli_epi16(h, 3); break;
        case 1: h_lo = _mm256_slli_epi16(h, 2); h_hi = _mm256_slli_epi16(h, 1); break;
        case 2: h_lo = h; h_hi = _mm256_srli_epi16(h, 1); break;
        default: h_lo = _mm256_srli_epi16(h, 2); h_hi = _mm256_srli_epi16(h, 3); break;
        }
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(h_lo, bit4));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(h_hi, bit4));
    }
}

QW_TARGET_AVX2 static void dequant_kquant_4_5_avx2(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, float *y) {
    float dl[8], ml[8];
    kquant_scales(b, dl, ml);
    for (int c = 0; c < 4; c++, y += 64) {
        __m256i lo, hi;
        kquant_codes(qs, qh, c, &lo, &hi);
        /* - ml as + (-ml): IEEE subtraction is defined as that addition */
        store32_affine(lo, _mm256_set1_ps(dl[2 * c]), _mm256_set1_ps(-ml[2 * c]), y);
        store32_affine(hi, _mm256_set1_ps(dl[2 * c + 1]), _mm256_set1_ps(-ml[2 * c + 1]), y + 32);
    }
}

QW_TARGET_AVX2 static void dequant_q4_k_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QKK, b += 144, y += QKK) dequant_kquant_4_5_avx2(b, b + 16, NULL, y);
}

QW_TARGET_AVX2 static void dequant_q5_k_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QKK, b += 176, y += QKK) dequant_kquant_4_5_avx2(b, b + 48, b + 16, y);
}

/* Q6_K signed codes (q - 32) of values 32k .. 32k + 32 of one half (ql, qh as in the layout). */
QW_TARGET_AVX2 static inline __m256i q6k_codes(const uint8_t *ql, const uint8_t *qh, int k) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * (k & 1)));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    if (k >= 2) l = _mm256_srli_epi16(l, 4);
    /* move bits 2k, 2k + 1 of each qh byte to bits 4, 5 (the mask drops what crossed bytes) */
    switch (k) {
    case 0: h = _mm256_slli_epi16(h, 4); break;
    case 1: h = _mm256_slli_epi16(h, 2); break;
    case 2: break;
    default: h = _mm256_srli_epi16(h, 2); break;
    }
    __m256i q = _mm256_or_si256(_mm256_and_si256(l, low4), _mm256_and_si256(h, bits45));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
}

QW_TARGET_AVX2 static void dequant_q6_k_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QKK, b += 210) {
        float d = f16_avx2(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++, y += 32) {
                __m256i q = q6k_codes(b + 64 * h, b + 128 + 32 * h, k);
                __m256 d0 = _mm256_set1_ps(d * (float)sc[8 * h + 2 * k]);
                __m256 d1 = _mm256_set1_ps(d * (float)sc[8 * h + 2 * k + 1]);
                /* the two 16-value halves have their own scales */
                __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
                _mm256_storeu_ps(y, _mm256_mul_ps(s8x8_ps(lo), d0));
                _mm256_storeu_ps(y + 8, _mm256_mul_ps(s8x8_ps(_mm_unpackhi_epi64(lo, lo)), d0));
                _mm256_storeu_ps(y + 16, _mm256_mul_ps(s8x8_ps(hi), d1));
                _mm256_storeu_ps(y + 24, _mm256_mul_ps(s8x8_ps(_mm_unpackhi_epi64(hi, hi)), d1));
            }
    }
}

/* ---- dot kernels
 *
 * These work on 8 values per 32-bit lane vector: bytes are widened to dwords straight from memory
 * (one vpmovzxbd/vpmovsxbd each), and nibbles and high bits are separated afterwards with shifts
 * and masks, which run on any vector pipe, rather than with the byte shuffles the dequantizers
 * use, which compete for the two shuffle pipes with the widening itself. */

/* 8 bytes at p widened to 8 dwords (zero- or sign-extended). */
QW_TARGET_AVX2 static inline __m256i u8x8_epi32(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

QW_TARGET_AVX2 static inline __m256i s8x8_epi32(const uint8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* An f16 scale broadcast to 8 floats. */
QW_TARGET_AVX2 static inline __m256 f16_bcast(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_set1_epi16((short)rd_u16(p)));
}

/* Q5_0/Q5_1 fifth bits, a byte of qh at a time, as dword values to OR into 8 nibbles: for Q5_0
 * (signed codes q - 16) entry i is 0 when bit i is set and -16 (all bits above the nibble) when
 * it is clear; for Q5_1 (unsigned codes) it is 16 when set, else 0. A table load costs less than
 * isolating 8 bits in 8 lanes. */
#define QW_Q5_0_OFF(b, i) (QW_BIT(b, i) ? 0 : -16)
#define QW_Q5_0_ROW(b) {QW_Q5_0_OFF(b, 0), QW_Q5_0_OFF(b, 1), QW_Q5_0_OFF(b, 2), QW_Q5_0_OFF(b, 3), \
    QW_Q5_0_OFF(b, 4), QW_Q5_0_OFF(b, 5), QW_Q5_0_OFF(b, 6), QW_Q5_0_OFF(b, 7)}

static _Alignas(32) const int32_t q5_0_high[256][8] = {QW_ROWS256(QW_Q5_0_ROW)};
static _Alignas(32) const int32_t q5_1_high[256][8] = {QW_ROWS256(QW_BIT4_ROW)};

QW_TARGET_AVX2 static inline __m256i high_bits(const int32_t (*table)[8], uint8_t byte) {
    return _mm256_load_si256((const __m256i *)table[byte]);
}

/* The four 8-value code vectors of a 32-value nibble block (values 0-7, 8-15, 16-23, 24-31):
 * low nibbles of qs[0..16) then high nibbles. */
QW_TARGET_AVX2 static inline void nibble_codes(const uint8_t *qs, __m256i c[4]) {
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    __m256i v0 = u8x8_epi32(qs), v1 = u8x8_epi32(qs + 8);
    c[0] = _mm256_and_si256(v0, low4);
    c[1] = _mm256_and_si256(v1, low4);
    c[2] = _mm256_srli_epi32(v0, 4);
    c[3] = _mm256_srli_epi32(v1, 4);
}

/* sum over 32 values of c * x, as 8 partial sums (two chains). */
QW_TARGET_AVX2 static inline __m256 dot4x8(const __m256i c[4], const float *x) {
    __m256 a = _mm256_mul_ps(_mm256_cvtepi32_ps(c[0]), _mm256_loadu_ps(x));
    __m256 b = _mm256_mul_ps(_mm256_cvtepi32_ps(c[1]), _mm256_loadu_ps(x + 8));
    a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[2]), _mm256_loadu_ps(x + 16), a);
    b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[3]), _mm256_loadu_ps(x + 24), b);
    return _mm256_add_ps(a, b);
}

/* sum over 32 values of (d * c + m) * x: the weights formed by FMA, then dotted. */
QW_TARGET_AVX2 static inline __m256 dot4x8_affine(const __m256i c[4], __m256 d, __m256 m, const float *x) {
    __m256 a = _mm256_mul_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(c[0]), d, m), _mm256_loadu_ps(x));
    __m256 b = _mm256_mul_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(c[1]), d, m), _mm256_loadu_ps(x + 8));
    a = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(c[2]), d, m), _mm256_loadu_ps(x + 16), a);
    b = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(c[3]), d, m), _mm256_loadu_ps(x + 24), b);
    return _mm256_add_ps(a, b);
}

QW_TARGET_AVX2 static inline void codes_q4_0_dw(const uint8_t *b, __m256i c[4]) {
    const __m256i eight = _mm256_set1_epi32(8);
    nibble_codes(b + 2, c);
    for (int k = 0; k < 4; k++) c[k] = _mm256_sub_epi32(c[k], eight);
}

QW_TARGET_AVX2 static inline void codes_q5_0_dw(const uint8_t *b, __m256i c[4]) {
    nibble_codes(b + 6, c);
    for (int k = 0; k < 4; k++) c[k] = _mm256_or_si256(c[k], high_bits(q5_0_high, b[2 + k]));
}

QW_TARGET_AVX2 static inline void codes_q8_0_dw(const uint8_t *b, __m256i c[4]) {
    for (int k = 0; k < 4; k++) c[k] = s8x8_epi32(b + 2 + 8 * k);
}

/* The scale-only 32-value types share one loop: two blocks per step into two accumulators. */
#define QW_DOT32_AVX2(NAME, BYTES, CODES)                                                      \
    QW_TARGET_AVX2 static float NAME(const void *row, const float *x, int64_t n) {            \
        const uint8_t *b = row;                                                                \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;                                        \
        __m256i c[4];                                                                          \
        int64_t nb = n / QK, i = 0;                                                            \
        for (; i + 2 <= nb; i += 2, b += 2 * (BYTES), x += 2 * QK) {                           \
            CODES(b, c);                                                                       \
            acc0 = _mm256_fmadd_ps(dot4x8(c, x), f16_bcast(b), acc0);                          \
            CODES(b + (BYTES), c);                                                             \
            acc1 = _mm256_fmadd_ps(dot4x8(c, x + QK), f16_bcast(b + (BYTES)), acc1);           \
        }                                                                                      \
        if (i < nb) {                                                                          \
            CODES(b, c);                                                                       \
            acc0 = _mm256_fmadd_ps(dot4x8(c, x), f16_bcast(b), acc0);                          \
        }                                                                                      \
        return hsum256(_mm256_add_ps(acc0, acc1));                                             \
    }

QW_DOT32_AVX2(dot_q4_0_avx2, 18, codes_q4_0_dw)
QW_DOT32_AVX2(dot_q5_0_avx2, 22, codes_q5_0_dw)
QW_DOT32_AVX2(dot_q8_0_avx2, 34, codes_q8_0_dw)

QW_TARGET_AVX2 static float dot_q4_1_avx2(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    __m256 acc = _mm256_setzero_ps();
    __m256i c[4];
    for (int64_t i = 0; i < n; i += QK, b += 20, x += QK) {
        nibble_codes(b + 4, c);
        acc = _mm256_add_ps(acc, dot4x8_affine(c, f16_bcast(b), f16_bcast(b + 2), x));
    }
    return hsum256(acc);
}

QW_TARGET_AVX2 static float dot_q5_1_avx2(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    __m256 acc = _mm256_setzero_ps();
    __m256i c[4];
    for (int64_t i = 0; i < n; i += QK, b += 24, x += QK) {
        nibble_codes(b + 8, c);
        for (int k = 0; k < 4; k++) c[k] = _mm256_or_si256(c[k], high_bits(q5_1_high, b[4 + k]));
        acc = _mm256_add_ps(acc, dot4x8_affine(c, f16_bcast(b), f16_bcast(b + 2), x));
    }
    return hsum256(acc);
}

/* Q4_K/Q5_K: the 8 d * sc (dl) and dmin * m (ml) of a super-block. The 12 scale bytes are
 * unpacked four at a time in 32-bit words (the first four 6-bit values are the low bits of words
 * 0 and 1; the last four are nibbles of word 2 plus the top two bits of words 0 and 1), then
 * widened and scaled as vectors. */
QW_TARGET_AVX2 static inline void kquant_scales_dot(const uint8_t *b, float *dl, float *ml) {
    uint32_t w0 = rd_u32(b + 4), w1 = rd_u32(b + 8), w2 = rd_u32(b + 12);
    uint64_t sc = (w0 & 0x3F3F3F3Fu) | (uint64_t)((w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u)) << 32;
    uint64_t m = (w1 & 0x3F3F3F3Fu) | (uint64_t)(((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u)) << 32;
    __m256 vsc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    __m256 vm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m)));
    _mm256_storeu_ps(dl, _mm256_mul_ps(vsc, f16_bcast(b)));
    _mm256_storeu_ps(ml, _mm256_mul_ps(vm, f16_bcast(b + 2)));
}

/* Bit p of each dword-widened byte of h4 (the bytes already shifted left by 4) moved to bit 4. */
QW_TARGET_AVX2 static inline __m256i bit_to_16(__m256i h4, __m128i p) {
    return _mm256_and_si256(_mm256_srl_epi32(h4, p), _mm256_set1_epi32(0x10));
}

/* Q4_K/Q5_K super-block: each value's weight dl * q - ml formed by one FMA, then dotted; qh is
 * NULL for Q4_K. Four accumulators (even/odd 8-value group x low/high sub-block). */
QW_TARGET_AVX2 static inline void dot_kquant_4_5_avx2(const uint8_t *b, const uint8_t *qs, const uint8_t *qh,
                                                     const float *x, __m256 acc[4]) {
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    float dl[8], ml[8];
    kquant_scales_dot(b, dl, ml);
    for (int c = 0; c < 4; c++, qs += 32, x += 64) {
        __m256 d0 = _mm256_broadcast_ss(&dl[2 * c]), m0 = _mm256_broadcast_ss(&ml[2 * c]);
        __m256 d1 = _mm256_broadcast_ss(&dl[2 * c + 1]), m1 = _mm256_broadcast_ss(&ml[2 * c + 1]);
        for (int g = 0; g < 4; g++) {
            __m256i v = u8x8_epi32(qs + 8 * g);
            __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_srli_epi32(v, 4);
            if (qh) {
                __m256i h4 = _mm256_slli_epi32(u8x8_epi32(qh + 8 * g), 4);
                lo = _mm256_or_si256(lo, bit_to_16(h4, _mm_cvtsi32_si128(2 * c)));
                hi = _mm256_or_si256(hi, bit_to_16(h4, _mm_cvtsi32_si128(2 * c + 1)));
            }
            __m256 wlo = _mm256_fmsub_ps(_mm256_cvtepi32_ps(lo), d0, m0);
            __m256 whi = _mm256_fmsub_ps(_mm256_cvtepi32_ps(hi), d1, m1);
            acc[g & 1] = _mm256_fmadd_ps(wlo, _mm256_loadu_ps(x + 8 * g), acc[g & 1]);
            acc[2 + (g & 1)] = _mm256_fmadd_ps(whi, _mm256_loadu_ps(x + 32 + 8 * g), acc[2 + (g & 1)]);
        }
    }
}

QW_TARGET_AVX2 static inline float hsum4(const __m256 acc[4]) {
    return hsum256(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

QW_TARGET_AVX2 static float dot_q4_k_avx2(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n; i += QKK, b += 144, x += QKK) dot_kquant_4_5_avx2(b, b + 16, NULL, x, acc);
    return hsum4(acc);
}

QW_TARGET_AVX2 static float dot_q5_k_avx2(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n; i += QKK, b += 176, x += QKK) dot_kquant_4_5_avx2(b, b + 48, b + 16, x, acc);
    return hsum4(acc);
}

/* Q6_K: codes are assembled 32 at a time with byte SIMD (cheaper than per dword for six bits
 * from two places), parked in a small buffer and widened from there by vpmovsxbd loads, which
 * avoids the lane extracts that widening from a register needs. */
QW_TARGET_AVX2 static float dot_q6_k_avx2(const void *row, const float *x, int64_t n) {
    const uint8_t *b = row;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    _Alignas(32) uint8_t codes[256];
    _Alignas(32) float ds[16];
    for (int64_t i = 0; i < n; i += QKK, b += 210, x += QKK) {
        /* the 16 scales times d */
        __m256 d = f16_bcast(b + 208);
        _mm256_store_ps(ds, _mm256_mul_ps(_mm256_cvtepi32_ps(s8x8_epi32(b + 192)), d));
        _mm256_store_ps(ds + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(s8x8_epi32(b + 200)), d));
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                _mm256_store_si256((__m256i *)(codes + 128 * h + 32 * k), q6k_codes(b + 64 * h, b + 128 + 32 * h, k));
        /* 16 groups of 16 values, one scale each */
        for (int s = 0; s < 16; s++) {
            const uint8_t *c = codes + 16 * s;
            const float *xs = x + 16 * s;
            __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(s8x8_epi32(c)), _mm256_loadu_ps(xs));
            p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8x8_epi32(c + 8)), _mm256_loadu_ps(xs + 8), p);
            acc[s & 3] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&ds[s]), acc[s & 3]);
        }
    }
    return hsum4(acc);
}

#endif /* QW_HAVE_X86 */

/* ---------------------------------------------------------------- dispatch */

typedef void (*dequant_fn)(const void *, float *, int64_t);
typedef float (*dot_fn)(const void *, const float *, int64_t);

struct kernels {
    dequant_fn dequant, dequant_simd;
    dot_fn dot, dot_simd;
};

#if QW_HAVE_X86
#define KERNELS(T) {dequant_##T, dequant_##T##_avx2, dot_##T, dot_##T##_avx2}
#else
#define KERNELS(T) {dequant_##T, dequant_##T, dot_##T, dot_##T}
#endif

/* The kernels of `dtype`, or NULL. F32 has no separate SIMD dequantizer: it is a memcpy. */
static const struct kernels *kernels_of(int dtype) {
#if QW_HAVE_X86
    static const struct kernels f32 = {dequant_f32, dequant_f32, dot_f32, dot_f32_avx2};
#else
    static const struct kernels f32 = {dequant_f32, dequant_f32, dot_f32, dot_f32};
#endif
    static const struct kernels f16 = KERNELS(f16), bf16 = KERNELS(bf16), q4_0 = KERNELS(q4_0),
                                q4_1 = KERNELS(q4_1), q5_0 = KERNELS(q5_0), q5_1 = KERNELS(q5_1),
                                q8_0 = KERNELS(q8_0), q4_k = KERNELS(q4_k), q5_k = KERNELS(q5_k),
                                q6_k = KERNELS(q6_k);
    switch (dtype) {
    case QW_F32: return &f32;
    case QW_F16: return &f16;
    case QW_BF16: return &bf16;
    case QW_Q4_0: return &q4_0;
    case QW_Q4_1: return &q4_1;
    case QW_Q5_0: return &q5_0;
    case QW_Q5_1: return &q5_1;
    case QW_Q8_0: return &q8_0;
    case QW_Q4_K: return &q4_k;
    case QW_Q5_K: return &q5_k;
    case QW_Q6_K: return &q6_k;
    default: return NULL;
    }
}

void qw_dequant_row(int dtype, const void *src, float *dst, int64_t n) {
    const struct kernels *k = kernels_of(dtype);
    if (!k) {
        memset(dst, 0, (size_t)n * sizeof(float));
        return;
    }
    (qw_use_avx2() ? k->dequant_simd : k->dequant)(src, dst, n);
}

float qw_dot_row(int dtype, const void *row, const float *x, int64_t n) {
    const struct kernels *k = kernels_of(dtype);
    if (!k) return 0.0f;
    return (qw_use_avx2() ? k->dot_simd : k->dot)(row, x, n);
}

/* ---------------------------------------------------------------- Q8_0 quantizer */

/* Per 32 values: d = max|x| / 127 stored as f16, q = x * (1 / d) rounded half away from zero (as
 * roundf), the same operations as the reference quantizer so the bytes match it exactly. The
 * codes use the float32 d, not its f16 rounding, as the reference does. */
void qw_quantize_row_q8_0(const float *src, void *dst, int64_t n) {
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i += QK, src += QK, b += 34) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(src[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = qw_f32_to_f16(d);
        memcpy(b, &h, sizeof h);
        for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)roundf(src[j] * id);
    }
}
