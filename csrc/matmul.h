/* Matrix products against stored weights (any type of quant.h), parallel over output rows. */
#ifndef QWENC_MATMUL_H
#define QWENC_MATMUL_H

#include <stddef.h>
#include <stdint.h>

/* Y[M,N] = X[M,K] · W[N,K]ᵀ (+ bias[N] when bias is not NULL).
 * W is N rows of K elements stored as `dtype` (row stride qw_row_bytes(dtype, K)); X, Y float32.
 *
 * Batch invariance: each output row depends only on its own X row (and W, bias, act), never on
 * M, on the other rows, on how the work is split or on the thread count. Every path (decode's
 * few rows, prefill's tiles) computes each output in the one reduction order of its
 * (weight type, act) pair, so a sequence gets the same bits whatever it is batched with.
 *
 * act picks the arithmetic on block-quantized weights, for every row of every call:
 * QW_ACT_F32: float32 activations times exactly widened weights, in fdot.h's order: the function
 * the file describes computed to float rounding (what transformers computes on the dequantized
 * model). QW_ACT_INT16: each X row rounded to a 16-bit act row (quant.h, within 1/65000 of each
 * 32-value block's largest value) and integer dots: products within ~1e-5 of float arithmetic
 * at a fraction of its work. QW_ACT_INT8: 8-bit act rows, the least work, but an activation
 * error of up to 1/254 of the block's largest value, enough to flip a near-tie between two
 * tokens. Float weights (F32, F16, BF16) always take the float path. The integer codes are the
 * act rows' bits (quant.h).
 *
 * Returns 0, or QW_ENOMEM when a buffer could not be allocated (Y is then partly unwritten). */
#define QW_ACT_F32 0
#define QW_ACT_INT8 8
#define QW_ACT_INT16 16
#define QW_ENOMEM (-1)

int qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
              const float *bias, int act);

/* One matrix of a group product: Y[M, N] = X · Wᵀ (+ bias), W of `dtype`. */
typedef struct {
    const void *W;
    int dtype;
    int64_t N;
    float *Y;
    const float *bias;
} qw_product;

/* The products of several matrices with the same X[M, K] (a layer's q, k and v, or gate and
 * up): one parallel pass over all their rows (per QW_GROUP_MAX matrices), each output exactly
 * what qw_matmul computes. Returns 0 or QW_ENOMEM. */
#define QW_GROUP_MAX 16
int qw_matmul_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act);
/* An MLP's gate and up products (p[0], p[1], with the same N) and silu(gate) * up into p[0].Y, as
 * qw_matmul_group and qw_silu_mul give it; p[1].Y is scratch. On the AMX path each item takes both products'
 * same rows and writes only the joined outputs: the up product's outputs never go to memory and
 * there is no second pass over the gate's. */
int qw_matmul_swiglu(const qw_product p[2], int64_t K, const float *X, int64_t M, int act);

/* Whether a 16-bit product of M act rows takes the vertical kernels on the current path. */
int qw_vertical_pays(int64_t M);

/* Bytes of act rows per round of the integer path (matmul.c), and a setting for it: 0 takes the
 * default from the core's L2 again. For tests, which need rounds of a known size. */
size_t qw_act_round_bytes(void);
void qw_set_act_round_bytes(size_t bytes);

#endif
