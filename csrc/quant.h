/* Weight storage types and their row kernels.
 *
 * Type codes are GGML's, so a GGUF tensor's type field is used as is and safetensors dtypes map
 * onto the same numbers. A weight matrix is stored row-major, one row per output feature; a row
 * of n elements is n / block_size blocks of block_bytes each (float types have 1-element blocks).
 *
 * Per type, with a plain and an AVX2 path chosen at run time:
 *   qw_dequant_row: widen one row to float32, bit for bit the reference formula (quant.c,
 *                   quant_avx2.c);
 *   qw_dot_row:     a stored row dotted with a float32 vector in the f32 mode's one order
 *                   (fdot.h): what qw_matmul computes for that row with float activations;
 *   the integer path (below): act rows (act.c) and integer dots on row-interleaved layouts
 *                   (intdot.c, intdot_avx2.c).
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
 * q2 = round(256 (x / d - q1)), clamped to +-127, so x ~ d q1 + (d / 256) q2. Its bsums are
 * those of q2; its s is the whole row's block value sum, (d / 256) (256 sum q1 + sum q2). The
 * dot joins the two levels' integer block sums before any float work (the order below).
 *
 * Below, `bits` is 8 or 16. */

/* Bytes of an act row of n values for weights of `dtype`; 0 when `dtype` has no integer dot
 * (or bits is neither 8 nor 16). */
size_t qw_act_bytes(int dtype, int64_t n, int bits);
/* Quantize x[0..n) into an act row (n a multiple of 32 and of dtype's block; nothing is written
 * when qw_act_bytes(dtype, n, bits) is 0). */
void qw_quantize_act(int dtype, const float *x, void *dst, int64_t n, int bits);
/* sum_i row[i] * xhat[i] over the n values of a stored row, xhat the values of the act row xq:
 * exactly what qw_matmul computes for that row in the int8 / int16 mode (the order below). */
float qw_dot_row_act(int dtype, const void *row, const void *xq, int64_t n, int bits);

/* ---------------------------------------------------------------- the integer dot's one order
 *
 * Every integer-mode output (weight row w, act row x) is computed in this order, by every path:
 *
 *   for each 32-value block b in order (a k-quant's sub-blocks in order; Q6_K: each of a
 *   sub-block's two 16-value groups in turn, each with its own scale):
 *       I_b = the block's exact integer sum of weight codes times act codes (offsets such as
 *             Q4_0's 8 taken off in integers)
 *       S_b = the block's float32 scale: D (a k-quant's d) times the k-quant's 6- or 8-bit
 *             integer scale of the block (exact: an f16 times an 8-bit integer)
 *       acc = acc + (float)I_b * (S_b * dx_b)      dx_b the act block's scale
 *       with mins: macc = macc + M_b * s_b   M_b: Q4_1/Q5_1's m, Q4_K/Q5_K's dmin * m_b
 *   result = acc + macc (Q4_1, Q5_1), acc - macc (Q4_K, Q5_K), acc (the others)
 *
 * A 16-bit act row is d2 = d / 256 times the codes 256 q1 + q2: its two levels join in integers,
 * I_b = 256 I1_b + I2_b, with dx_b = d2 and s_b = level 2's s (d2 (256 sum q1 + sum q2)), so a
 * block costs one float update as with 8 bits. No integer can overflow: |256 q1 + q2| <= 32639,
 * and a block sum is at most 32 x 255 x 32639 < 2^28. (float)I_b rounds to nearest where |I_b|
 * passes 2^24 (Q5_1, Q5_K and Q8_0 with 16-bit rows). The SIMD paths form each
 * `acc + I * (S dx)` with one fused multiply-add, the plain path with a multiply and an add;
 * everything else is the same. Integer sums are exact however they are formed, so kernels may
 * group the integer work as they like (many rows at once, several activation rows per unpacked
 * block) without changing a bit.
 *
 * ---------------------------------------------------------------- row-interleaved layouts
 *
 * For the integer path, weights can be repacked (once, at load) into a layout that interleaves
 * 8 rows: the 8 rows' codes of a 32-value block lie so that one 32-byte vector holds 4
 * consecutive codes of each of the 8 rows, and one multiply of it by 4 broadcast act codes
 * advances all 8 rows' sums. Unpacking a block (nibbles, fifth or high bits) then costs a few
 * vector operations for 8 rows, and is done once for all the act rows of a product. The type
 * code of a repacked matrix is QW_R8 + the stored type's code; it holds the same values (every
 * mode computes the same bits on it as on the stored layout) in about the same bytes, with its
 * row count rounded up to 8 (padding rows are zeros). Layouts: intdot.c. */
#define QW_R8 256

/* QW_R8 + dtype for a type with a repacked layout (those with an integer dot, and BF16, whose
 * layout serves the float row kernel; K a multiple of 8 for it), else 0. */
int qw_r8_of(int dtype);
/* Bytes of an N x K matrix of type `dtype` (a stored type or a repacked one). */
size_t qw_matrix_bytes(int dtype, int64_t N, int64_t K);
/* Repack N stored rows of K values of type `dtype` into dst (qw_matrix_bytes(qw_r8_of(dtype),
 * N, K) bytes). */
void qw_repack_r8(int dtype, const void *src, int64_t N, int64_t K, void *dst);
/* Row n of a matrix of any supported type (stored or repacked) widened to float32, bit for bit
 * what qw_dequant_row gives for the stored row. */
void qw_dequant_matrix_row(int dtype, const void *W, int64_t K, int64_t n, float *dst);
/* Rows n0 .. n0 + nb - 1 of it so, into dst (K floats a row): a repacked BF16 matrix's whole
 * groups read in their layout's order. */
void qw_dequant_matrix_rows(int dtype, const void *W, int64_t K, int64_t n0, int64_t nb, float *dst);

/* Scalar conversions, exact (round-to-nearest-even on the way down). */
float qw_f16_to_f32(uint16_t h);
uint16_t qw_f32_to_f16(float f);
float qw_bf16_to_f32(uint16_t h);

#endif
