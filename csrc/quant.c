/* Row kernels for every weight storage type: see quant.h. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "fdot.h"

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

/* Q4_K/Q5_K: the 8 6-bit scales (*sc) and mins (*m) of a super-block, one per byte. The 12 scale
 * bytes are unpacked four at a time in 32-bit words (the first four 6-bit values are the low bits
 * of words 0 and 1; the last four are nibbles of word 2 plus the top two bits of words 0 and 1). */
static inline void kquant_scale_bytes(const uint8_t *b, uint64_t *sc, uint64_t *m) {
    uint32_t w0 = rd_u32(b + 4), w1 = rd_u32(b + 8), w2 = rd_u32(b + 12);
    *sc = (w0 & 0x3F3F3F3Fu) | (uint64_t)((w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u)) << 32;
    *m = (w1 & 0x3F3F3F3Fu) | (uint64_t)(((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u)) << 32;
}

#endif /* QW_HAVE_X86 */

/* ---------------------------------------------------------------- dispatch */

typedef void (*dequant_fn)(const void *, float *, int64_t);

/* The dequantizer of `dtype` on the current SIMD setting, or NULL. F32 has no separate SIMD
 * dequantizer: it is a memcpy. */
static dequant_fn dequant_of(int dtype) {
#if QW_HAVE_X86
    int simd = qw_use_avx2();
#define PICK(T) (simd ? dequant_##T##_avx2 : dequant_##T)
#else
#define PICK(T) dequant_##T
#endif
    switch (dtype) {
    case QW_F32: return dequant_f32;
    case QW_F16: return PICK(f16);
    case QW_BF16: return PICK(bf16);
    case QW_Q4_0: return PICK(q4_0);
    case QW_Q4_1: return PICK(q4_1);
    case QW_Q5_0: return PICK(q5_0);
    case QW_Q5_1: return PICK(q5_1);
    case QW_Q8_0: return PICK(q8_0);
    case QW_Q4_K: return PICK(q4_k);
    case QW_Q5_K: return PICK(q5_k);
    case QW_Q6_K: return PICK(q6_k);
    default: return NULL;
    }
#undef PICK
}

void qw_dequant_row(int dtype, const void *src, float *dst, int64_t n) {
    dequant_fn f = dequant_of(dtype);
    if (!f) {
        memset(dst, 0, (size_t)n * sizeof(float));
        return;
    }
    f(src, dst, n);
}

/* The f32 mode's dot (fdot.h): the row widened 256 values at a time into a buffer on the stack
 * (each widened value exactly the dequantizer's) and the one chain continued over each piece, so
 * the result is bit for bit what the tiled products compute for this row. */
float qw_dot_row(int dtype, const void *row, const float *x, int64_t n) {
    enum { PIECE = 256 };
    dequant_fn f = dequant_of(dtype);
    if (!f) return 0.0f;
    if (dtype == QW_F32) return qw_fdot(row, x, n);
    _Alignas(32) float buf[PIECE];
    int64_t bs = qw_block_size(dtype), bb = qw_block_bytes(dtype), n8 = n & ~(int64_t)7;
    const uint8_t *w = row;
    qw_fdot_acc acc;
    qw_fdot_start(&acc);
    for (int64_t i = 0; i < n8; i += PIECE) {
        int64_t len = n8 - i < PIECE ? n8 - i : PIECE; /* a multiple of the block: n8 = n for block types */
        f(w + i / bs * bb, buf, len);
        qw_fdot_step(&acc, buf, x + i, len);
    }
    f(w + n8 / bs * bb, buf, n - n8); /* float types only: the < 8 last values */
    return qw_fdot_finish(&acc, buf, x + n8, n - n8);
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

/* ================================================================ integer path (see quant.h)
 *
 * Activations are quantized once per product to int8 (act rows, one layout for every type); each
 * weight block is then dotted with them in integers. The AVX2 kernels multiply bytes with
 * vpmaddubsw (unsigned times signed bytes, adjacent pairs summed to int16) and widen with
 * vpmaddwd:
 *   - Q8_0's signed codes w go in as |w| with w's sign moved onto x (vpsignb): w x = |w| (sgn(w) x);
 *   - the other types' codes are unsigned (Q4_0 and Q5_0 keep theirs with an offset of 8 or 16,
 *     Q6_K with 32), and go in as they are; the offset times the block's activation sum comes off
 *     in integers, from the act row's sums (bsums), so every block's sum stays exact.
 * No int16 pair sum can saturate: |x| <= 127 and codes are at most 128 in size (|w| of Q8_0),
 * 2 * 128 * 127 = 32512. Blocks go 8 at a time: their 8 vectors of partial sums are reduced to one
 * vector of 8 block sums (a vphaddd tree), where offsets and k-quant scales apply as integers; one
 * conversion and one FMA with the 8 blocks' d * dx then cover all 8.
 *
 * The plain kernels compute the same integers with simple loops, but from the codes alone: they
 * never read s or bsums, which makes them an independent check of those on the AVX2 path. */

#include <stdlib.h>

static int has_int_dot(int dtype) {
    switch (dtype) {
    case QW_Q4_0: case QW_Q4_1: case QW_Q5_0: case QW_Q5_1: case QW_Q8_0:
    case QW_Q4_K: case QW_Q5_K: case QW_Q6_K: return 1;
    default: return 0;
    }
}

/* The pieces of an act row of n values; ACT_HALF is its size, and the offset of a 16-bit row's
 * second level. */
#define ACT_HALF(n) ((size_t)(n) + 8 * (size_t)((n) / QK) + 2 * (size_t)((n) / 16))
#define ACT_D(xq, n) ((const float *)((const int8_t *)(xq) + (n)))
#define ACT_S(xq, n) (ACT_D(xq, n) + (n) / QK)
#define ACT_BSUMS(xq, n) ((const int16_t *)(ACT_S(xq, n) + (n) / QK))

size_t qw_act_bytes(int dtype, int64_t n, int bits) {
    if (!has_int_dot(dtype) || n % QK || (bits != 8 && bits != 16)) return 0;
    return bits == 16 ? 2 * ACT_HALF(n) : ACT_HALF(n);
}

/* Below this max|x| a block is quantized to zeros: 1 / d would overflow for some such blocks. */
#define ACT_TINY 1e-30f

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The block scale from the largest |x| bit pattern (|x| bits order as the values do, with NaN
 * above infinity, so non-finite inputs are seen wherever they are): d, and 1 / d (0 for a zero
 * block). Returns 0 for a block with non-finite values (d = NaN), whose codes must be zeros. */
static inline int act_scale(uint32_t amax_bits, float *d, float *id) {
    if (amax_bits >= 0x7f800000u) {
        *d = NAN;
        *id = 0.0f;
        return 0;
    }
    float amax = bits_f32(amax_bits);
    if (amax < ACT_TINY) {
        *d = 0.0f;
        *id = 0.0f;
        return 1;
    }
    *d = amax / 127.0f;
    *id = 1.0f / *d;
    return 1;
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
 * t - q1 and the product by 256 are exact in float32, so every path writes the same codes. */
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
        s2[i] = d2[i] * (float)(bs2[2 * i] + bs2[2 * i + 1]);
    }
}

/* ---------------------------------------------------------------- integer dots: plain */

static inline int32_t idot(const int8_t *a, const int8_t *b, int len) {
    int32_t s = 0;
    for (int j = 0; j < len; j++) s += (int32_t)a[j] * b[j];
    return s;
}

/* The 32-value types share one loop; UNPACK(b, q) writes the block's 32 codes (offset applied);
 * the affine types (HAS_MIN) add their min m times the block's activation sum. */
#define QW_DOTQ32_PLAIN(NAME, BYTES, UNPACK, HAS_MIN)                                         \
    static float NAME(const void *row, const void *xq, int64_t n) {                           \
        const uint8_t *b = row;                                                                \
        const int8_t *x = xq;                                                                  \
        const float *xd = ACT_D(xq, n);                                                        \
        int8_t q[QK];                                                                          \
        float s = 0;                                                                           \
        for (int64_t i = 0; i < n / QK; i++, b += (BYTES), x += QK) {                          \
            UNPACK(b, q);                                                                      \
            s += (rd_f16(b) * xd[i]) * (float)idot(q, x, QK);                                  \
            if (HAS_MIN) s += rd_f16(b + 2) * (xd[i] * (float)sum_codes(x, QK));               \
        }                                                                                      \
        return s;                                                                              \
    }

#define UNPACK_Q4_0(b, q) unpack_nibbles((b) + 2, 8, q)
#define UNPACK_Q4_1(b, q) unpack_nibbles((b) + 4, 0, q)
#define UNPACK_Q5_0(b, q) unpack_nibbles5((b) + 6, (b) + 2, 16, q)
#define UNPACK_Q5_1(b, q) unpack_nibbles5((b) + 8, (b) + 4, 0, q)
#define UNPACK_Q8_0(b, q) memcpy(q, (b) + 2, QK)

QW_DOTQ32_PLAIN(dotq_q4_0, 18, UNPACK_Q4_0, 0)
QW_DOTQ32_PLAIN(dotq_q4_1, 20, UNPACK_Q4_1, 1)
QW_DOTQ32_PLAIN(dotq_q5_0, 22, UNPACK_Q5_0, 0)
QW_DOTQ32_PLAIN(dotq_q5_1, 24, UNPACK_Q5_1, 1)
QW_DOTQ32_PLAIN(dotq_q8_0, 34, UNPACK_Q8_0, 0)

/* A Q4_K/Q5_K super-block (qh NULL for Q4_K) against 8 act blocks: per sub-block j,
 * d dx_j sc_j (q_j . x_j) - dmin dx_j m_j (sum x_j), the dot and the sum in integers. */
static float dotq_kquant_4_5(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, const int8_t *x,
                             const float *xd) {
    float d = rd_f16(b), dmin = rd_f16(b + 2), s = 0;
    int8_t q[32];
    for (int j = 0; j < 8; j++, x += 32) {
        int sc, m;
        kquant_scale_min(b + 4, j, &sc, &m);
        unpack_kquant(qs, qh, j, q);
        s += (d * xd[j]) * (float)(sc * idot(q, x, 32)) - (dmin * xd[j]) * (float)(m * sum_codes(x, 32));
    }
    return s;
}

static float dotq_q4_k(const void *row, const void *xq, int64_t n) {
    const uint8_t *b = row;
    const int8_t *x = xq;
    const float *xd = ACT_D(xq, n);
    float s = 0;
    for (int64_t i = 0; i < n / QKK; i++, b += 144, x += QKK, xd += 8) s += dotq_kquant_4_5(b, b + 16, NULL, x, xd);
    return s;
}

static float dotq_q5_k(const void *row, const void *xq, int64_t n) {
    const uint8_t *b = row;
    const int8_t *x = xq;
    const float *xd = ACT_D(xq, n);
    float s = 0;
    for (int64_t i = 0; i < n / QKK; i++, b += 176, x += QKK, xd += 8) s += dotq_kquant_4_5(b, b + 48, b + 16, x, xd);
    return s;
}

/* Q6_K: per 32 values (two scale groups of 16), d dx_j (sc_a c_a . x_a + sc_b c_b . x_b), with
 * the signed codes c = q - 32. */
static float dotq_q6_k(const void *row, const void *xq, int64_t n) {
    const uint8_t *b = row;
    const int8_t *x = xq;
    const float *xd = ACT_D(xq, n);
    int8_t q[QKK];
    float s = 0;
    for (int64_t i = 0; i < n / QKK; i++, b += 210, x += QKK, xd += 8) {
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = rd_f16(b + 208);
        unpack_q6_k(b, q);
        for (int j = 0; j < 8; j++) {
            int32_t isum = sc[2 * j] * idot(q + 32 * j, x + 32 * j, 16) +
                           sc[2 * j + 1] * idot(q + 32 * j + 16, x + 32 * j + 16, 16);
            s += (d * xd[j]) * (float)isum;
        }
    }
    return s;
}

/* 16-bit act rows, plain: the two levels are complete 8-bit act rows, so the dot is the sum of
 * the 8-bit kernel over each (an independent check of the fused AVX2 kernels below). */
#define QW_DOTQ16_PLAIN(T)                                                                     \
    static float dotq16_##T(const void *row, const void *xq, int64_t n) {                    \
        return dotq_##T(row, xq, n) + dotq_##T(row, (const int8_t *)xq + ACT_HALF(n), n);      \
    }

QW_DOTQ16_PLAIN(q4_0)
QW_DOTQ16_PLAIN(q4_1)
QW_DOTQ16_PLAIN(q5_0)
QW_DOTQ16_PLAIN(q5_1)
QW_DOTQ16_PLAIN(q8_0)
QW_DOTQ16_PLAIN(q4_k)
QW_DOTQ16_PLAIN(q5_k)
QW_DOTQ16_PLAIN(q6_k)

/* ---------------------------------------------------------------- integer path: AVX2 */
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

/* Signed codes w: |w| times x with w's sign moved onto it. */
QW_TARGET_AVX2 static inline __m256i dot_ss(__m256i w, const int8_t *x) {
    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(load32(x), w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Unsigned codes u. */
QW_TARGET_AVX2 static inline __m256i dot_us(__m256i u, const int8_t *x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, load32(x)), _mm256_set1_epi16(1));
}

/* 8 vectors of 8 partial sums -> one vector of their 8 totals, in order. */
QW_TARGET_AVX2 static inline __m256i block_sums8(const __m256i p[8]) {
    __m256i p01 = _mm256_hadd_epi32(p[0], p[1]), p23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i p45 = _mm256_hadd_epi32(p[4], p[5]), p67 = _mm256_hadd_epi32(p[6], p[7]);
    /* lane 0 of p0123: the low halves' sums of p0..p3, lane 1 their high halves' */
    __m256i p0123 = _mm256_hadd_epi32(p01, p23), p4567 = _mm256_hadd_epi32(p45, p67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(p0123, p4567, 0x20),
                            _mm256_permute2x128_si256(p0123, p4567, 0x31));
}

/* 4 vectors -> their 4 totals. */
QW_TARGET_AVX2 static inline __m128i block_sums4(const __m256i p[4]) {
    __m256i p0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(p0123), _mm256_extracti128_si256(p0123, 1));
}

/* The activation code sums of 8 (or 4) consecutive 32-value blocks, times c, from their bsums. */
QW_TARGET_AVX2 static inline __m256i act_sums8(const int16_t *bs, short c) {
    return _mm256_madd_epi16(load32(bs), _mm256_set1_epi16(c));
}

QW_TARGET_AVX2 static inline __m128i act_sums4(const int16_t *bs, short c) {
    return _mm_madd_epi16(_mm_loadu_si128((const __m128i *)bs), _mm_set1_epi16(c));
}

/* The f16 fields of 8 (or 4) consecutive blocks `bytes` apart, as floats. */
QW_TARGET_AVX2 static inline __m256 f16x8(const uint8_t *b, int bytes) {
    return _mm256_cvtph_ps(_mm_setr_epi16((short)rd_u16(b), (short)rd_u16(b + bytes), (short)rd_u16(b + 2 * bytes),
                                          (short)rd_u16(b + 3 * bytes), (short)rd_u16(b + 4 * bytes),
                                          (short)rd_u16(b + 5 * bytes), (short)rd_u16(b + 6 * bytes),
                                          (short)rd_u16(b + 7 * bytes)));
}

QW_TARGET_AVX2 static inline __m128 f16x4(const uint8_t *b, int bytes) {
    return _mm_cvtph_ps(_mm_setr_epi16((short)rd_u16(b), (short)rd_u16(b + bytes), (short)rd_u16(b + 2 * bytes),
                                       (short)rd_u16(b + 3 * bytes), 0, 0, 0, 0));
}

/* ---- the 32-value types */

QW_TARGET_AVX2 static inline __m256i codes_q8_0(const uint8_t *b) { return load32(b + 2); }

/* 16 packed bytes -> 32 nibbles in value order (low nibbles, then high nibbles): the bytes
 * broadcast to both 128-bit lanes by the load, the upper lane shifted right by 4. */
QW_TARGET_AVX2 static inline __m256i nibbles32_b(const uint8_t *qs) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* Unsigned codes: the nibble (Q4_0 with its offset 8, Q4_1), or the nibble with the fifth bit
 * at bit 4 (Q5_0 with its offset 16, Q5_1). */
QW_TARGET_AVX2 static inline __m256i ucodes_q4_0(const uint8_t *b) { return nibbles32_b(b + 2); }
QW_TARGET_AVX2 static inline __m256i ucodes_q4_1(const uint8_t *b) { return nibbles32_b(b + 4); }
QW_TARGET_AVX2 static inline __m256i ucodes_q5_0(const uint8_t *b) {
    __m256i high = _mm256_and_si256(bits32_mask(rd_u32(b + 2)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles32_b(b + 6), high);
}
QW_TARGET_AVX2 static inline __m256i ucodes_q5_1(const uint8_t *b) {
    __m256i high = _mm256_and_si256(bits32_mask(rd_u32(b + 4)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles32_b(b + 8), high);
}

/* The 32-value types. Per group of 8 blocks: the 8 exact block sums of codes times x (PRODUCT,
 * above), less OFFSET times the blocks' activation sums, widened and multiplied by the 8 d * dx
 * into the float accumulator. The affine types (HAS_MIN) add m * s (s = dx * sum of the x codes)
 * into a second one. Then a group of 4 the same way, and single blocks. */
#define QW_DOTQ32_AVX2(NAME, BYTES, CODES, PRODUCT, OFFSET, HAS_MIN)                           \
    QW_TARGET_AVX2 static float NAME(const void *row, const void *xq, int64_t n) {             \
        const uint8_t *b = row;                                                                \
        const int8_t *x = xq;                                                                  \
        const float *xd = ACT_D(xq, n), *xs = ACT_S(xq, n);                                    \
        const int16_t *bs = ACT_BSUMS(xq, n);                                                  \
        __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();                          \
        __m128 acc4 = _mm_setzero_ps();                                                        \
        int64_t nb = n / QK, i = 0;                                                            \
        for (; i + 8 <= nb; i += 8, b += 8 * (BYTES), x += 8 * QK) {                           \
            __m256i p[8];                                                                      \
            for (int k = 0; k < 8; k++) p[k] = PRODUCT(CODES(b + k * (BYTES)), x + k * QK);    \
            __m256i sums = block_sums8(p);                                                     \
            if (OFFSET) sums = _mm256_sub_epi32(sums, act_sums8(bs + 2 * i, OFFSET));          \
            __m256 d = f16x8(b, (BYTES));                                                      \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d, _mm256_loadu_ps(xd + i)), acc); \
            if (HAS_MIN) macc = _mm256_fmadd_ps(f16x8(b + 2, (BYTES)), _mm256_loadu_ps(xs + i), macc); \
        }                                                                                      \
        if (i + 4 <= nb) {                                                                     \
            __m256i p[4];                                                                      \
            for (int k = 0; k < 4; k++) p[k] = PRODUCT(CODES(b + k * (BYTES)), x + k * QK);    \
            __m128i sums = block_sums4(p);                                                     \
            if (OFFSET) sums = _mm_sub_epi32(sums, act_sums4(bs + 2 * i, OFFSET));             \
            __m128 d = _mm_mul_ps(f16x4(b, (BYTES)), _mm_loadu_ps(xd + i));                    \
            acc4 = _mm_mul_ps(_mm_cvtepi32_ps(sums), d);                                       \
            if (HAS_MIN) acc4 = _mm_fmadd_ps(f16x4(b + 2, (BYTES)), _mm_loadu_ps(xs + i), acc4); \
            i += 4, b += 4 * (BYTES), x += 4 * QK;                                             \
        }                                                                                      \
        float r = 0;                                                                           \
        for (; i < nb; i++, b += (BYTES), x += QK) {                                           \
            int32_t isum = hsum_i32(PRODUCT(CODES(b), x)) - (OFFSET) * (bs[2 * i] + bs[2 * i + 1]); \
            r += (f16_avx2(b) * xd[i]) * (float)isum;                                          \
            if (HAS_MIN) r += f16_avx2(b + 2) * xs[i];                                         \
        }                                                                                      \
        __m128 a4 = _mm_add_ps(acc4, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1))); \
        if (HAS_MIN) a4 = _mm_add_ps(a4, _mm_add_ps(_mm256_castps256_ps128(macc), _mm256_extractf128_ps(macc, 1))); \
        a4 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));                                            \
        return _mm_cvtss_f32(_mm_add_ss(a4, _mm_movehdup_ps(a4))) + r;                         \
    }

QW_DOTQ32_AVX2(dotq_q4_0_avx2, 18, ucodes_q4_0, dot_us, 8, 0)
QW_DOTQ32_AVX2(dotq_q4_1_avx2, 20, ucodes_q4_1, dot_us, 0, 1)
QW_DOTQ32_AVX2(dotq_q5_0_avx2, 22, ucodes_q5_0, dot_us, 16, 0)
QW_DOTQ32_AVX2(dotq_q5_1_avx2, 24, ucodes_q5_1, dot_us, 0, 1)
QW_DOTQ32_AVX2(dotq_q8_0_avx2, 34, codes_q8_0, dot_ss, 0, 0)

/* ---- k-quants: a super-block is 8 act blocks */

/* The unsigned codes of sub-blocks 2c (*lo) and 2c + 1 (*hi) of a Q4_K/Q5_K super-block, 32
 * bytes each: the low and high nibbles of 32-byte chunk c of qs. For Q5_K (h not NULL), *h holds
 * the qh bytes shifted right by 2c: their bits 0 and 1 are the fifth bits, and it is shifted on
 * for the next chunk. */
QW_TARGET_AVX2 static inline void kquant_ucodes(const uint8_t *qs, int c, __m256i *h, __m256i *lo, __m256i *hi) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    __m256i v = load32(qs + 32 * c);
    *lo = _mm256_and_si256(v, low4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    if (h) {
        /* the 16-bit shifts are safe because only bit 4 of each byte is kept */
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi16(*h, 4), bit4));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_slli_epi16(*h, 3), bit4));
        *h = _mm256_srli_epi16(*h, 2);
    }
}

/* Q4_K/Q5_K super-block (qh NULL for Q4_K). Per 32-byte chunk c of qs: low nibbles are
 * sub-block 2c, high nibbles 2c + 1. The 8 sub-blocks' exact sums q . x (block_sums8) times
 * their scales (vpmulld) make one int32 vector; it is widened and multiplied by d * dx_j. The
 * mins: dmin * m_j * s_j, s_j = dx_j * (sum of sub-block j's x codes). */
QW_TARGET_AVX2 static inline void dotq_kquant_4_5_avx2(const uint8_t *b, const uint8_t *qs, const uint8_t *qh,
                                                      const int8_t *x, const float *xd, const float *xs,
                                                      __m256 *acc, __m256 *macc) {
    uint64_t sc, m;
    kquant_scale_bytes(b, &sc, &m);
    __m256i p[8], lo, hi, h = qh ? load32(qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        kquant_ucodes(qs, c, qh ? &h : NULL, &lo, &hi);
        p[2 * c] = dot_us(lo, x + 64 * c);
        p[2 * c + 1] = dot_us(hi, x + 64 * c + 32);
    }
    __m256i sums = _mm256_mullo_epi32(block_sums8(p), _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    __m256 dx = _mm256_loadu_ps(xd);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(_mm256_set1_ps(f16_avx2(b)), dx), *acc);
    __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m)));
    *macc = _mm256_fmadd_ps(_mm256_mul_ps(mins, _mm256_set1_ps(f16_avx2(b + 2))), _mm256_loadu_ps(xs), *macc);
}

QW_TARGET_AVX2 static float dotq_q4_k_avx2(const void *row, const void *xq, int64_t n) {
    const uint8_t *b = row;
    const int8_t *x = xq;
    const float *xd = ACT_D(xq, n), *xs = ACT_S(xq, n);
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++, b += 144, x += QKK, xd += 8, xs += 8)
        dotq_kquant_4_5_avx2(b, b + 16, NULL, x, xd, xs, &acc, &macc);
    return hsum256(_mm256_sub_ps(acc, macc));
}

QW_TARGET_AVX2 static float dotq_q5_k_avx2(const void *row, const void *xq, int64_t n) {
    const uint8_t *b = row;
    const int8_t *x = xq;
    const float *xd = ACT_D(xq, n), *xs = ACT_S(xq, n);
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++, b += 176, x += QKK, xd += 8, xs += 8)
        dotq_kquant_4_5_avx2(b, b + 48, b + 16, x, xd, xs, &acc, &macc);
    return hsum256(_mm256_sub_ps(acc, macc));
}

/* Q6_K unsigned codes (0..63) of values 32k .. 32k + 32 of one half. */
QW_TARGET_AVX2 static inline __m256i q6k_ucodes(const uint8_t *ql, __m256i h, int k) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    __m256i l = load32(ql + 32 * (k & 1));
    if (k >= 2) l = _mm256_srli_epi16(l, 4);
    switch (k) {
    case 0: h = _mm256_slli_epi16(h, 4); break;
    case 1: h = _mm256_slli_epi16(h, 2); break;
    case 2: break;
    default: h = _mm256_srli_epi16(h, 2); break;
    }
    return _mm256_or_si256(_mm256_and_si256(l, low4), _mm256_and_si256(h, bits45));
}

/* The int16 scales the pair sums of Q6_K chunk k (of a half) take in vpmaddwd: values 0-15 of
 * the chunk take the half's scale 2k, values 16-31 scale 2k + 1 (one per 128-bit lane). sch: the
 * half's 8 scales as int16 in both lanes. */
QW_TARGET_AVX2 static inline __m256i q6k_chunk_scales(__m256i sch, int k) {
    __m256i sel = _mm256_set_m128i(_mm_set1_epi16((short)(0x0101 * (4 * k + 2) + 0x0100)),
                                   _mm_set1_epi16((short)(0x0101 * 4 * k + 0x0100)));
    return _mm256_shuffle_epi8(sch, sel);
}

/* The 16 scales of a Q6_K super-block as int16. */
QW_TARGET_AVX2 static inline __m256i q6k_scales16(const uint8_t *b) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
}

/* Half hf's 8 scales (of sc16) in both 128-bit lanes. */
QW_TARGET_AVX2 static inline __m256i q6k_half_scales(__m256i sc16, int hf) {
    return _mm256_permute2x128_si256(sc16, sc16, hf ? 0x11 : 0x00);
}

/* Q6_K: unsigned codes q = c + 32 times x, each 16-value group's pair sums multiplied by its
 * scale in vpmaddwd (a 32-value chunk spans two groups, one per 128-bit lane); the 8 chunks'
 * exact sums less 32 * (sc_a bsum_a + sc_b bsum_b), then widened and multiplied by d * dx_j. */
QW_TARGET_AVX2 static float dotq_q6_k_avx2(const void *row, const void *xq, int64_t n) {
    const uint8_t *b = row;
    const int8_t *x = xq;
    const float *xd = ACT_D(xq, n);
    const int16_t *bs = ACT_BSUMS(xq, n);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++, b += 210, x += QKK, xd += 8, bs += 16) {
        __m256i sc16 = q6k_scales16(b), p[8];
        for (int hf = 0; hf < 2; hf++) {
            __m256i sch = q6k_half_scales(sc16, hf), h = load32(b + 128 + 32 * hf);
            for (int k = 0; k < 4; k++) {
                __m256i q = q6k_ucodes(b + 64 * hf, h, k);
                __m256i pq = _mm256_maddubs_epi16(q, load32(x + 128 * hf + 32 * k));
                p[4 * hf + k] = _mm256_madd_epi16(pq, q6k_chunk_scales(sch, k));
            }
        }
        __m256i offs = _mm256_slli_epi32(_mm256_madd_epi16(load32(bs), sc16), 5);
        __m256i sums = _mm256_sub_epi32(block_sums8(p), offs);
        __m256 d = _mm256_mul_ps(_mm256_set1_ps(f16_avx2(b + 208)), _mm256_loadu_ps(xd));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc);
    }
    return hsum256(acc);
}


/* ---- 16-bit act rows: quantizer and fused kernels
 *
 * Each weight block is unpacked once and multiplied by both levels' codes. For the 32-value
 * types and Q4_K/Q5_K the two products of a block combine in integers, 256 p1 + p2 (at most
 * 32 * 127 * 32639 < 2^31 per block), against the level-1 scale d / 256; Q6_K's products carry
 * its 8-bit group scales and keep the levels apart until they are floats. */

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
        s2[i] = d2[i] * (float)(lo2 + hi2);
    }
}

/* 256 (u . x) + (u . y) for unsigned codes u, as 8 int32 partial sums. */
QW_TARGET_AVX2 static inline __m256i dot2_us(__m256i u, const int8_t *x, const int8_t *y) {
    __m256i a = _mm256_madd_epi16(_mm256_maddubs_epi16(u, load32(x)), _mm256_set1_epi16(256));
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, load32(y)), _mm256_set1_epi16(1)));
}

/* The same for signed codes w (|w| times x or y with w's sign moved onto it). */
QW_TARGET_AVX2 static inline __m256i dot2_ss(__m256i w, const int8_t *x, const int8_t *y) {
    __m256i aw = _mm256_abs_epi8(w);
    __m256i a = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(load32(x), w)), _mm256_set1_epi16(256));
    __m256i b = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(load32(y), w)), _mm256_set1_epi16(1));
    return _mm256_add_epi32(a, b);
}

/* The 32-value types, as QW_DOTQ32_AVX2 with the combined products: offsets come off as
 * OFFSET * (256 bsum1 + bsum2), the scale is d dx / 256, the mins multiply s1 + s2. */
#define QW_DOTQ16_32_AVX2(NAME, BYTES, CODES, PRODUCT2, OFFSET, HAS_MIN)                        \
    QW_TARGET_AVX2 static float NAME(const void *row, const void *xq, int64_t n) {             \
        const uint8_t *b = row;                                                                \
        const int8_t *x = xq, *y = x + ACT_HALF(n);                                            \
        const float *xd = ACT_D(x, n), *xs = ACT_S(x, n), *ys = ACT_S(y, n);                   \
        const int16_t *bs = ACT_BSUMS(x, n), *bs2 = ACT_BSUMS(y, n);                           \
        const __m256 inv256 = _mm256_set1_ps(1.0f / 256.0f);                                   \
        __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();                          \
        int64_t nb = n / QK, i = 0;                                                            \
        for (; i + 8 <= nb; i += 8, b += 8 * (BYTES), x += 8 * QK, y += 8 * QK) {              \
            __m256i p[8];                                                                      \
            for (int k = 0; k < 8; k++) p[k] = PRODUCT2(CODES(b + k * (BYTES)), x + k * QK, y + k * QK); \
            __m256i sums = block_sums8(p);                                                     \
            if (OFFSET)                                                                        \
                sums = _mm256_sub_epi32(sums, _mm256_add_epi32(act_sums8(bs + 2 * i, 256 * (OFFSET)), \
                                                               act_sums8(bs2 + 2 * i, OFFSET))); \
            __m256 d = _mm256_mul_ps(f16x8(b, (BYTES)), _mm256_mul_ps(_mm256_loadu_ps(xd + i), inv256)); \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc);                           \
            if (HAS_MIN)                                                                       \
                macc = _mm256_fmadd_ps(f16x8(b + 2, (BYTES)),                                  \
                                       _mm256_add_ps(_mm256_loadu_ps(xs + i), _mm256_loadu_ps(ys + i)), macc); \
        }                                                                                      \
        float r = 0;                                                                           \
        for (; i < nb; i++, b += (BYTES), x += QK, y += QK) {                                  \
            int32_t isum = hsum_i32(PRODUCT2(CODES(b), x, y)) -                                \
                           (OFFSET) * (256 * (bs[2 * i] + bs[2 * i + 1]) + bs2[2 * i] + bs2[2 * i + 1]); \
            r += (f16_avx2(b) * (xd[i] * (1.0f / 256.0f))) * (float)isum;                      \
            if (HAS_MIN) r += f16_avx2(b + 2) * (xs[i] + ys[i]);                               \
        }                                                                                      \
        return hsum256(_mm256_add_ps(acc, macc)) + r;                                          \
    }

QW_DOTQ16_32_AVX2(dotq16_q4_0_avx2, 18, ucodes_q4_0, dot2_us, 8, 0)
QW_DOTQ16_32_AVX2(dotq16_q4_1_avx2, 20, ucodes_q4_1, dot2_us, 0, 1)
QW_DOTQ16_32_AVX2(dotq16_q5_0_avx2, 22, ucodes_q5_0, dot2_us, 16, 0)
QW_DOTQ16_32_AVX2(dotq16_q5_1_avx2, 24, ucodes_q5_1, dot2_us, 0, 1)
QW_DOTQ16_32_AVX2(dotq16_q8_0_avx2, 34, codes_q8_0, dot2_ss, 0, 0)

/* Q4_K/Q5_K super-block against both levels (qh NULL for Q4_K): the 8 sub-blocks' combined
 * sums times their 6-bit scales, in float (the product can pass 2^31 for Q5_K). */
QW_TARGET_AVX2 static inline void dotq16_kquant_4_5_avx2(const uint8_t *b, const uint8_t *qs, const uint8_t *qh,
                                                        const int8_t *x, const int8_t *y, const float *xd,
                                                        const float *xs, const float *ys, __m256 *acc,
                                                        __m256 *macc) {
    uint64_t sc, m;
    kquant_scale_bytes(b, &sc, &m);
    __m256i p[8], lo, hi, h = qh ? load32(qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        kquant_ucodes(qs, c, qh ? &h : NULL, &lo, &hi);
        p[2 * c] = dot2_us(lo, x + 64 * c, y + 64 * c);
        p[2 * c + 1] = dot2_us(hi, x + 64 * c + 32, y + 64 * c + 32);
    }
    __m256 sums = _mm256_mul_ps(_mm256_cvtepi32_ps(block_sums8(p)),
                                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc))));
    __m256 dx = _mm256_mul_ps(_mm256_loadu_ps(xd), _mm256_set1_ps(1.0f / 256.0f));
    *acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(_mm256_set1_ps(f16_avx2(b)), dx), *acc);
    __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m)));
    *macc = _mm256_fmadd_ps(_mm256_mul_ps(mins, _mm256_set1_ps(f16_avx2(b + 2))),
                            _mm256_add_ps(_mm256_loadu_ps(xs), _mm256_loadu_ps(ys)), *macc);
}

#define QW_DOTQ16_KQUANT_AVX2(NAME, BYTES, QS, QH)                                             \
    QW_TARGET_AVX2 static float NAME(const void *row, const void *xq, int64_t n) {             \
        const uint8_t *b = row;                                                                \
        const int8_t *x = xq, *y = x + ACT_HALF(n);                                            \
        const float *xd = ACT_D(x, n), *xs = ACT_S(x, n), *ys = ACT_S(y, n);                   \
        __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();                          \
        for (int64_t i = 0; i < n / QKK; i++, b += (BYTES), x += QKK, y += QKK, xd += 8, xs += 8, ys += 8) \
            dotq16_kquant_4_5_avx2(b, b + (QS), (QH) ? b + (QH) : NULL, x, y, xd, xs, ys, &acc, &macc); \
        return hsum256(_mm256_sub_ps(acc, macc));                                              \
    }

QW_DOTQ16_KQUANT_AVX2(dotq16_q4_k_avx2, 144, 16, 0)
QW_DOTQ16_KQUANT_AVX2(dotq16_q5_k_avx2, 176, 48, 16)

/* Q6_K against both levels: as dotq_q6_k_avx2, once per level on the same codes. */
QW_TARGET_AVX2 static float dotq16_q6_k_avx2(const void *row, const void *xq, int64_t n) {
    const uint8_t *b = row;
    const int8_t *x = xq, *y = x + ACT_HALF(n);
    const float *xd = ACT_D(x, n);
    const int16_t *bs = ACT_BSUMS(x, n), *bs2 = ACT_BSUMS(y, n);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++, b += 210, x += QKK, y += QKK, xd += 8, bs += 16, bs2 += 16) {
        __m256i sc16 = q6k_scales16(b), p[8], p2[8];
        for (int hf = 0; hf < 2; hf++) {
            __m256i sch = q6k_half_scales(sc16, hf), h = load32(b + 128 + 32 * hf);
            for (int k = 0; k < 4; k++) {
                __m256i q = q6k_ucodes(b + 64 * hf, h, k), scv = q6k_chunk_scales(sch, k);
                p[4 * hf + k] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(x + 128 * hf + 32 * k)), scv);
                p2[4 * hf + k] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(y + 128 * hf + 32 * k)), scv);
            }
        }
        __m256i s1 = _mm256_sub_epi32(block_sums8(p), _mm256_slli_epi32(_mm256_madd_epi16(load32(bs), sc16), 5));
        __m256i s2 = _mm256_sub_epi32(block_sums8(p2), _mm256_slli_epi32(_mm256_madd_epi16(load32(bs2), sc16), 5));
        __m256 sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2), _mm256_set1_ps(1.0f / 256.0f), _mm256_cvtepi32_ps(s1));
        __m256 d = _mm256_mul_ps(_mm256_set1_ps(f16_avx2(b + 208)), _mm256_loadu_ps(xd));
        acc = _mm256_fmadd_ps(sums, d, acc);
    }
    return hsum256(acc);
}

#endif /* QW_HAVE_X86 */

/* ---------------------------------------------------------------- integer path: dispatch */

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

/* The integer dots per type: [8-bit, 16-bit][plain, AVX2]. */
#if QW_HAVE_X86
#define DOTQ_KERNELS(T) {{dotq_##T, dotq_##T##_avx2}, {dotq16_##T, dotq16_##T##_avx2}}
#else
#define DOTQ_KERNELS(T) {{dotq_##T, dotq_##T}, {dotq16_##T, dotq16_##T}}
#endif

qw_dot_act_fn qw_dot_act_kernel(int dtype, int bits) {
    static const qw_dot_act_fn q4_0[2][2] = DOTQ_KERNELS(q4_0), q4_1[2][2] = DOTQ_KERNELS(q4_1),
                               q5_0[2][2] = DOTQ_KERNELS(q5_0), q5_1[2][2] = DOTQ_KERNELS(q5_1),
                               q8_0[2][2] = DOTQ_KERNELS(q8_0), q4_k[2][2] = DOTQ_KERNELS(q4_k),
                               q5_k[2][2] = DOTQ_KERNELS(q5_k), q6_k[2][2] = DOTQ_KERNELS(q6_k);
    const qw_dot_act_fn(*k)[2];
    switch (dtype) {
    case QW_Q4_0: k = q4_0; break;
    case QW_Q4_1: k = q4_1; break;
    case QW_Q5_0: k = q5_0; break;
    case QW_Q5_1: k = q5_1; break;
    case QW_Q8_0: k = q8_0; break;
    case QW_Q4_K: k = q4_k; break;
    case QW_Q5_K: k = q5_k; break;
    case QW_Q6_K: k = q6_k; break;
    default: return NULL;
    }
    if (bits != 8 && bits != 16) return NULL;
    return k[bits == 16][qw_use_avx2() ? 1 : 0];
}

float qw_dot_row_act(int dtype, const void *row, const void *xq, int64_t n, int bits) {
    qw_dot_act_fn k = qw_dot_act_kernel(dtype, bits);
    return k ? k(row, xq, n) : 0.0f;
}
