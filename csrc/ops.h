/* Element-wise and per-row kernels of the transformer block. All float32, row-major. */
#ifndef QWENC_OPS_H
#define QWENC_OPS_H

#include <stdint.h>

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for M rows of D. Sums in double, in one fixed
 * order on every path. out may alias x. */
void qw_rmsnorm(const float *x, const float *w, float eps, int64_t M, int64_t D, float *out);
/* x += y (as numpy's float32 add), then out = rmsnorm(x): qw_rmsnorm's bits. */
void qw_add_rmsnorm(float *x, const float *y, const float *w, float eps, int64_t M, int64_t D, float *out);

/* Rotary embedding in place on x[T, H, hd] ("rotate_half" pairing: element i with i + hd/2), in
 * two halves, so that a step rotating many heads at the same positions (every layer's q and k)
 * takes their cos and sin once. qw_rope_table: for token t at position pos[t], the angle of pair
 * i is float32(pos * inv_freq[i]), rounded as the reference does, then cos/sin in double, into
 * cs[T, hd] (the hd / 2 cosines, then the sines, per row), each times mscale (YaRN's attention
 * factor; 1 without scaling, which leaves them exact). qw_rope_apply: x rotated with them. */
void qw_rope_table(int64_t T, int64_t hd, const int64_t *pos, const float *inv_freq, float mscale, float *cs);
void qw_rope_apply(float *x, int64_t T, int64_t H, int64_t hd, const float *cs);
/* One token's H heads rotated with its row c of the table. */
void qw_rope_row(float *x, int64_t H, int64_t hd, const float *c);

/* y[i * ldy + r] = res[i * ld + r] + b[r] for i < rows, r < cols (y may be res). */
void qw_add_rows(const float *res, int64_t ld, const float *b, int64_t rows, int cols, float *y, int64_t ldy);

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate. */
void qw_silu_mul(const float *gate, const float *up, int64_t n, float *out);
/* The same for a block of rows: out[m * ldo + c] = silu(gate[m * ldg + c]) * up[m * ldu + c] for
 * m < rows, c < cols, on the calling thread. Each value's bits are qw_silu_mul's: neither depends
 * on where a value lies. */
void qw_silu_mul_rows(const float *gate, int64_t ldg, const float *up, int64_t ldu, int64_t rows, int64_t cols,
                      float *out, int64_t ldo);

/* In-place softmax of M rows of n, the row max subtracted first so exp never overflows. */
void qw_softmax(float *x, int64_t M, int64_t n);

/* out[t] = widened row ids[t] of the stored table E (rows of D elements, type dtype). Returns 0,
 * or -1 (nothing written) when dtype has no kernel or D is not a multiple of its block size. */
int qw_embed(const void *E, int dtype, int64_t D, const int32_t *ids, int64_t T, float *out);

#endif
