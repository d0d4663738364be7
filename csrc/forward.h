/* The decoder layers of one step, run in C from start to end: what qwenc/model/forward.py's
 * `_block` does per layer, the same kernels in the same order (so the same bits), without a
 * return to Python between the fifteen or so kernels of a layer and with the GIL released for
 * the whole step. Decode gained 13% at 1 thread; at 2 threads the Python time had mostly hidden
 * behind the other thread's wait at each kernel's barrier, which this loop still pays. */
#ifndef QWENC_FORWARD_H
#define QWENC_FORWARD_H

#include <stdint.h>

#include "matmul.h"
#include "moe.h"

/* One decoder layer: its weights (products write into the step's buffers) and KV pools. */
typedef struct {
    const float *attn_norm, *mlp_norm; /* [hidden] */
    const float *q_norm, *k_norm;      /* [head_dim] (Qwen3), or NULL */
    qw_product qkv[3];                 /* Y: the step's q, k, v buffers */
    qw_product o;                      /* Y: the step's o buffer */
    qw_product gate_up[2];             /* Y: the step's gate, up buffers */
    qw_product down;                   /* Y: the step's o buffer */
    const qw_moe *moe;                 /* a layer of experts (in place of gate, up, down), or NULL */
    void *Kc, *Vc;                     /* [kv_heads, n_blocks, head_dim, bs], [kv_heads, n_blocks, bs, head_dim] */
} qw_layer;

/* The shapes and the step's buffers, rows of the widths below (row t of each is token t). */
typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, inter;
    float eps, scale;
    const float *inv_freq; /* [head_dim / 2] */
    float rope_mscale;     /* cos and sin scale (YaRN's attention factor; 1 without scaling) */
    int act;               /* QW_ACT_* */
    int kv_type;           /* QW_KV_* of the pools */
    int64_t n_blocks, bs;  /* KV blocks per pool, positions per block */
    float *x, *h;          /* [T, hidden]: residual stream, normalised input of a sub-block */
    float *q, *k, *v;      /* [T, heads * head_dim], [T, kv_heads * head_dim] x 2 */
    float *attn, *o;       /* [T, heads * head_dim], [T, hidden] */
    float *gate, *up;      /* [T, inter] */
    float *rope;           /* [T, head_dim]: each row's RoPE cosines, then sines (qw_rope_table) */
    void *moe_scratch;     /* qw_moe_scratch_bytes of every layer of experts, for T rows */
} qw_stack;

/* Runs layers [0, n) over the T rows in s->x (updated in place), every row in one KV cache:
 * row t's key and value go to slot slots[t], and it attends to positions 0 .. pos[t] of
 * sequence row_seq[t] (a row of block_tables [*, max_blocks]). The caller has checked every
 * slot and block id against the pools. Returns 0, or QW_ENOMEM when a kernel's scratch could
 * not be allocated (x is then undefined). */
int qw_forward_layers(const qw_stack *s, const qw_layer *layers, int n, int64_t T, const int64_t *pos,
                      const int64_t *slots, const int32_t *block_tables, int64_t max_blocks, const int32_t *row_seq);

#endif
