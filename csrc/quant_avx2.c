/* AVX2 dequantizers of every stored type (the plain reference is in quant.c).
 *
 * A block is unpacked with byte-wide integer SIMD into its 32 codes (one __m256i in value order),
 * widened 8 at a time to float and scaled with a separate multiply (and add), as the reference
 * does, so each value is the reference's float32 bit for bit. */
#include "fdot.h"
#include "kernels.h"
#include "qblock.h"

#if QW_HAVE_X86
#include <immintrin.h>


QW_TARGET_AVX2 static inline __m256 load_bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

QW_TARGET_AVX2 static inline __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

QW_TARGET_AVX2 void qw_dequant_f16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(s + i));
    for (; i < n; i++) dst[i] = qw_f16_to_f32(s[i]);
}

QW_TARGET_AVX2 void qw_dequant_bf16_avx2(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(s + i));
    for (; i < n; i++) dst[i] = qw_bf16_to_f32(s[i]);
}

/* ---------------------------------------------------------------- block types */

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

QW_TARGET_AVX2 void qw_dequant_q4_0_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 18, y += QK)
        store32_scaled(codes_q4_0(b), _mm256_set1_ps(f16_avx2(b)), y);
}

QW_TARGET_AVX2 void qw_dequant_q4_1_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 20, y += QK)
        store32_affine(nibbles32(b + 4), _mm256_set1_ps(f16_avx2(b)), _mm256_set1_ps(f16_avx2(b + 2)), y);
}

QW_TARGET_AVX2 void qw_dequant_q5_0_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 22, y += QK)
        store32_scaled(codes_q5_0(b), _mm256_set1_ps(f16_avx2(b)), y);
}

QW_TARGET_AVX2 void qw_dequant_q5_1_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 24, y += QK)
        store32_affine(codes_q5_1(b), _mm256_set1_ps(f16_avx2(b)), _mm256_set1_ps(f16_avx2(b + 2)), y);
}

QW_TARGET_AVX2 void qw_dequant_q8_0_avx2(const void *src, float *y, int64_t n) {
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

QW_TARGET_AVX2 void qw_dequant_q4_k_avx2(const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QKK, b += 144, y += QKK) dequant_kquant_4_5_avx2(b, b + 16, NULL, y);
}

QW_TARGET_AVX2 void qw_dequant_q5_k_avx2(const void *src, float *y, int64_t n) {
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

QW_TARGET_AVX2 void qw_dequant_q6_k_avx2(const void *src, float *y, int64_t n) {
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

/* ---------------------------------------------------------------- fused float rows
 *
 * Decode's f32-mode products: up to 4 weight rows against one activation row, each weight
 * widened in registers to exactly the dequantizer's float (the same multiply, and add, per
 * value) and fed 8 at a time, in order, into its row's FMA chain: fdot.h's order, without the
 * round trip through memory. Codes are widened to 32-bit lanes straight from memory
 * (vpmovzxbd / vpmovsxbd), nibbles and high bits split with shifts and masks. */

#define INLINE __attribute__((always_inline)) static inline

QW_TARGET_AVX2 INLINE __m256i u8x8_epi32(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
QW_TARGET_AVX2 INLINE __m256i s8x8_epi32(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* Q5_0 / Q5_1 fifth bits a byte of qh at a time, as 32-bit values to OR into 8 nibbles: for
 * Q5_0 (signed codes q - 16) 0 where the bit is set and -16 where it is clear; for Q5_1 16 or 0. */
#define QW_Q5_0_OFF(b, i) (QW_BIT(b, i) ? 0 : -16)
#define QW_Q5_0_ROW(b) {QW_Q5_0_OFF(b, 0), QW_Q5_0_OFF(b, 1), QW_Q5_0_OFF(b, 2), QW_Q5_0_OFF(b, 3), \
    QW_Q5_0_OFF(b, 4), QW_Q5_0_OFF(b, 5), QW_Q5_0_OFF(b, 6), QW_Q5_0_OFF(b, 7)}
static _Alignas(32) const int32_t q5_0_high[256][8] = {QW_ROWS256(QW_Q5_0_ROW)};
static _Alignas(32) const int32_t q5_1_high[256][8] = {QW_ROWS256(QW_BIT4_ROW)};

QW_TARGET_AVX2 INLINE __m256i high_bits(const int32_t (*table)[8], uint8_t byte) {
    return _mm256_load_si256((const __m256i *)table[byte]);
}

/* The 4 vectors of 8 codes (values 0-7, 8-15, 16-23, 24-31) of a 16-byte nibble block. */
QW_TARGET_AVX2 INLINE void nibble_dw(const uint8_t *qs, __m256i c[4]) {
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    __m256i v0 = u8x8_epi32(qs), v1 = u8x8_epi32(qs + 8);
    c[0] = _mm256_and_si256(v0, low4);
    c[1] = _mm256_and_si256(v1, low4);
    c[2] = _mm256_srli_epi32(v0, 4);
    c[3] = _mm256_srli_epi32(v1, 4);
}

/* The 32 values of block i (sub-block j of a k-quant super-block) of a row, as 4 x 8 floats.
 * k-quants take their super-block's d * sc and dmin * m (or Q6_K's d * sc per 16) in dl, ml. */
QW_TARGET_AVX2 INLINE void block_values(const int T, const uint8_t *row, int64_t i, int j, const float *dl,
                                        const float *ml, __m256 v[4]) {
    __m256i c[4];
    switch (T) {
    case QW_Q4_0: case QW_Q5_0: case QW_Q8_0: {
        const int bytes = T == QW_Q4_0 ? 18 : T == QW_Q5_0 ? 22 : 34;
        const uint8_t *b = row + (size_t)i * bytes;
        if (T == QW_Q4_0) {
            nibble_dw(b + 2, c);
            for (int k = 0; k < 4; k++) c[k] = _mm256_sub_epi32(c[k], _mm256_set1_epi32(8));
        } else if (T == QW_Q5_0) {
            nibble_dw(b + 6, c);
            for (int k = 0; k < 4; k++) c[k] = _mm256_or_si256(c[k], high_bits(q5_0_high, b[2 + k]));
        } else {
            for (int k = 0; k < 4; k++) c[k] = s8x8_epi32(b + 2 + 8 * k);
        }
        __m256 d = _mm256_set1_ps(f16_avx2(b));
        for (int k = 0; k < 4; k++) v[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(c[k]), d);
        return;
    }
    case QW_Q4_1: case QW_Q5_1: {
        const uint8_t *b = row + (size_t)i * (T == QW_Q4_1 ? 20 : 24);
        nibble_dw(b + (T == QW_Q4_1 ? 4 : 8), c);
        if (T == QW_Q5_1)
            for (int k = 0; k < 4; k++) c[k] = _mm256_or_si256(c[k], high_bits(q5_1_high, b[4 + k]));
        __m256 d = _mm256_set1_ps(f16_avx2(b)), m = _mm256_set1_ps(f16_avx2(b + 2));
        for (int k = 0; k < 4; k++) v[k] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c[k]), d), m);
        return;
    }
    case QW_Q4_K: case QW_Q5_K: {
        const uint8_t *b = row + (size_t)i * (T == QW_Q4_K ? 144 : 176);
        const uint8_t *qs = b + (T == QW_Q4_K ? 16 : 48) + 32 * (j / 2);
        for (int g = 0; g < 4; g++) {
            __m256i w = u8x8_epi32(qs + 8 * g);
            c[g] = (j & 1) ? _mm256_srli_epi32(w, 4) : _mm256_and_si256(w, _mm256_set1_epi32(0x0F));
            if (T == QW_Q5_K) {
                __m256i h = _mm256_srl_epi32(u8x8_epi32(b + 16 + 8 * g), _mm_cvtsi32_si128(j));
                c[g] = _mm256_or_si256(c[g], _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(1)), 4));
            }
        }
        /* - ml as + (-ml), as the dequantizer */
        __m256 d = _mm256_set1_ps(dl[j]), m = _mm256_set1_ps(-ml[j]);
        for (int k = 0; k < 4; k++) v[k] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c[k]), d), m);
        return;
    }
    default: { /* Q6_K: sub-block j = 4 h + k is values 128 h + 32 k + l, codes assembled 32 at a time */
        const uint8_t *b = row + (size_t)i * 210;
        int h = j / 4, k = j % 4;
        __m256i q = q6k_codes(b + 64 * h, b + 128 + 32 * h, k);
        __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        __m256 d0 = _mm256_set1_ps(dl[2 * j]), d1 = _mm256_set1_ps(dl[2 * j + 1]);
        v[0] = _mm256_mul_ps(s8x8_ps(lo), d0);
        v[1] = _mm256_mul_ps(s8x8_ps(_mm_unpackhi_epi64(lo, lo)), d0);
        v[2] = _mm256_mul_ps(s8x8_ps(hi), d1);
        v[3] = _mm256_mul_ps(s8x8_ps(_mm_unpackhi_epi64(hi, hi)), d1);
        return;
    }
    }
}

/* Q4_K / Q5_K: the 64 values of sub-blocks 2c and 2c + 1 of super-block i (v[0..4) and
 * v[4..8)), from one widening of their 32 shared code bytes. */
QW_TARGET_AVX2 INLINE void kquant_pair_values(const int T, const uint8_t *row, int64_t i, int c, const float *dl,
                                              const float *ml, __m256 v[8]) {
    const uint8_t *b = row + (size_t)i * (T == QW_Q4_K ? 144 : 176);
    const uint8_t *qs = b + (T == QW_Q4_K ? 16 : 48) + 32 * c;
    const __m256i low4 = _mm256_set1_epi32(0x0F), one = _mm256_set1_epi32(1);
    __m256 d0 = _mm256_set1_ps(dl[2 * c]), m0 = _mm256_set1_ps(-ml[2 * c]);
    __m256 d1 = _mm256_set1_ps(dl[2 * c + 1]), m1 = _mm256_set1_ps(-ml[2 * c + 1]);
    for (int g = 0; g < 4; g++) {
        __m256i w = u8x8_epi32(qs + 8 * g);
        __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_srli_epi32(w, 4);
        if (T == QW_Q5_K) {
            __m256i h = _mm256_srl_epi32(u8x8_epi32(b + 16 + 8 * g), _mm_cvtsi32_si128(2 * c));
            lo = _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(h, one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 1), one), 4));
        }
        /* - ml as + (-ml), as the dequantizer */
        v[g] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lo), d0), m0);
        v[4 + g] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(hi), d1), m1);
    }
}

/* A k-quant super-block's per-sub-block scales as the dequantizer forms them. */
QW_TARGET_AVX2 INLINE void super_scales(const int T, const uint8_t *row, int64_t i, float *dl, float *ml) {
    if (T == QW_Q6_K) { /* d * sc per 16 values */
        const uint8_t *b = row + (size_t)i * 210;
        __m256 d = _mm256_set1_ps(f16_avx2(b + 208));
        _mm256_storeu_ps(dl, _mm256_mul_ps(_mm256_cvtepi32_ps(s8x8_epi32(b + 192)), d));
        _mm256_storeu_ps(dl + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(s8x8_epi32(b + 200)), d));
    } else { /* d * sc and dmin * m per sub-block, from the 6-bit fields unpacked in 64-bit words */
        const uint8_t *b = row + (size_t)i * (T == QW_Q4_K ? 144 : 176);
        uint64_t sc, m;
        kquant_scale_bytes(b, &sc, &m);
        __m256 vsc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
        __m256 vm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m)));
        _mm256_storeu_ps(dl, _mm256_mul_ps(vsc, _mm256_set1_ps(f16_avx2(b))));
        _mm256_storeu_ps(ml, _mm256_mul_ps(vm, _mm256_set1_ps(f16_avx2(b + 2))));
    }
}

/* Where byte `at` of the group's first row lies, counting on into the next groups' rows. */
INLINE const uint8_t *group_place(const uint8_t *w, size_t stride, int ROWS, int64_t row, int64_t at) {
    int64_t g = 0;
    if (at >= 8 * row) /* short rows: a division, not a long loop */
        g = at / row * ROWS, at %= row;
    for (; at >= row; at -= row) g += ROWS;
    return w + (size_t)g * stride + at;
}

/* A group's ROWS rows (`row` bytes of each read, `stride` bytes apart) are ROWS short streams
 * read side by side, which the hardware prefetchers cannot get ahead of. Read in that order, the
 * bytes [off, off + n) of each row are followed by QW_PREFETCH_AHEAD / ROWS more bytes of each
 * (in the same rows while they last, then in the next groups' rows): those lines are asked into
 * L1, and the ones QW_PREFETCH_FAR on into L2, as the integer products do with their one stream
 * (kernels.h). Asking instead for the same place of the next ROWS rows into L1 (and, for the
 * float types, of the ROWS rows 3 ROWS on into L2) put the lines as far ahead as whole rows are
 * long: past L1 for the long rows of the FFN's down product. On a 2-core Zen 4, the demo's BF16
 * decode went from 24.7-28.4 to 30.5-44.5 tok/s (alternating runs, the bandwidth probe at 34-36
 * GB/s), its f32-mode decode of the stored types about the same (median 30.7 -> 32.1). On a Xeon
 * with 2 MiB of L2 a core the old lines had given 82-88% of the probe (one L2 stream 16-128 KiB
 * ahead of the whole group instead: 75-82%); these were not measured there. A hint: past the
 * matrix it is dropped. */
QW_TARGET_AVX2 INLINE void prefetch_group(const uint8_t *w, size_t stride, const int ROWS, int64_t row, int64_t off,
                                          int64_t n) {
    const uint8_t *near = group_place(w, stride, ROWS, row, off + QW_PREFETCH_AHEAD / ROWS);
    const uint8_t *far = group_place(w, stride, ROWS, row, off + QW_PREFETCH_FAR / ROWS);
    for (int64_t b = 0; b < n; b += 64)
        for (int r = 0; r < ROWS; r++) {
            _mm_prefetch((const char *)(near + (size_t)r * stride + b), _MM_HINT_T0);
            _mm_prefetch((const char *)(far + (size_t)r * stride + b), _MM_HINT_T1);
        }
}

/* Chains of ROWS (4 or 1) rows, `stride` bytes apart, over the K values of x. */
QW_TARGET_AVX2 INLINE void frows(const int T, const int ROWS, const uint8_t *w, size_t stride, const float *x, int64_t K,
                                 qw_fdot_acc *acc) {
    const int kq = T == QW_Q4_K || T == QW_Q5_K || T == QW_Q6_K, bs = kq ? 256 : 32;
    __m256 a[4];
    float dl[4][16], ml[4][8];
    for (int r = 0; r < ROWS; r++) a[r] = _mm256_loadu_ps(acc[r].lane);
    const int bb = T == QW_Q4_0 ? 18 : T == QW_Q4_1 ? 20 : T == QW_Q5_0 ? 22 : T == QW_Q5_1 ? 24 : T == QW_Q8_0 ? 34 :
                   T == QW_Q4_K ? 144 : T == QW_Q5_K ? 176 : 210;
    for (int64_t i = 0; i < K / bs; i++) {
        { /* the lines that start in this block's bytes (once each where blocks are short) */
            const int64_t first = (i * bb + 63) / 64, end = ((i + 1) * bb + 63) / 64;
            if (end > first) prefetch_group(w, stride, ROWS, K / bs * bb, 64 * first, 64 * (end - first));
        }
        if (kq)
            for (int r = 0; r < ROWS; r++) super_scales(T, w + r * stride, i, dl[r], ml[r]);
        if (T == QW_Q4_K || T == QW_Q5_K) { /* sub-blocks 2c and 2c + 1 share their 32 code bytes */
            for (int c = 0; c < 4; c++) {
                const float *xb = x + i * bs + 64 * c;
                __m256 xv[8];
                for (int k = 0; k < 8; k++) xv[k] = _mm256_loadu_ps(xb + 8 * k);
                for (int r = 0; r < ROWS; r++) {
                    __m256 v[8];
                    kquant_pair_values(T, w + r * stride, i, c, dl[r], ml[r], v);
                    for (int k = 0; k < 8; k++) a[r] = _mm256_fmadd_ps(v[k], xv[k], a[r]);
                }
            }
            continue;
        }
        for (int j = 0; j < bs / 32; j++) {
            const float *xb = x + i * bs + 32 * j;
            __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
            __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
            for (int r = 0; r < ROWS; r++) {
                __m256 v[4];
                block_values(T, w + r * stride, i, j, dl[r], ml[r], v);
                a[r] = _mm256_fmadd_ps(v[0], x0, a[r]);
                a[r] = _mm256_fmadd_ps(v[1], x1, a[r]);
                a[r] = _mm256_fmadd_ps(v[2], x2, a[r]);
                a[r] = _mm256_fmadd_ps(v[3], x3, a[r]);
            }
        }
    }
    for (int r = 0; r < ROWS; r++) _mm256_storeu_ps(acc[r].lane, a[r]);
}

/* Float types: 8 values a time, converted exactly. */
QW_TARGET_AVX2 INLINE __m256 float_values(const int T, const uint8_t *row, int64_t k) {
    if (T == QW_F16) return load_f16x8((const uint16_t *)row + k);
    if (T == QW_BF16) return load_bf16x8((const uint16_t *)row + k);
    return _mm256_loadu_ps((const float *)row + k);
}

QW_TARGET_AVX2 INLINE void frows_float(const int T, const int ROWS, const uint8_t *w, size_t stride, const float *x,
                                       int64_t K8, qw_fdot_acc *acc) {
    __m256 a[4];
    for (int r = 0; r < ROWS; r++) a[r] = _mm256_loadu_ps(acc[r].lane);
    const int es = T == QW_F32 ? 4 : 2;
    for (int64_t k = 0; k < K8; k += 8) {
        if ((k * es) % 64 == 0) prefetch_group(w, stride, ROWS, K8 * es, k * es, 64);
        __m256 xv = _mm256_loadu_ps(x + k);
        for (int r = 0; r < ROWS; r++) a[r] = _mm256_fmadd_ps(float_values(T, w + r * stride, k), xv, a[r]);
    }
    for (int r = 0; r < ROWS; r++) _mm256_storeu_ps(acc[r].lane, a[r]);
}

#define FROWS(T, NAME)                                                                                          \
    QW_TARGET_AVX2 static void frows4_##NAME(const uint8_t *w, size_t s, const float *x, int64_t K, qw_fdot_acc *a) { \
        frows(T, 4, w, s, x, K, a);                                                                              \
    }                                                                                                            \
    QW_TARGET_AVX2 static void frows1_##NAME(const uint8_t *w, size_t s, const float *x, int64_t K, qw_fdot_acc *a) { \
        frows(T, 1, w, s, x, K, a);                                                                              \
    }
#define FROWS_FLOAT(T, NAME)                                                                                    \
    QW_TARGET_AVX2 static void frows4_##NAME(const uint8_t *w, size_t s, const float *x, int64_t K, qw_fdot_acc *a) { \
        frows_float(T, 4, w, s, x, K & ~(int64_t)7, a);                                                          \
    }                                                                                                            \
    QW_TARGET_AVX2 static void frows1_##NAME(const uint8_t *w, size_t s, const float *x, int64_t K, qw_fdot_acc *a) { \
        frows_float(T, 1, w, s, x, K & ~(int64_t)7, a);                                                          \
    }
FROWS(QW_Q4_0, q4_0)
FROWS(QW_Q4_1, q4_1)
FROWS(QW_Q5_0, q5_0)
FROWS(QW_Q5_1, q5_1)
FROWS(QW_Q8_0, q8_0)
FROWS(QW_Q4_K, q4_k)
FROWS(QW_Q5_K, q5_k)
FROWS(QW_Q6_K, q6_k)
FROWS_FLOAT(QW_F32, f32)
FROWS_FLOAT(QW_F16, f16)
FROWS_FLOAT(QW_BF16, bf16)

QW_TARGET_AVX2 void qw_dequant_bf16_half_avx2(const uint16_t *half, int rows, int64_t K, float *dst) {
    for (int64_t k = 0; k < K; k += 8)
        for (int r = 0; r < rows; r++) _mm256_storeu_ps(dst + r * K + k, load_bf16x8(half + 4 * k + 8 * r));
}

QW_TARGET_AVX2 void qw_fdot_group_bf16_avx2(const uint8_t *group, int rows, const float *x, int64_t K,
                                            qw_fdot_acc *acc) {
    for (int h = 0; 4 * h < rows; h++) {
        const uint16_t *w = (const uint16_t *)group + (size_t)h * 4 * (size_t)K;
        int n = rows - 4 * h < 4 ? rows - 4 * h : 4; /* the rest of the half are padding rows */
        __m256 a[4];
        for (int r = 0; r < 4; r++) a[r] = r < n ? _mm256_loadu_ps(acc[4 * h + r].lane) : _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k += 8) {
            const uint16_t *line = w + 4 * k; /* values k .. k + 7 of the 4 rows: one cache line */
            _mm_prefetch((const char *)line + QW_PREFETCH_AHEAD, _MM_HINT_T0);
            _mm_prefetch((const char *)line + QW_PREFETCH_FAR, _MM_HINT_T1);
            __m256 xv = _mm256_loadu_ps(x + k);
            for (int r = 0; r < 4; r++) a[r] = _mm256_fmadd_ps(load_bf16x8(line + 8 * r), xv, a[r]);
        }
        for (int r = 0; r < n; r++) _mm256_storeu_ps(acc[4 * h + r].lane, a[r]);
    }
}

void qw_fdot_rows_avx2(int dtype, const uint8_t *w, size_t stride, int rows, const float *x, int64_t K, qw_fdot_acc *acc) {
    typedef void (*fn)(const uint8_t *, size_t, const float *, int64_t, qw_fdot_acc *);
    fn f4, f1;
#define CASE(T, NAME) case T: f4 = frows4_##NAME; f1 = frows1_##NAME; break;
    switch (dtype) {
    CASE(QW_Q4_0, q4_0) CASE(QW_Q4_1, q4_1) CASE(QW_Q5_0, q5_0) CASE(QW_Q5_1, q5_1) CASE(QW_Q8_0, q8_0)
    CASE(QW_Q4_K, q4_k) CASE(QW_Q5_K, q5_k) CASE(QW_Q6_K, q6_k) CASE(QW_F32, f32) CASE(QW_F16, f16) CASE(QW_BF16, bf16)
    default: return;
    }
#undef CASE
    int r = 0;
    for (; r + 4 <= rows; r += 4) f4(w + (size_t)r * stride, stride, x, K, acc + r);
    for (; r < rows; r++) f1(w + (size_t)r * stride, stride, x, K, acc + r);
}

#endif /* QW_HAVE_X86 */
