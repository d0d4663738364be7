/* Matrix products against stored weights (any type of quant.h), parallel over output rows. */
#ifndef QWENC_MATMUL_H
#define QWENC_MATMUL_H

#include <stdint.h>

/* Y[M,N] = X[M,K] · W[N,K]ᵀ (+ bias[N] when bias is not NULL).
 * W is N rows of K elements stored as `dtype` (row stride qw_row_bytes(dtype, K)); X, Y float32.
 * Small M (decode) streams each weight row once through a fused dot product; larger M
 * (prefill) widens blocks of weight rows into a float32 tile and reuses it across all M rows. */
void qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
               const float *bias);

#endif
