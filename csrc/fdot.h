/* The float32 dot product of the "f32" activation mode, in one reduction order.
 *
 * Every f32-mode product (float weights in any mode, block-quantized weights with float
 * activations) computes each output as the dot of an exactly widened weight row w (quant.h's
 * qw_dequant_row) with a float32 activation row x, always in this order:
 *
 *   AVX2:  eight lanes, acc = fma(w[k..k+8), x[k..k+8), acc) for k = 0, 8, 16, ... (one chain
 *          per output), then s = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), then the
 *          K % 8 last products added one by one: s = s + w[k] * x[k].
 *   plain: the same with a separate multiply and add per lane (no fused multiply-add), lanes
 *          summed ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), then the last products.
 *
 * So an output depends on its weight row and its activation row only: not on how many other
 * rows share the product, how they are tiled, or which thread runs it. The single-row, tiled and
 * chunked entry points below all implement exactly that order (the AVX2 and plain paths differ
 * from each other at float rounding).
 */
#ifndef QWENC_FDOT_H
#define QWENC_FDOT_H

#include <stdint.h>

/* A dot product in progress: the eight lanes of its chain. */
typedef struct {
    float lane[8];
} qw_fdot_acc;

void qw_fdot_start(qw_fdot_acc *a);
/* Continue the chain over n more values (n a multiple of 8). */
void qw_fdot_step(qw_fdot_acc *a, const float *w, const float *x, int64_t n);
/* The result: the lanes summed, then the `tail` (< 8) last products w[i] * x[i] added in order. */
float qw_fdot_finish(const qw_fdot_acc *a, const float *w, const float *x, int64_t tail);

/* The whole dot of w and x over K values. */
float qw_fdot(const float *w, const float *x, int64_t K);

/* Continue the chains acc[m * nb + j] (m < M, j < nb) over n more values (a multiple of 8): of
 * weight rows T + j * ldt and activation rows X + m * ldx. Decode's products widen their weight
 * rows a piece at a time into L1 and run this over each piece. */
void qw_fdot_steps(qw_fdot_acc *acc, const float *T, int64_t ldt, int64_t nb, const float *X, int64_t ldx, int64_t M,
                   int64_t n);

/* Y[m * ldy + j] = qw_fdot(T + j * K, X + m * K, K) for j < nb, m < M: a tile of nb widened
 * weight rows against M activation rows, register-blocked (each loaded vector feeds several
 * chains) but every output in the order above. */
void qw_fdot_tile(const float *T, int64_t nb, int64_t K, const float *X, int64_t M, float *Y, int64_t ldy);

#endif
