#include "forward.h"

#include "attention.h"
#include "ops.h"

/* x += y over n values, as numpy's float32 add does it. */
static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
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
        qw_rmsnorm(s->x, L->attn_norm, s->eps, T, D, s->h);
        if (qw_matmul_group(L->qkv, 3, D, s->h, T, s->act)) return QW_ENOMEM;
        if (L->q_norm) {
            qw_rmsnorm(s->q, L->q_norm, s->eps, T * H, hd, s->q);
            qw_rmsnorm(s->k, L->k_norm, s->eps, T * Hkv, hd, s->k);
        }
        qw_rope_apply(s->q, T, H, hd, s->rope);
        qw_rope_apply(s->k, T, Hkv, hd, s->rope);
        qw_kv_write(s->k, s->v, T, Hkv, hd, slots, s->n_blocks, s->bs, s->kv_type, L->Kc, L->Vc);
        if (qw_paged_attention(s->q, T, H, Hkv, hd, s->kv_type, L->Kc, L->Vc, s->n_blocks, s->bs, block_tables, max_blocks,
                               row_seq, pos, s->scale, s->attn))
            return QW_ENOMEM;
        if (qw_matmul_group(&L->o, 1, H * hd, s->attn, T, s->act)) return QW_ENOMEM;
        add_into(s->x, s->o, T * D);
        /* MLP: x + down(silu(gate) * up), gate and up from rmsnorm(x); or the layer's experts */
        qw_rmsnorm(s->x, L->mlp_norm, s->eps, T, D, s->h);
        if (L->moe) {
            if (qw_moe_mlp(L->moe, s->h, T, s->act, s->moe_scratch, s->o)) return QW_ENOMEM;
        } else {
            if (qw_matmul_swiglu(L->gate_up, D, s->h, T, s->act)) return QW_ENOMEM;
            if (qw_matmul_group(&L->down, 1, s->inter, s->gate, T, s->act)) return QW_ENOMEM;
        }
        add_into(s->x, s->o, T * D);
    }
    return 0;
}
