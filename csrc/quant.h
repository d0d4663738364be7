/* Weight storage types and their row kernels.
 *
 * Type codes are GGML's, so a GGUF tensor's type field is used as is and safetensors dtypes map
 * onto the same numbers. A weight matrix is stored row-major, one row per output feature; a row
 * of n elements is n / block_size blocks of block_bytes each (float types have 1-element blocks).
 *
 * Two kernels per type, each with a plain and an AVX2 path chosen at run time:
 *   qw_dequant_row: widen one row to float32 (prefill tiles, tests, dtype conversion);
 *   qw_dot_row:     dot product of one stored row with a float32 vector, fused, without
 *                   materialising the widened row (decode's matrix-vector products).
 */
#ifndef QWENC_QUANT_H
#define QWENC_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum qw_dtype {
    QW_F32 = 0,
    QW_F16 = 1,
    QW_Q4_0 = 2,
    QW_Q4_1 = 3,
    QW_Q5_0 = 6,
    QW_Q5_1 = 7,
    QW_Q8_0 = 8,
    QW_Q4_K = 12,
    QW_Q5_K = 13,
    QW_Q6_K = 14,
    QW_BF16 = 30,
};

/* 1 when this library can compute with `dtype`. */
int qw_dtype_supported(int dtype);
/* Elements per block (1 for float types, 32 or 256 for block-quantized types); 0 if unsupported. */
int qw_block_size(int dtype);
/* Bytes per block; 0 if unsupported. */
int qw_block_bytes(int dtype);
/* Bytes taken by a row of n elements (n a multiple of the block size). */
size_t qw_row_bytes(int dtype, int64_t n);

/* dst[0..n) = float32 values of the stored row src. n is a multiple of the block size. */
void qw_dequant_row(int dtype, const void *src, float *dst, int64_t n);
/* sum_i row[i] * x[i] over n elements. n is a multiple of the block size. */
float qw_dot_row(int dtype, const void *row, const float *x, int64_t n);

/* Quantize n floats (a multiple of 32) to Q8_0 blocks: per 32 values, an f16 scale d = max|x|/127
 * and 32 int8 q = round(x / d). */
void qw_quantize_row_q8_0(const float *src, void *dst, int64_t n);

/* ---------------------------------------------------------------- integer path (decode)
 *
 * A matrix-vector product over a block-quantized weight may quantize its activation vector x
 * once to 8-bit codes and dot each weight row with it in integer arithmetic (the weight codes
 * times the activation codes, summed exactly per 32 values, then scaled once per 32 values).
 * The quantized activation row ("act row") of n values (a multiple of 32) has one layout for
 * every weight type, arrays rather than interleaved blocks, in qw_act_bytes(dtype, n, 8) bytes:
 *
 *   [q: n int8][d: n/32 float32][s: n/32 float32][bsums: n/16 int16]
 *
 * per block of 32 values: d = max|x| / 127, codes q = x * (1 / d) rounded to nearest, ties to
 * even (so |q| <= 127 and x ~ d * q), s = d * (sum of the block's q); bsums[g] is the sum of
 * q[16g .. 16g + 16). A block whose max|x| is below 1e-30 gets d = 0 and q = 0; a block holding
 * an infinity or NaN gets d = NaN and q = 0, so every dot product with it is NaN. The plain and
 * AVX2 quantizers write the same bytes. (The k-quants get per-32 scales too, not one per
 * 256-value super-block: Qwen's activations have outliers, and one scale per 256 values costs
 * those products several times the error.)
 *
 * The dot kernels compute every block's integer sum of code products exactly (s and bsums let
 * the AVX2 kernels take codes stored with an offset as unsigned bytes and take the offset off in
 * integers); the float work left is the scale products, the mins of Q4_1, Q5_1, Q4_K and Q5_K,
 * and the sum over blocks, so the plain and AVX2 paths agree to float32 rounding.
 */

/* 16-bit act rows: x to about 1/32500 of each block's largest value (8-bit rows: 1/254), which
 * keeps the products within ~1e-5 of float arithmetic, still on 8-bit integer multiplies.
 * A 16-bit row is two 8-bit act rows of the layout above, one after the other: level 1 is the
 * 8-bit row of x (d = max|x| / 127, q1 = round(x / d)); level 2 has scale d / 256 and codes
 * q2 = round(256 (x / d - q1)), clamped to +-127, so x ~ d q1 + (d / 256) q2. Its s and bsums are
 * those of q2 and d / 256. The dot is the sum of the 8-bit dots with the two levels (the plain
 * kernels compute exactly that); the AVX2 kernels unpack each weight block once for both.
 *
 * Below, `bits` is 8 or 16. */

/* Bytes of an act row of n values for weights of `dtype`; 0 when `dtype` has no integer dot
 * (or bits is neither 8 nor 16). */
size_t qw_act_bytes(int dtype, int64_t n, int bits);
/* Quantize x[0..n) into an act row (n a multiple of 32 and of dtype's block; nothing is written
 * when qw_act_bytes(dtype, n, bits) is 0). */
void qw_quantize_act(int dtype, const float *x, void *dst, int64_t n, int bits);
/* sum_i row[i] * xhat[i] over the n values of a stored row, xhat the values of the act row xq. */
float qw_dot_row_act(int dtype, const void *row, const void *xq, int64_t n, int bits);
/* The kernel qw_dot_row_act runs for `dtype` on the current SIMD setting (NULL when there is
 * none), for loops over many rows to call without dispatching each time. */
typedef float (*qw_dot_act_fn)(const void *row, const void *xq, int64_t n);
qw_dot_act_fn qw_dot_act_kernel(int dtype, int bits);

/* Scalar conversions, exact (round-to-nearest-even on the way down). */
float qw_f16_to_f32(uint16_t h);
uint16_t qw_f32_to_f16(float f);
float qw_bf16_to_f32(uint16_t h);

#endif
