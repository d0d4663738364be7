/* A layer of experts (Qwen2-MoE, Qwen3-MoE): the router's softmax picks each row's top experts,
 * each picked expert's MLP runs on the rows that picked it, and a row's output is its experts'
 * outputs times their weights, added in expert order (plus, for Qwen2-MoE, a shared expert that
 * every row runs, times the sigmoid of its gate). */
#ifndef QWENC_MOE_H
#define QWENC_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "matmul.h"

typedef struct {
    int64_t hidden;           /* a row's width */
    int64_t n_experts, top_k; /* experts, and how many each row picks (1 .. n_experts) */
    int64_t inter;            /* each expert's intermediate width */
    int norm_topk;            /* the picked weights renormalised to sum to 1 */
    qw_product router;        /* [n_experts, hidden] */
    const qw_product *experts; /* n_experts x (gate, up [inter, hidden], down [hidden, inter]) */
    const qw_product *shared; /* (gate, up, down) of the shared expert, of width shared_inter, or NULL */
    int64_t shared_inter;     /* 0 without a shared expert */
    qw_product shared_gate;   /* [1, hidden], with shared */
} qw_moe;
/* The products' Y pointers are ignored: the step's scratch takes their outputs. */

/* Bytes of scratch qw_moe_mlp needs for T rows of m's shapes. */
size_t qw_moe_scratch_bytes(const qw_moe *m, int64_t T);

/* out[T, hidden] = the expert layer m applied to h[T, hidden] (out must not alias h); scratch
 * of qw_moe_scratch_bytes(m, T) bytes, 64-byte aligned. Every product gives a row the same bits
 * whatever other rows it holds, and the order of a row's additions depends only on its own
 * picks, so a row's result does not depend on the rest of the step. Returns 0 or QW_ENOMEM. */
int qw_moe_mlp(const qw_moe *m, const float *h, int64_t T, int act, void *scratch, float *out);

/* The routing alone, for tests: softmax of logits[T, n_experts] in place, then each row's
 * top_k experts in descending weight, ties to the lower expert (top[T, top_k]), and their
 * weights (renormalised when norm_topk). */
void qw_moe_route(float *logits, int64_t T, int64_t n_experts, int64_t top_k, int norm_topk, int32_t *top,
                  float *weight);

#endif
