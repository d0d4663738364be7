/* Matrix products against stored weights (any type of quant.h), parallel over output rows. */
#ifndef QWENC_MATMUL_H
#define QWENC_MATMUL_H

#include <stdint.h>

/* Y[M,N] = X[M,K] · W[N,K]ᵀ (+ bias[N] when bias is not NULL).
 * W is N rows of K elements stored as `dtype` (row stride qw_row_bytes(dtype, K)); X, Y float32.
 * Small M (decode) streams each weight row once through a fused dot product; larger M
 * (prefill) widens blocks of weight rows into a float32 tile and reuses it across all M rows.
 *
 * act picks the arithmetic of the small-M path on block-quantized weights. QW_ACT_F32: float32
 * activations times exactly widened weights, the function the file describes computed to float
 * rounding (what transformers computes on the dequantized model). QW_ACT_INT16: each X row
 * rounded to 16-bit act rows (quant.h, within 1/65000 of each 32-value block's largest value)
 * and integer dots: products within ~1e-5 of float arithmetic at a fraction of its work.
 * QW_ACT_INT8: 8-bit act rows, the least work, but an activation error of up to 1/254 of the
 * block's largest value, enough to flip a near-tie between two tokens. Float weights and the
 * large-M path ignore it. The integer codes are the act rows' bits (quant.h). */
#define QW_ACT_F32 0
#define QW_ACT_INT8 8
#define QW_ACT_INT16 16

void qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
               const float *bias, int act);

/* One matrix of a group product: Y[M, N] = X · Wᵀ (+ bias), W of `dtype`. */
typedef struct {
    const void *W;
    int dtype;
    int64_t N;
    float *Y;
    const float *bias;
} qw_product;

/* The products of up to QW_GROUP_MAX matrices with the same X[M, K] (a layer's q, k and v, or
 * gate and up): for decode-sized M, one parallel pass over all their rows, each row computed
 * exactly as qw_matmul computes it; more matrices or larger M run one qw_matmul each. */
#define QW_GROUP_MAX 4
void qw_matmul_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act);

#endif
