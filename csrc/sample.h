/* Choosing the next token from a row of logits without sorting the whole vocabulary. */
#ifndef QWENC_SAMPLE_H
#define QWENC_SAMPLE_H

#include <stdint.h>

/* Index of the first maximum of x[0..n). */
int64_t qw_argmax(const float *x, int64_t n);

/* Sample a token from logits[0..n) (which it scales in place by 1/temperature), applying in order
 * top-k (0 = off), top-p (1 = off) and min-p (0 = off) as transformers' warpers do, then drawing
 * with the uniform number u in [0, 1). temperature <= 0 means greedy (argmax).
 * idx and val are scratch arrays of n entries. Returns the token id, QW_SAMPLE_EMPTY when n <= 0,
 * or QW_SAMPLE_NOMEM when the candidates top-p needs sorted could not be (no token is drawn). */
#define QW_SAMPLE_EMPTY (-1)
#define QW_SAMPLE_NOMEM (-2)
int64_t qw_sample(float *logits, int64_t n, float temperature, int64_t top_k, float top_p, float min_p,
                  double u, int32_t *idx, float *val);

/* For tests: the next n scratch allocations of qw_sample fail. */
void qw_sample_fail_allocs(int n);

#endif
