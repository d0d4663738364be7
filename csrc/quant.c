/* The stored weight types: conversions, the type table, the plain dequantizers (the reference
 * the SIMD ones match bit for bit), the float row dot and the Q8_0 quantizer. See quant.h. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "fdot.h"
#include "kernels.h"
#include "qblock.h"

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

/* A repacked type (QW_R8 + a stored type with an integer dot) has its stored type's blocks; its
 * "block bytes" are a row's share of a record (intdot.c), more than stored for Q4_K and Q5_K. */
static int r8_base(int dtype) { return dtype > QW_R8 && qw_r8_of(dtype - QW_R8) ? dtype - QW_R8 : -1; }

int qw_block_size(int dtype) {
    if (dtype >= QW_R8) /* BF16's records are 8 values of a row */
        return r8_base(dtype) == QW_BF16 ? 8 : r8_base(dtype) >= 0 ? qw_block_size(r8_base(dtype)) : 0;
    switch (dtype) {
    case QW_F32: case QW_F16: case QW_BF16: return 1;
    case QW_Q4_0: case QW_Q4_1: case QW_Q5_0: case QW_Q5_1: case QW_Q8_0: return 32;
    case QW_Q4_K: case QW_Q5_K: case QW_Q6_K: return 256;
    default: return 0;
    }
}

int qw_block_bytes(int dtype) {
    if (dtype >= QW_R8) {
        int base = r8_base(dtype);
        return base < 0 ? 0 : base == QW_Q4_K ? 148 : base == QW_Q5_K ? 180 : base == QW_BF16 ? 16 : qw_block_bytes(base);
    }
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

size_t qw_matrix_bytes(int dtype, int64_t N, int64_t K) {
    int64_t rows = dtype >= QW_R8 ? (N + 7) / 8 * 8 : N;
    return (size_t)rows * qw_row_bytes(dtype, K);
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


/* ---------------------------------------------------------------- block types: plain */

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

/* ---------------------------------------------------------------- dispatch */

typedef void (*dequant_fn)(const void *, float *, int64_t);

/* The dequantizer of `dtype` on the current SIMD setting, or NULL. F32 has no separate SIMD
 * dequantizer: it is a memcpy. */
static dequant_fn dequant_of(int dtype) {
#if QW_HAVE_X86
    int simd = qw_use_avx2();
#define PICK(T) (simd ? qw_dequant_##T##_avx2 : dequant_##T)
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
