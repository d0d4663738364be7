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

/* Scalar conversions, exact (round-to-nearest-even on the way down). */
float qw_f16_to_f32(uint16_t h);
uint16_t qw_f32_to_f16(float f);
float qw_bf16_to_f32(uint16_t h);

#endif
