/* The block-quantized layouts and the small helpers the kernel files share (internal to csrc/).
 *
 * quant.c holds the formats' plain reference (dequantizers), quant_avx2.c their AVX2 twins,
 * act.c the activation rows of the integer path, intdot.c / intdot_avx2.c its dot products. */
#ifndef QWENC_QBLOCK_H
#define QWENC_QBLOCK_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

/* ---------------------------------------------------------------- act block scales
 *
 * Shared by act.c's quantizers and the fused AMX one (intdot_amx.c), which must agree bit for bit. */

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
 * reference's float32 bit for bit. The float dots (fdot.h) multiply exactly those values; the
 * integer dots (quant.h) sum codes in integers per block and scale each block sum once.
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

/* ---------------------------------------------------------------- codes of a block
 *
 * A block's small integer codes, by simple loops that compilers vectorize for whatever SIMD the
 * target has: the plain dequantizers widen them, the integer path repacks them. */

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

/* Q4_K/Q5_K: the 8 6-bit scales (*sc) and mins (*m) of a super-block, one per byte. The 12 scale
 * bytes are unpacked four at a time in 32-bit words (the first four 6-bit values are the low bits
 * of words 0 and 1; the last four are nibbles of word 2 plus the top two bits of words 0 and 1). */
static inline void kquant_scale_bytes(const uint8_t *b, uint64_t *sc, uint64_t *m) {
    uint32_t w0 = rd_u32(b + 4), w1 = rd_u32(b + 8), w2 = rd_u32(b + 12);
    *sc = (w0 & 0x3F3F3F3Fu) | (uint64_t)((w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u)) << 32;
    *m = (w1 & 0x3F3F3F3Fu) | (uint64_t)(((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u)) << 32;
}

/* ---------------------------------------------------------------- act rows (quant.h)
 *
 * The pieces of an 8-bit act row of n values; ACT_HALF is its size, and the offset of a 16-bit
 * row's second level. */
#define ACT_HALF(n) ((size_t)(n) + 8 * (size_t)((n) / QK) + 2 * (size_t)((n) / 16))
#define ACT_D(xq, n) ((const float *)((const int8_t *)(xq) + (n)))
#define ACT_S(xq, n) (ACT_D(xq, n) + (n) / QK)
#define ACT_BSUMS(xq, n) ((const int16_t *)(ACT_S(xq, n) + (n) / QK))

/* The pieces of a joined 16-bit act row of n values (kernels.h): n int16, then level 2's d and s
 * per block; JOINED_BYTES is its size. */
#define JOINED_BYTES(n) (2 * (size_t)(n) + 8 * (size_t)((n) / QK))
#define JOINED_D(xj, n) ((const float *)((const uint8_t *)(xj) + 2 * (size_t)(n)))
#define JOINED_S(xj, n) (JOINED_D(xj, n) + (n) / QK)

/* 8 joined rows of n values transposed (kernels.h): per block, its 16 int32 pairs of codes as 16
 * vectors of the 8 rows' pair; then each block's 8 rows' d, then their s. VERT_BYTES is its size;
 * rows past the last one are zeros. */
#define VERT_BYTES(n) (16 * (size_t)(n) + 64 * (size_t)((n) / QK))
#define VERT_PAIRS(xv, b) ((const int32_t *)(xv) + 128 * (size_t)(b))
#define VERT_D(xv, n) ((const float *)((const uint8_t *)(xv) + 16 * (size_t)(n)))
#define VERT_S(xv, n) (VERT_D(xv, n) + 8 * (size_t)((n) / QK))

#endif
