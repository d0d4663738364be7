#include "forward.h"

#include "attention.h"
#include "cpu.h"
#include "ops.h"

/* x += y over n values, as numpy's float32 add does it. */
static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

/* q and k rotated, then k and v stored in the cache: per token, all in one pass over the threads
 * (three passes, each alone on one thread below a prompt's size, were 1.5% of a 16-row decode
 * step, most of it the cache lines of the keys' columns). */
static void rope_and_store(const qw_stack *s, const qw_layer *L, int64_t T, const int64_t *slots) {
    const int64_t hd = s->head_dim, H = s->heads, Hkv = s->kv_heads;
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (T >= 2 && T * (H + Hkv) * hd >= 8192)
    for (int64_t t = 0; t < T; t++) {
        qw_rope_row(s->q + t * H * hd, H, hd, s->rope + t * hd);
        qw_rope_row(s->k + t * Hkv * hd, Hkv, hd, s->rope + t * hd);
        qw_kv_write_row(s->k, s->v, t, Hkv, hd, slots, s->n_blocks, s->bs, s->kv_type, L->Kc, L->Vc);
    }
}

int qw_forward_layers(const qw_stack *s, const qw_layer *layers, int n, int64_t T, const int64_t *pos,
                      const int64_t *slots, const int32_t *block_tables, int64_t max_blocks, const int32_t *row_seq) {
    const int64_t D = s->hidden, hd = s->head_dim, H = s->heads, Hkv = s->kv_heads;
    /* every layer rotates at the same positions: their cos and sin once per step, not twice per
     * layer (the sin and cos calls were 0.4% of a 128-token prefill of the demo) */
    qw_rope_table(T, hd, pos, s->inv_freq, s->rope_mscale, s->rope);
    for (int li = 0; li < n; li++) {
        const qw_layer *L = &layers[li];
        /* attention: x + o(attention(rope(q), rope(k), v)), q k v from rmsnorm(x) */
        if (li == 0) qw_rmsnorm(s->x, L->attn_norm, s->eps, T, D, s->h); /* later: with the residual add */
        if (qw_matmul_group(L->qkv, 3, D, s->h, T, s->act)) return QW_ENOMEM;
        if (L->q_norm) {
            qw_rmsnorm(s->q, L->q_norm, s->eps, T * H, hd, s->q);
            qw_rmsnorm(s->k, L->k_norm, s->eps, T * Hkv, hd, s->k);
        }
        rope_and_store(s, L, T, slots);
        if (qw_paged_attention(s->q, T, H, Hkv, hd, s->kv_type, L->Kc, L->Vc, s->n_blocks, s->bs, block_tables, max_blocks,
                               row_seq, pos, s->scale, s->attn))
            return QW_ENOMEM;
        if (qw_matmul_group(&L->o, 1, H * hd, s->attn, T, s->act)) return QW_ENOMEM;
        /* MLP: x + down(silu(gate) * up), gate and up from rmsnorm(x); or the layer's experts */
        qw_add_rmsnorm(s->x, s->o, L->mlp_norm, s->eps, T, D, s->h);
        if (L->moe) {
            if (qw_moe_mlp(L->moe, s->h, T, s->act, s->moe_scratch, s->o)) return QW_ENOMEM;
        } else {
            if (qw_matmul_swiglu(L->gate_up, D, s->h, T, s->act)) return QW_ENOMEM;
            if (qw_matmul_group(&L->down, 1, s->inter, s->gate, T, s->act)) return QW_ENOMEM;
        }
        if (li + 1 < n)
            qw_add_rmsnorm(s->x, s->o, layers[li + 1].attn_norm, s->eps, T, D, s->h);
        else
            add_into(s->x, s->o, T * D);
    }
    return 0;
}
