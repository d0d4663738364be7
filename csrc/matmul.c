#include "matmul.h"

#include <stdlib.h>

#include "cpu.h"
#include "fdot.h"
#include "quant.h"

/* Widened weights per tile of the f32 path: for prefill-sized M a tile stays in a core's
 * 512 KiB L2 beside the activations and is reused by all of them; for decode-sized M it stays
 * in L1, so the widened values are read back from there. Tile sizes change speed only, never a
 * result: each output is one fdot.h dot product whatever the tiling. */
#define TILE_BYTES (192 * 1024)
#define TILE_BYTES_SMALL (24 * 1024)
#define SMALL_M 4
/* Rows per work item of the integer path, and activation rows per pass over those rows: a work
 * item's weight rows stay in L2 while blocks of activation rows go past them. */
#define ROW_CHUNK 32
#define M_BLOCK 16

/* ---------------------------------------------------------------- buffers
 *
 * Owned by the thread that uses them and grown on demand, so decode allocates nothing per token:
 * the calling thread's act rows, and each worker thread's tile. */

static _Thread_local uint8_t *act_buf;
static _Thread_local size_t act_cap;
static _Thread_local float *tile_buf;
static _Thread_local size_t tile_cap;

static void *grow(void *buf, size_t *cap, size_t need) {
    if (need <= *cap) return buf;
    void *grown = qw_alloc(need);
    if (!grown) return NULL;
    qw_free(buf);
    *cap = need;
    return grown;
}

/* X's M rows as act rows (one layout for every integer type), each on its own cache lines, in
 * the calling thread's buffer; *stride = bytes per row. NULL when out of memory. */
static const uint8_t *quantize_rows(int bits, const float *X, int64_t M, int64_t K, size_t *stride) {
    size_t act = (qw_act_bytes(QW_Q8_0, K, bits) + 63) & ~(size_t)63;
    uint8_t *buf = grow(act_buf, &act_cap, act * (size_t)M);
    if (!buf) return NULL;
    act_buf = buf;
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (M >= 16)
    for (int64_t m = 0; m < M; m++) qw_quantize_act(QW_Q8_0, X + m * K, buf + (size_t)m * act, K, bits);
    *stride = act;
    return buf;
}

/* ---------------------------------------------------------------- one pass over a group
 *
 * Each product is cut into work items: tiles of widened rows (float path) or chunks of rows
 * (integer path). All the group's items go through one parallel loop (q, k and v, or gate and
 * up, in one fork/join and, on the integer path, one quantization of X). Items are handed out
 * guided: the first ones are long runs of rows (half the rows over the threads, then fewer), so
 * a thread streaming one long run keeps the hardware prefetchers ahead of it, and on a shared
 * machine a descheduled thread's items get done by the others. */

typedef struct {
    const qw_product *p;
    qw_dot_act_fn idot;   /* the integer dot, or NULL for the float path */
    size_t stride;        /* bytes per stored weight row */
    int64_t rows;         /* rows per item */
    int64_t first;        /* index of the product's first item in the group */
} plan;

/* Float path: nb rows from n0 widened into T, then each output one fdot.h dot product. */
static void float_item(const plan *pl, int64_t n0, int64_t nb, int64_t K, const float *X, int64_t M, float *T) {
    const qw_product *p = pl->p;
    for (int64_t j = 0; j < nb; j++) qw_dequant_row(p->dtype, (const uint8_t *)p->W + (size_t)(n0 + j) * pl->stride, T + j * K, K);
    qw_fdot_tile(T, nb, K, X, M, p->Y + n0, p->N);
    if (p->bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < nb; j++) p->Y[m * p->N + n0 + j] = p->Y[m * p->N + n0 + j] + p->bias[n0 + j];
}

/* Integer path: every row from n0 dotted with every act row, by the type's one kernel. */
static void int_item(const plan *pl, int64_t n0, int64_t nb, int64_t K, const uint8_t *xq, size_t xstride, int64_t M) {
    const qw_product *p = pl->p;
    for (int64_t m0 = 0; m0 < M; m0 += M_BLOCK) {
        int64_t m1 = m0 + M_BLOCK < M ? m0 + M_BLOCK : M;
        for (int64_t n = n0; n < n0 + nb; n++) {
            const uint8_t *row = (const uint8_t *)p->W + (size_t)n * pl->stride;
            float b = p->bias ? p->bias[n] : 0.0f;
            for (int64_t m = m0; m < m1; m++) p->Y[m * p->N + n] = pl->idot(row, xq + (size_t)m * xstride, K) + b;
        }
    }
}

static int run_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act) {
    plan pl[QW_GROUP_MAX];
    int64_t items = 0, tile_rows = 0;
    const uint8_t *xq = NULL;
    size_t xstride = 0;
    for (int i = 0; i < count; i++) {
        pl[i].p = &p[i];
        pl[i].idot = act ? qw_dot_act_kernel(p[i].dtype, act) : NULL;
        pl[i].stride = qw_row_bytes(p[i].dtype, K);
        if (pl[i].idot) {
            pl[i].rows = ROW_CHUNK;
            if (!xq && !(xq = quantize_rows(act, X, M, K, &xstride))) return QW_ENOMEM;
        } else {
            int64_t r = (M <= SMALL_M ? TILE_BYTES_SMALL : TILE_BYTES) / (K * (int64_t)sizeof(float));
            pl[i].rows = r < 4 ? 4 : r - r % 4;
            tile_rows = pl[i].rows > tile_rows ? pl[i].rows : tile_rows;
        }
        pl[i].first = items;
        items += (p[i].N + pl[i].rows - 1) / pl[i].rows;
    }
    int failed = 0;
#pragma omp parallel num_threads(qw_get_threads())
    {
        float *T = NULL;
        if (tile_rows) {
            T = grow(tile_buf, &tile_cap, (size_t)tile_rows * (size_t)K * sizeof(float));
            if (T)
                tile_buf = T;
            else {
#pragma omp atomic write
                failed = 1;
            }
        }
#pragma omp for schedule(guided, 1)
        for (int64_t it = 0; it < items; it++) {
            int i = 0;
            while (i + 1 < count && it >= pl[i + 1].first) i++;
            int64_t n0 = (it - pl[i].first) * pl[i].rows;
            int64_t nb = p[i].N - n0 < pl[i].rows ? p[i].N - n0 : pl[i].rows;
            if (pl[i].idot)
                int_item(&pl[i], n0, nb, K, xq, xstride, M);
            else if (T)
                float_item(&pl[i], n0, nb, K, X, M, T);
        }
    }
    return failed ? QW_ENOMEM : 0;
}

int qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
              const float *bias, int act) {
    qw_product p = {W, dtype, N, Y, bias};
    return run_group(&p, 1, K, X, M, act);
}

int qw_matmul_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act) {
    for (int i = 0; i < count; i += QW_GROUP_MAX) {
        int rc = run_group(p + i, count - i < QW_GROUP_MAX ? count - i : QW_GROUP_MAX, K, X, M, act);
        if (rc) return rc;
    }
    return 0;
}
