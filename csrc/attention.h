/* Causal grouped-query attention of new tokens over a sequence's KV cache. */
#ifndef QWENC_ATTENTION_H
#define QWENC_ATTENTION_H

#include <stdint.h>

/* q:   [T, n_heads, hd]       queries of T new tokens at positions start .. start+T-1
 * K,V: [n_kv_heads, cap, hd]  the cache, already holding positions 0 .. start+T-1
 * out: [T, n_heads, hd]
 * Query head h reads kv head h / (n_heads / n_kv_heads); token t sees positions 0 .. start+t.
 * Scores are scaled by `scale` and softmaxed with the row max subtracted. */
void qw_attention(const float *q, const float *K, const float *V, int64_t T, int64_t start, int64_t n_heads,
                  int64_t n_kv_heads, int64_t hd, int64_t cap, float scale, float *out);

#endif
