#include "matmul.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "fdot.h"
#include "kernels.h"
#include "qblock.h"
#include "ops.h"
#include "quant.h"

/* Widened weights per tile of the f32 path: for prefill-sized M a tile stays in a core's
 * 512 KiB L2 beside the activations and is reused by all of them; for decode-sized M it stays
 * in L1, so the widened values are read back from there. Tile sizes change speed only, never a
 * result: each output is one fdot.h dot product whatever the tiling. */
#define TILE_BYTES (192 * 1024)
#define TILE_BYTES_SMALL (24 * 1024)
#define SMALL_M 2
/* Rows per work item of the integer path (4 repacked groups of 8); activation rows go past
 * each group QW_R8_MAX_M at a time. */
#define ROW_CHUNK 32

/* ---------------------------------------------------------------- buffers
 *
 * Owned by the thread that uses them and grown on demand, so decode allocates nothing per token:
 * the calling thread's act rows (or pair rows), and each worker thread's tile and the act rows it
 * joins for vertical blocks. */

static _Thread_local uint8_t *act_buf;
static _Thread_local size_t act_cap;
static _Thread_local void *tile_buf;
static _Thread_local size_t tile_cap;
static _Thread_local void *pack_buf;
static _Thread_local size_t pack_cap;
static _Thread_local uint8_t *pair_buf;
static _Thread_local size_t pair_cap;
static _Thread_local void *amx_buf;
static _Thread_local size_t amx_cap;
static _Thread_local float *sum_buf;
static _Thread_local size_t sum_cap;

static void *grow(void *buf, size_t *cap, size_t need) {
    if (need <= *cap) return buf;
    void *grown = qw_alloc(need);
    if (!grown) return NULL;
    qw_free(buf);
    *cap = need;
    return grown;
}

/* A worker's buffer *buf grown to `need` bytes (NULL for none), *ok cleared when out of memory. */
static void *worker_buf(void **buf, size_t *cap, size_t need, int *ok) {
    if (!need) return NULL;
    void *b = grow(*buf, cap, need);
    if (b)
        *buf = b;
    else
        *ok = 0;
    return b;
}

/* X's M rows as act rows (one layout for every integer type), each on its own cache lines, in
 * the calling thread's buffer; *stride = bytes per row. NULL when out of memory. */
static const uint8_t *quantize_rows(int bits, const float *X, int64_t M, int64_t K, size_t *stride) {
    const size_t act = (qw_act_bytes(QW_Q8_0, K, bits) + 63) & ~(size_t)63;
    uint8_t *out = grow(act_buf, &act_cap, act * (size_t)M);
    if (!out) return NULL;
    act_buf = out;
    /* on every thread from three rows up: a batched decode step's 8 rows were quantized on one
     * thread while the other waited */
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (M >= 3)
    for (int64_t m = 0; m < M; m++) qw_quantize_act(QW_Q8_0, X + m * K, out + (size_t)m * act, K, bits);
    *stride = act;
    return out;
}

/* X's M rows as pair rows (kernels.h) for the pair kernels, which only AVX-512 CPUs have, in the
 * calling thread's buffer; *stride = bytes per pair, the odd last row paired with itself. 16 rows
 * at a time go straight into their pair rows (act_avx512.c), the work shared out by rows and,
 * below a 16-row block per thread, by blocks of K: on a Zen 5, one thread quantized the demo's 16
 * rows of 4,864 values in 19-20 us, where quantizing each pair's rows and pairing them after
 * (act.c, qw_pair_act_rows) took 45-48 us. NULL when out of memory. */
static const uint8_t *quantize_pairs(int bits, const float *X, int64_t M, int64_t K, size_t *stride) {
    const size_t act = (qw_act_bytes(QW_Q8_0, K, bits) + 63) & ~(size_t)63;
    uint8_t *out = grow(pair_buf, &pair_cap, 2 * act * (size_t)((M + 1) / 2));
    if (!out) return NULL;
    pair_buf = out;
    const int64_t groups = (M + 15) / 16, kb = K / 32;
    const int threads = qw_get_threads();
    const int64_t parts = groups >= threads ? 1 : (threads + groups - 1) / groups;
#pragma omp parallel for num_threads(threads) schedule(static) if (groups * parts >= 2)
    for (int64_t it = 0; it < groups * parts; it++) {
        const int64_t g = it / parts, j = it % parts;
        const int rows = M - 16 * g < 16 ? (int)(M - 16 * g) : 16;
        qw_quantize_pairs_avx512(X + 16 * g * K, (size_t)K, rows, K, bits, out + (size_t)(8 * g) * 2 * act, 2 * act,
                                 kb * j / parts, kb * (j + 1) / parts);
    }
    *stride = 2 * act;
    return out;
}

/* X's M rows as vertical blocks of 8 (qblock.h's VERT_*), *stride bytes per block: each block's
 * rows are quantized and joined into the thread's own buffer and transposed from there. NULL
 * when out of memory. */
static const uint8_t *quantize_vertical(const float *X, int64_t M, int64_t K, size_t *stride) {
    const size_t act = (qw_act_bytes(QW_Q8_0, K, 16) + 63) & ~(size_t)63, row = (JOINED_BYTES(K) + 63) & ~(size_t)63;
    const size_t blk = (VERT_BYTES(K) + 63) & ~(size_t)63;
    const int64_t nblk = (M + 7) / 8;
    uint8_t *out = grow(pair_buf, &pair_cap, blk * (size_t)nblk);
    if (!out) return NULL;
    pair_buf = out;
    int failed = 0;
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (M >= 16)
    for (int64_t v = 0; v < nblk; v++) {
        uint8_t *work = grow(act_buf, &act_cap, act + 8 * row);
        if (!work) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        act_buf = work;
        const int rows = M - 8 * v < 8 ? (int)(M - 8 * v) : 8;
        for (int r = 0; r < rows; r++) {
            qw_quantize_act(QW_Q8_0, X + (8 * v + r) * K, work, K, 16);
            qw_join_act_rows(work, work + act + (size_t)r * row, K);
        }
        qw_vertical_act_rows(work + act, row, rows, out + (size_t)v * blk, K);
    }
    *stride = blk;
    return failed ? NULL : out;
}

/* X's rows for the AMX kernels: the first 16 * (M / 16) as AMX blocks (kernels.h; with bf16, the
 * bf16 kernels' form), *block bytes each, quantized straight into them, then the rest as plain act
 * rows, *stride bytes each. NULL when out of memory. */
static const uint8_t *quantize_amx(int bits, int bf16, const float *X, int64_t M, int64_t K, size_t *block,
                                   size_t *stride) {
    const size_t used = qw_act_bytes(QW_Q8_0, K, bits), act = (used + 63) & ~(size_t)63;
    const size_t per = bf16 ? QW_AMX_ACT_BLOCK_BF16 : QW_AMX_ACT_BLOCK(bits);
    const size_t blk = ((size_t)(K / 32) * per + 63) & ~(size_t)63;
    const int64_t nblk = M / 16;
    /* fewer 16-row blocks than threads (a batched decode step has one): each block's K in parts */
    const int threads = qw_get_threads();
    const int64_t parts = nblk >= threads ? 1 : (threads + nblk - 1) / nblk, kb = K / 32;
    const int64_t items = nblk * parts + M % 16;
    uint8_t *out = grow(pair_buf, &pair_cap, blk * (size_t)nblk + act * (size_t)(M % 16));
    if (!out) return NULL;
    pair_buf = out;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t it = 0; it < items; it++) {
        if (it < nblk * parts) {
            const int64_t i = it / parts, j = it % parts, b0 = kb * j / parts, b1 = kb * (j + 1) / parts;
            qw_amx_quantize_x86(X + 16 * i * K + 32 * b0, (size_t)K, 32 * (b1 - b0), bits, bf16,
                                out + (size_t)i * blk + (size_t)b0 * per);
        } else { /* a plain row past the blocks */
            int64_t m = 16 * nblk + (it - nblk * parts);
            qw_quantize_act(QW_Q8_0, X + m * K, out + (size_t)nblk * blk + (size_t)(m - 16 * nblk) * act, K, bits);
        }
    }
    *block = blk;
    *stride = act;
    return out;
}

/* ---------------------------------------------------------------- one pass over a group
 *
 * Each product is cut into work items: tiles of widened rows (float path) or chunks of rows
 * (integer path). All the group's items go through one parallel loop (q, k and v, or gate and
 * up, in one fork/join and, on the integer path, one quantization of X). Items are handed out
 * guided: the first ones are long runs of rows (half the rows over the threads, then fewer), so
 * a thread streaming one long run keeps the hardware prefetchers ahead of it, and on a shared
 * machine a descheduled thread's items get done by the others. */

typedef struct plan {
    const qw_product *p;
    const struct plan *mate; /* a swiglu group's up product, on the gate's plan: its items take both */
    qw_r8_fn idot;        /* the integer product, or NULL for the float path */
    qw_r8_two_fn idot2;   /* with pair rows, its two-group form where the type has one, else NULL */
    int base;             /* the stored type (W's type, or the one it was repacked from) */
    int repacked;         /* W is in the R8 layout */
    int pairs;            /* idot is a pair kernel: the act rows are pair rows */
    int vertical;         /* idot is a vertical kernel: the act rows are in blocks of 8 */
    qw_amx_fn amx;        /* the AMX product for whole blocks of 16 act rows, or NULL */
    size_t amx_block;     /* with amx: bytes per AMX block; the act rows past the blocks are plain */
    float *sums;          /* with amx over K in passes: the AMX sums kept between passes (pair g's for
                           * act block j at sums + (g * sum_blocks + j) * 256), then the min sums */
    int64_t sum_blocks;   /* act blocks of M */
    size_t sum_half;      /* floats from a sum to its min sum */
    size_t stride;        /* bytes per stored row; per 8-row group when repacked */
    int64_t rows;         /* rows per item */
    int64_t first;        /* index of the product's first item in the group */
} plan;

/* Float path for decode-sized M on stored weights: 4 rows at a time, widened in registers
 * (AVX2) or PIECE values at a time into T in L1 (plain), each output's chain continued in
 * fdot.h's order, as the tiles compute it. */
#define PIECE 256
static void float_item_small(const plan *pl, int64_t n0, int64_t nb, int64_t K, const float *X, int64_t M, float *T) {
    const qw_product *p = pl->p;
    int64_t bs = qw_block_size(p->dtype), bb = qw_block_bytes(p->dtype), k8 = K & ~(int64_t)7;
    qw_fdot_acc acc[SMALL_M * 4];
    for (int64_t j0 = n0; j0 < n0 + nb; j0 += 4) {
        int64_t rows = n0 + nb - j0 < 4 ? n0 + nb - j0 : 4;
        const uint8_t *w = (const uint8_t *)p->W + (size_t)j0 * pl->stride;
        for (int64_t i = 0; i < M * rows; i++) qw_fdot_start(&acc[i]);
#if QW_HAVE_X86
        if (qw_use_avx2()) /* widened in registers */
            for (int64_t m = 0; m < M; m++) qw_fdot_rows_avx2(p->dtype, w, pl->stride, (int)rows, X + m * K, K, acc + m * rows);
        else
#endif
        if (p->dtype == QW_F32)
            qw_fdot_steps(acc, (const float *)w, K, rows, X, K, M, k8);
        else
            for (int64_t k0 = 0; k0 < k8; k0 += PIECE) {
                int64_t len = k8 - k0 < PIECE ? k8 - k0 : PIECE; /* a multiple of the block: k8 = K for block types */
                for (int64_t j = 0; j < rows; j++) qw_dequant_row(p->dtype, w + (size_t)j * pl->stride + k0 / bs * bb, T + j * PIECE, len);
                qw_fdot_steps(acc, T, PIECE, rows, X + k0, K, M, len);
            }
        for (int64_t j = 0; j < rows; j++) {
            const float *tail = (const float *)(w + (size_t)j * pl->stride) + k8;
            if (p->dtype != QW_F32 && K > k8) { /* float types only: the < 8 last values */
                qw_dequant_row(p->dtype, w + (size_t)j * pl->stride + k8 * bb, T, K - k8);
                tail = T;
            }
            for (int64_t m = 0; m < M; m++) {
                float v = qw_fdot_finish(&acc[m * rows + j], tail, X + m * K + k8, K - k8);
                p->Y[m * p->N + j0 + j] = p->bias ? v + p->bias[j0 + j] : v;
            }
        }
    }
}

#if QW_HAVE_X86
/* Float path at small M on a repacked BF16 matrix (AVX2): whole groups from n0 (a multiple of 8),
 * each act row's chains through them (qw_fdot_group_bf16_avx2), as float_item_small runs them on
 * stored rows. */
static void float_item_groups(const plan *pl, int64_t n0, int64_t nb, int64_t K, const float *X, int64_t M) {
    const qw_product *p = pl->p;
    size_t gb = qw_r8_group_bytes(QW_BF16, K);
    qw_fdot_acc acc[8];
    for (int64_t g0 = n0; g0 < n0 + nb; g0 += 8) {
        int rows = n0 + nb - g0 < 8 ? (int)(n0 + nb - g0) : 8;
        const uint8_t *g = (const uint8_t *)p->W + (size_t)(g0 / 8) * gb;
        for (int64_t m = 0; m < M; m++) {
            for (int j = 0; j < rows; j++) qw_fdot_start(&acc[j]);
            qw_fdot_group_bf16_avx2(g, rows, X + m * K, K, acc);
            for (int j = 0; j < rows; j++) {
                float v = qw_fdot_finish(&acc[j], NULL, NULL, 0); /* K is a multiple of 8: no tail */
                p->Y[m * p->N + g0 + j] = p->bias ? v + p->bias[g0 + j] : v;
            }
        }
    }
}
#endif

/* Float path: nb rows from n0 widened into T, then each output one fdot.h dot product. */
static void float_item(const plan *pl, int64_t n0, int64_t nb, int64_t K, const float *X, int64_t M, float *T) {
    const qw_product *p = pl->p;
    qw_dequant_matrix_rows(p->dtype, p->W, K, n0, nb, T);
    qw_fdot_tile(T, nb, K, X, M, p->Y + n0, p->N);
    if (p->bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < nb; j++) p->Y[m * p->N + n0 + j] = p->Y[m * p->N + n0 + j] + p->bias[n0 + j];
}

/* Added where a product has no bias: + 0.0f, as on every path (it turns a -0.0 into +0.0). */
static const float no_bias[16];

/* A kernel's outputs (row i at res + i * ld, `rows` <= 16 of them) for act rows m .. m + count - 1
 * and weight rows g0 .. g0 + rows - 1 into Y, each plus its bias (or no_bias). */
static void put_outputs(const qw_product *p, int64_t m, int64_t count, int64_t g0, int rows, const float *res,
                        int64_t ld) {
    qw_add_rows(res, ld, p->bias ? p->bias + g0 : no_bias, count, rows, p->Y + m * p->N + g0, p->N);
}

/* The repacked groups of rows n0 .. n0 + nb: in place, or repacked into pack. */
static const uint8_t *item_groups(const plan *pl, int64_t n0, int64_t nb, int64_t K, uint8_t *pack) {
    size_t gb = qw_r8_group_bytes(pl->base, K);
    if (pl->repacked) return (const uint8_t *)pl->p->W + (size_t)(n0 / 8) * gb;
    for (int64_t g0 = n0; g0 < n0 + nb; g0 += 8) {
        int rows = n0 + nb - g0 < 8 ? (int)(n0 + nb - g0) : 8;
        qw_repack_group(pl->base, (const uint8_t *)pl->p->W + (size_t)g0 * pl->stride, pl->stride, rows, K,
                        pack + (size_t)((g0 - n0) / 8) * gb);
    }
    return pack;
}

/* One pass of the integer items over K's blocks b0 .. b1 (all of K but for a product that goes
 * over K in passes: run_group), with the AMX kernels' QW_AMX_FIRST / QW_AMX_LAST. */
typedef struct {
    int64_t b0, b1;
    int flags;
} kpass;

/* Integer path: rows n0 .. n0 + nb (whole groups of 8 but for the matrix's last rows) against
 * act rows m0 .. m1, QW_R8_MAX_M at a time, all the item's groups for one 16-row block before
 * the next block (which then comes from L2 for every group). Stored weights are repacked into
 * `pack` first, the whole item at once. Neither order nor blocking changes a result: each output
 * is one kernel call's, for the same 16-row block, whatever the order. */
static void product_item(const plan *pl, int64_t n0, int64_t nb, int64_t K, const uint8_t *xq, size_t xstride,
                         int64_t m0, int64_t m1, uint8_t *pack, uint8_t *amx, const kpass *ks) {
    const qw_product *p = pl->p;
    size_t gb = qw_r8_group_bytes(pl->base, K);
    float out[2 * QW_R8_MAX_M * 8];
    const uint8_t *groups = item_groups(pl, n0, nb, K, pack);
    if (pl->amx && m1 - m0 >= 16) {
        /* the round's whole 16-row blocks: two groups at a time, each pair unpacked once for all
         * of them (xq holds the AMX blocks, then the plain rows of a short last block) */
        const int64_t nblk = (m1 - m0) / 16;
        for (int64_t g0 = n0; g0 < n0 + nb; g0 += 16) {
            int rows = n0 + nb - g0 < 16 ? (int)(n0 + nb - g0) : 16;
            const uint8_t *ga = groups + (size_t)((g0 - n0) / 8) * gb;
            float *res = (float *)(amx + QW_AMX_WORK(nblk)), *macc = QW_AMX_MACC(amx);
            if (pl->sums) {
                res = pl->sums + ((size_t)(g0 / 16) * (size_t)pl->sum_blocks + (size_t)(m0 / 16)) * 256;
                macc = res + pl->sum_half;
            }
            pl->amx(ga, rows > 8 ? ga + gb : NULL, xq + (size_t)(m0 / 16) * pl->amx_block, pl->amx_block, nblk, amx,
                    res, macc, ks->b0, ks->b1, ks->flags);
            if (ks->flags & QW_AMX_LAST) put_outputs(p, m0, 16 * nblk, g0, rows, res, 16);
        }
        m0 += 16 * nblk;
    }
    if (!(ks->flags & QW_AMX_FIRST)) return; /* the other rows go in the first pass, over all of K */
    for (int64_t m = m0; m < m1; m += QW_R8_MAX_M) {
        int64_t mb = m1 - m < QW_R8_MAX_M ? m1 - m : QW_R8_MAX_M;
        const uint8_t *x = xq + (size_t)(pl->pairs ? m / 2 : pl->vertical ? m / 8 : m) * xstride;
        /* a short last block after AMX blocks: plain rows (same bits) */
        if (pl->amx) x = xq + (size_t)(m / 16) * pl->amx_block;
        for (int64_t g0 = n0; g0 < n0 + nb; g0 += 8) {
            int rows = n0 + nb - g0 < 8 ? (int)(n0 + nb - g0) : 8;
            /* m is a multiple of QW_R8_MAX_M, so even: pair m / 2 starts there */
            const uint8_t *group = groups + (size_t)((g0 - n0) / 8) * gb;
            if (pl->idot2 && (mb == 16 || mb == 8) && n0 + nb - g0 >= 16) { /* two whole groups at once */
                pl->idot2(group, K, x, xstride, mb, out);
                put_outputs(p, m, mb, g0, 8, out, 8);
                put_outputs(p, m, mb, g0 + 8, 8, out + mb * 8, 8);
                g0 += 8;
                continue;
            }
            pl->idot(group, K, x, xstride, mb, out);
            put_outputs(p, m, mb, g0, rows, out, 8);
        }
    }
}

/* A fused swiglu group's item (run_group): the gate's rows n0 .. n0 + nb and the up product's same
 * rows (on AMX whole 16-row pieces: N is a multiple of 16), then silu(gate) * up into the gate's Y
 * with qw_silu_mul's arithmetic. The AMX blocks' gate and up outputs stay in the thread's work
 * area; other act rows (every row off AMX, or a short last block's) go through both Ys, the item's
 * rows read back while they are in the cache. */
static void gated_item(const plan *pl, int64_t n0, int64_t nb, int64_t K, const uint8_t *xq, size_t xstride,
                       int64_t m0, int64_t m1, uint8_t *pack, uint8_t *amx) {
    const plan *up = pl->mate;
    const qw_product *p = pl->p, *q = up->p;
    const int64_t N = p->N;
    const kpass whole = {0, K / 32, QW_AMX_FIRST | QW_AMX_LAST};
    if (pl->amx && m1 - m0 >= 16) {
        const size_t gb = qw_r8_group_bytes(pl->base, K), ub = qw_r8_group_bytes(up->base, K);
        const uint8_t *gg = item_groups(pl, n0, nb, K, pack), *gu = item_groups(up, n0, nb, K, pack + gb * (size_t)(nb / 8));
        const int64_t nblk = (m1 - m0) / 16;
        float *res = (float *)(amx + QW_AMX_WORK(nblk)), *ures = res + 256 * nblk;
        const uint8_t *xa = xq + (size_t)(m0 / 16) * pl->amx_block;
        for (int64_t g0 = n0; g0 < n0 + nb; g0 += 16) {
            const uint8_t *a = gg + (size_t)((g0 - n0) / 8) * gb, *b = gu + (size_t)((g0 - n0) / 8) * ub;
            pl->amx(a, a + gb, xa, pl->amx_block, nblk, amx, res, QW_AMX_MACC(amx), whole.b0, whole.b1, whole.flags);
            up->amx(b, b + ub, xa, up->amx_block, nblk, amx, ures, QW_AMX_MACC(amx), whole.b0, whole.b1, whole.flags);
            /* the biases added where the outputs are, and silu(gate) * up written to Y once
             * (the gate's outputs put into Y and read back cost a pass over Y's lines) */
            qw_add_rows(res, 16, p->bias ? p->bias + g0 : no_bias, 16 * nblk, 16, res, 16);
            qw_add_rows(ures, 16, q->bias ? q->bias + g0 : no_bias, 16 * nblk, 16, ures, 16);
            qw_silu_mul_rows(res, 16, ures, 16, 16 * nblk, 16, p->Y + m0 * N + g0, N);
        }
        m0 += 16 * nblk;
    }
    if (m0 < m1) {
        product_item(pl, n0, nb, K, xq, xstride, m0, m1, pack, amx, &whole);
        product_item(up, n0, nb, K, xq, xstride, m0, m1, pack, amx, &whole);
        qw_silu_mul_rows(p->Y + m0 * N + n0, N, q->Y + m0 * N + n0, N, m1 - m0, nb, p->Y + m0 * N + n0, N);
    }
}

static void int_item(const plan *pl, int64_t n0, int64_t nb, int64_t K, const uint8_t *xq, size_t xstride, int64_t m0,
                     int64_t m1, uint8_t *pack, uint8_t *amx, const kpass *ks) {
    if (pl->mate)
        gated_item(pl, n0, nb, K, xq, xstride, m0, m1, pack, amx);
    else
        product_item(pl, n0, nb, K, xq, xstride, m0, m1, pack, amx, ks);
}

/* Act rows per round of the integer path: every weight row of the group passes one round's act
 * rows before the next round starts, so the rows being read stay in the cache for all the
 * weights, which are read again once per round. Streaming all of a long prompt's act rows past
 * each weight group instead (12 MB of 16-bit act rows for a 512-token down projection of the
 * 1.5B model, beyond what the last-level cache keeps) ran that projection at a third of its
 * speed. Rounds are equal, in whole 16-row blocks: the threads share out the items of unequal
 * rounds badly (one is left with a long round while the other finishes a short one).
 *
 * A round's bytes: 1 MiB was measured on a Xeon with 2 MiB of L2 a core. On a Zen 4 with 1 MiB,
 * rounds that large left each core's L2 short of the round's rows: rounds of 64-256 KiB
 * prefilled the 1.5B model's 512 tokens 5-6% faster (int16 and int8), 128 KiB doing best across
 * 128- and 512-token prompts and on the 0.5B (+2-4%), while 384 KiB and 512 KiB were slower than
 * 1 MiB. So an eighth of the L2 where it is under 2 MiB, as the OS reports it, else 1 MiB. */
#define ACT_ROUND_BYTES_MAX (1024 * 1024)

static size_t round_bytes; /* 0: not yet chosen; every thread would choose the same */

size_t qw_act_round_bytes(void) {
    size_t b = __atomic_load_n(&round_bytes, __ATOMIC_RELAXED);
    if (b == 0) {
        size_t l2 = qw_cpu_l2_bytes();
        b = l2 > 0 && l2 < 2 * ACT_ROUND_BYTES_MAX ? l2 / 8 : ACT_ROUND_BYTES_MAX;
        __atomic_store_n(&round_bytes, b, __ATOMIC_RELAXED);
    }
    return b;
}

void qw_set_act_round_bytes(size_t bytes) { __atomic_store_n(&round_bytes, bytes, __ATOMIC_RELAXED); }

static int64_t act_round_rows(size_t row_bytes, int64_t M) {
    const size_t round = qw_act_round_bytes();
    int64_t rounds = (int64_t)(((size_t)M * row_bytes + round - 1) / round);
    int64_t per = (M + rounds - 1) / rounds;
    per = (per + QW_R8_MAX_M - 1) / QW_R8_MAX_M * QW_R8_MAX_M;
    return per < M ? per : M;
}

/* Whether M 16-bit act rows go on vertical blocks (the path has their kernels and the count
 * pays). A vertical block costs the same for 1 to 8 rows, so a short last block wastes lanes; the
 * two-level kernels cost about the same per row at any count. In batched decode of the demo model
 * on a Zen 3 (2 threads) a vertical block of 8 cost what 5.5 two-level rows did: at 5 rows the
 * two levels were 17% faster, at 6 the two even, at 7 the block 12% faster; at 9 rows the two
 * levels were 12% faster, at 10 the two even within the noise, at 11 the blocks 7% faster, and
 * from 12 on the blocks (at 4 rows: 106-110 against 77-79 tok/s, at 8: 143 against 112-120).
 * The cost is the type's: alone, one thread, a block of 8 cost 5-6 rows of Q6_K, 6 of Q8_0, 7 of
 * Q5_0 and 8 of Q4_K (a block of 16: 4.6-4.9, 5.4, 6 and 7 per 8), so the 1.5B model (mostly
 * Q4_K) lost 12% at 6 rows and broke even at 7 and 11; one rule for every type keeps the demo's. */
int qw_vertical_pays(int64_t M) {
    const int64_t blocks = (M + 7) / 8;
    return M >= 1 && 11 * blocks <= 2 * M && qw_r8_kernel_vertical(QW_Q8_0) != NULL;
}

/* The product whose items of its kind (integer or float) hold item w of that kind: each kind's
 * products number their items from `first`, in order. */
static int product_of(const plan *pl, int count, int is_int, int64_t w) {
    int i = 0;
    for (int j = 0; j < count; j++)
        if ((pl[j].idot != NULL) == is_int && w >= pl[j].first) i = j;
    return i;
}

/* The stored type of W's dtype (the one it was repacked from, if repacked). */
static int stored_type(int dtype) { return dtype >= QW_R8 ? dtype - QW_R8 : dtype; }

/* The bf16 AMX blocks (kernels.h) take twice the int8 form's bytes, so a round holds half the act
 * rows and each weight pair is unpacked twice as often; below this many rows a round lost more to
 * that than the bf16 tiles saved (the 1.5B's Q4_K down projection, K = 8960: 7-12% slower), but
 * for Q6_K, whose four tile stores per block become two. */
#define BF16_MIN_ROUND_ROWS 64

/* Whether every integer product of a group has a bf16 AMX kernel (the path has AMX-BF16): the
 * act rows are laid out once, in one form, for all of them. *all_q6k: all of them are Q6_K. */
static int group_has_bf16(const qw_product *p, int count, int act, int *all_q6k) {
    *all_q6k = 1;
    for (int i = 0; i < count; i++) {
        int base = stored_type(p[i].dtype);
        if (!qw_r8_kernel(base, act)) continue; /* a float-path product */
        if (!qw_amx_kernel_bf16(base)) return 0;
        if (base != QW_Q6_K) *all_q6k = 0;
    }
    return 1;
}

/* K's blocks per pass of an AMX product. A round holds all of K for its act rows, so where K is
 * long the rounds were short: the 1.5B model's down projection (K = 8960) had rounds of 32 rows
 * for its Q6_K matrices on bf16 tiles (64 on int8 tiles for Q4_K), each weight block unpacked
 * again for every 2 act blocks, and ran at 70-75% of the rate of its gate and up products. From
 * 64 act rows such a product goes over K in passes instead, each a round of PASS_ROWS rows of a
 * K segment (the same bytes), with the kernels' sums kept between passes (2 x 4 bytes an output,
 * in the calling thread's buffer). The sums are continued block by block, as in one pass. */
#define PASS_ROWS 128

static int64_t pass_blocks(int64_t kb, size_t per, int64_t M) {
    const int64_t want = M / 16 * 16 < PASS_ROWS ? M / 16 * 16 : PASS_ROWS;
    if (want < 64) return kb;
    int64_t fit = (int64_t)(qw_act_round_bytes() / (per / 16 * (size_t)want));
    if (fit >= kb) return kb;
    if (fit < QW_AMX_CHUNK) fit = QW_AMX_CHUNK;
    const int64_t passes = (kb + fit - 1) / fit, seg = (kb + passes - 1) / passes;
    return (seg + QW_AMX_CHUNK - 1) / QW_AMX_CHUNK * QW_AMX_CHUNK; /* whole chunks of unpacking */
}

/* swiglu: p[0] and p[1] (count 2) are an MLP's gate and up products, and silu(gate) * up goes into
 * p[0].Y: fused where both take the integer path (on AMX, in whole 16-row pieces), else after the
 * products. Fused off AMX, the demo's 16-row batched step no longer makes a pass of its own over
 * the outputs (its gate and up 1.5-5.5% faster in four runs on a Zen 5; 8 rows and decode
 * within 2%). */
static int run_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act, int swiglu) {
    plan pl[QW_GROUP_MAX];
    int64_t float_items = 0, round_items = 0, tile_rows = 0;
    size_t pack_bytes = 0;
    const uint8_t *xq = NULL;
    size_t xstride = 0, amx_block = 0;
    /* blocks of 16 act rows go on AMX tiles where the path has them (plain rows); else several
     * act rows go in pairs where the SIMD path has pair kernels */
    int amx = act && M >= 16 && qw_amx_kernel(QW_Q8_0, act) != NULL;
    int pairs = !amx && act && M >= 2 && qw_r8_kernel_pairs(QW_Q8_0, act) != NULL;
    int all_q6k = 0, has_bf16 = amx && act == 16 && group_has_bf16(p, count, act, &all_q6k);
    /* a fused SwiGLU group's items write silu(gate) * up when done, so it goes over K at once */
    const int64_t kb = K / 32,
                  seg = amx && !swiglu ? pass_blocks(kb, has_bf16 ? QW_AMX_ACT_BLOCK_BF16 : QW_AMX_ACT_BLOCK(act), M) : kb,
                  passes = seg < kb ? (kb + seg - 1) / seg : 1;
    int bf16 = has_bf16 && (all_q6k || (size_t)seg * QW_AMX_ACT_BLOCK_BF16 / 16 * BF16_MIN_ROUND_ROWS <= qw_act_round_bytes());
    /* or as vertical blocks of joined rows, where they pay (same bits either way) */
    int vertical = !amx && !pairs && act == 16 && qw_vertical_pays(M);
    for (int i = 0; i < count; i++) {
        pl[i].p = &p[i];
        pl[i].mate = NULL;
        pl[i].repacked = p[i].dtype >= QW_R8;
        pl[i].base = stored_type(p[i].dtype);
        pl[i].pairs = pairs;
        pl[i].vertical = vertical;
        pl[i].idot = !act ? NULL : pairs ? qw_r8_kernel_pairs(pl[i].base, act)
                   : vertical ? qw_r8_kernel_vertical(pl[i].base) : qw_r8_kernel(pl[i].base, act);
        pl[i].idot2 = pairs && act ? qw_r8_kernel_pairs2(pl[i].base, act) : NULL;
        pl[i].amx = !amx || !pl[i].idot ? NULL : bf16 ? qw_amx_kernel_bf16(pl[i].base) : qw_amx_kernel(pl[i].base, act);
        pl[i].stride = qw_row_bytes(p[i].dtype, K);
        if (pl[i].idot) {
            pl[i].rows = ROW_CHUNK;
            size_t item_bytes = qw_r8_group_bytes(pl[i].base, K) * (ROW_CHUNK / 8);
            if (!pl[i].repacked && item_bytes > pack_bytes) pack_bytes = item_bytes;
            if (!xq && amx && !(xq = quantize_amx(act, bf16, X, M, K, &amx_block, &xstride))) return QW_ENOMEM;
            if (!xq && vertical && !(xq = quantize_vertical(X, M, K, &xstride))) return QW_ENOMEM;
            if (!xq && pairs && !(xq = quantize_pairs(act, X, M, K, &xstride))) return QW_ENOMEM;
            if (!xq && !(xq = quantize_rows(act, X, M, K, &xstride))) return QW_ENOMEM;
            pl[i].first = round_items;
            round_items += (p[i].N + pl[i].rows - 1) / pl[i].rows;
        } else {
            int64_t r = (M <= SMALL_M ? TILE_BYTES_SMALL : TILE_BYTES) / (K * (int64_t)sizeof(float));
            pl[i].rows = r < 4 ? 4 : r - r % 4;
            if (pl[i].repacked && pl[i].base == QW_BF16) /* whole groups (float_item_groups) */
                pl[i].rows = pl[i].rows < 8 ? 8 : pl[i].rows - pl[i].rows % 8;
            /* the small-M path needs 4 rows of PIECE values; the tiles their rows of K */
            int64_t need = M <= SMALL_M && !pl[i].repacked ? (4 * PIECE + K - 1) / K : pl[i].rows;
            tile_rows = need > tile_rows ? need : tile_rows;
            pl[i].first = float_items;
            float_items += (p[i].N + pl[i].rows - 1) / pl[i].rows;
        }
    }
    /* items: the float products' tiles (each over all M rows), then the integer products'
     * chunks round by round */
    for (int i = 0; i < count; i++) pl[i].amx_block = amx_block;
    const int fused = swiglu && p[0].N == p[1].N && pl[0].idot && pl[1].idot &&
                      (pl[0].amx && pl[1].amx ? p[0].N % 16 == 0 : !pl[0].amx && !pl[1].amx);
    if (fused) { /* the up product's rows go with the gate's items (and their repacking) */
        pl[0].mate = &pl[1];
        round_items = pl[1].first;
        count = 1;
        pack_bytes *= 2;
    }
    int64_t round_rows = !xq ? M
                         : act_round_rows(amx ? (size_t)seg * (bf16 ? QW_AMX_ACT_BLOCK_BF16 : QW_AMX_ACT_BLOCK(act)) / 16
                                          : pairs ? xstride / 2 : vertical ? xstride / 8 : xstride, M);
    size_t sum_floats = 0;
    for (int i = 0; i < count; i++) {
        pl[i].sums = NULL;
        pl[i].sum_blocks = M / 16;
        pl[i].sum_half = (size_t)((p[i].N + 15) / 16) * (size_t)(M / 16) * 256;
        if (passes > 1 && pl[i].amx) sum_floats += 2 * pl[i].sum_half;
    }
    if (sum_floats) {
        float *b = grow(sum_buf, &sum_cap, sum_floats * sizeof(float));
        if (!b) return QW_ENOMEM;
        sum_buf = b;
        for (int i = 0; i < count; i++)
            if (pl[i].amx) {
                pl[i].sums = b;
                b += 2 * pl[i].sum_half;
            }
    }
    int64_t rounds = round_items ? (M + round_rows - 1) / round_rows : 0;
    /* each thread's AMX work area: two groups unpacked, then a round's outputs for them */
    size_t amx_bytes = amx ? QW_AMX_WORK(round_rows / 16) + (size_t)(fused ? 2 : 1) * round_rows * 16 * sizeof(float) : 0;
    int64_t items = float_items + rounds * round_items;
    int failed = 0;
#pragma omp parallel num_threads(qw_get_threads())
    {
        int ok = 1;
        float *T = worker_buf(&tile_buf, &tile_cap, (size_t)tile_rows * (size_t)K * sizeof(float), &ok);
        uint8_t *pack = worker_buf(&pack_buf, &pack_cap, pack_bytes, &ok);
        uint8_t *amxw = worker_buf(&amx_buf, &amx_cap, amx_bytes, &ok);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        for (int64_t s = 0; s < passes; s++) {
            const kpass ks = {s * seg, (s + 1) * seg < kb ? (s + 1) * seg : kb,
                              (s == 0 ? QW_AMX_FIRST : 0) | (s == passes - 1 ? QW_AMX_LAST : 0)};
#pragma omp for schedule(guided, 1)
            for (int64_t it = s == 0 ? 0 : float_items; it < items; it++) {
                if (!ok) continue;
                int is_int = it >= float_items;
                int64_t w = is_int ? (it - float_items) % round_items : it;
                int i = product_of(pl, count, is_int, w);
                int64_t n0 = (w - pl[i].first) * pl[i].rows;
                int64_t nb = p[i].N - n0 < pl[i].rows ? p[i].N - n0 : pl[i].rows;
                if (is_int) {
                    /* the last round (the short one when M is not a multiple of the rounds) comes
                     * first: the guided loop's first share is half the items, and when it held the
                     * long rounds only, the other thread ran out of items and waited for it (the
                     * demo's 128-row up projection, rounds of 48, 48 and 32 rows: 11% of both
                     * threads' time in the barrier) */
                    int64_t m0 = ((it - float_items) / round_items + rounds - 1) % rounds * round_rows;
                    int_item(&pl[i], n0, nb, K, xq, xstride, m0, M - m0 < round_rows ? M : m0 + round_rows, pack, amxw, &ks);
                } else if (M <= SMALL_M && !pl[i].repacked)
                    float_item_small(&pl[i], n0, nb, K, X, M, T);
#if QW_HAVE_X86
                else if (M <= SMALL_M && pl[i].base == QW_BF16 && qw_use_avx2())
                    float_item_groups(&pl[i], n0, nb, K, X, M);
#endif
                else
                    float_item(&pl[i], n0, nb, K, X, M, T);
            }
        }
        if (amx) qw_amx_release_x86();
    }
    if (failed) return QW_ENOMEM;
    if (swiglu && !fused) qw_silu_mul(p[0].Y, p[1].Y, M * p[0].N, p[0].Y);
    return 0;
}

int qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
              const float *bias, int act) {
    qw_product p = {W, dtype, N, Y, bias};
    return run_group(&p, 1, K, X, M, act, 0);
}

int qw_matmul_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act) {
    for (int i = 0; i < count; i += QW_GROUP_MAX) {
        int rc = run_group(p + i, count - i < QW_GROUP_MAX ? count - i : QW_GROUP_MAX, K, X, M, act, 0);
        if (rc) return rc;
    }
    return 0;
}

int qw_matmul_swiglu(const qw_product p[2], int64_t K, const float *X, int64_t M, int act) {
    return run_group(p, 2, K, X, M, act, 1);
}
