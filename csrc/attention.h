/* Causal grouped-query attention over a paged KV cache.
 *
 * Keys and values of many sequences share one pool per layer, cut into blocks of `bs` token
 * slots: Kc is [n_kv_heads, n_blocks, hd, bs] (a block's keys transposed, a key down a column)
 * and Vc [n_kv_heads, n_blocks, bs, hd], so a block holds, per kv head, bs consecutive
 * positions' vectors contiguously, and a kv head's blocks follow one another: a sequence whose
 * blocks were handed out in order is one run of memory per head, which the thread attending
 * for that head streams (with the kv heads inside each block, each thread read half of every
 * block, and decode attention at 4,096 positions ran 1.2-1.8x longer). A sequence's positions
 * live in the blocks its block table lists: position p is slot p % bs of block table[p / bs].
 *
 * A pool holds float32 (QW_KV_F32) or IEEE half precision (QW_KV_F16, rounded to nearest even
 * when written). Half the bytes matter at long context, where reading the cache is most of a
 * decode step's memory traffic beside the weights; the arithmetic is float32 either way.
 */
#ifndef QWENC_ATTENTION_H
#define QWENC_ATTENTION_H

#include <stdint.h>

enum { QW_KV_F32 = 0, QW_KV_F16 = 1 };

/* Store the keys and values of T new tokens: k, v are [T, n_kv_heads, hd]; token t goes to
 * slot slots[t] (block * bs + offset) of the pools of n_blocks blocks, which hold kv_type
 * values. */
void qw_kv_write(const float *k, const float *v, int64_t T, int64_t n_kv_heads, int64_t hd,
                 const int64_t *slots, int64_t n_blocks, int64_t bs, int kv_type, void *Kc, void *Vc);
/* The same for token t alone (every kv head). */
void qw_kv_write_row(const float *k, const float *v, int64_t t, int64_t n_kv_heads, int64_t hd, const int64_t *slots,
                     int64_t n_blocks, int64_t bs, int kv_type, void *Kc, void *Vc);

/* out[t] = softmax(scale * q[t] K^T) V for T query rows of the sequences of one step.
 *
 * q, out:        [T, n_heads, hd]
 * row_seq[t]:    which sequence row t belongs to (a row of block_tables)
 * row_pos[t]:    its position; it attends to its sequence's positions 0 .. row_pos[t]
 * block_tables:  [n_seqs, max_blocks] block ids, valid up to block row_pos / bs of each row
 *
 * Query head h reads kv head h / (n_heads / n_kv_heads). Each (row, kv head) is computed on its
 * own, with a softmax that carries its running max and sum block by block (the max subtracted
 * before every exp), in spans of 1,024 positions whose states merge in order (so a long row is
 * several work items when the step has few rows), so a row's result depends on its own inputs
 * only: never on the other rows of the step or on the thread count. Returns 0, or -1 when scratch memory could not be allocated
 * or kv_type is unknown (out is then incomplete). */
int qw_paged_attention(const float *q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                       int kv_type, const void *Kc, const void *Vc, int64_t n_blocks, int64_t bs,
                       const int32_t *block_tables,
                       int64_t max_blocks, const int32_t *row_seq, const int64_t *row_pos, float scale,
                       float *out);

#endif
