#include "moe.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "ops.h"

/* the largest top_k a row's picks are sorted for on the stack */
#define MAX_TOP_K 64

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* rows of the per-expert buffers: a step's rows, or a lone row's picked experts side by side */
static int64_t expert_rows(const qw_moe *m, int64_t T) { return T > m->top_k ? T : m->top_k; }

static int64_t widest(const qw_moe *m) {
    return m->shared_inter > m->inter ? m->shared_inter : m->inter;
}

typedef struct {
    float *logits;   /* [T, n_experts], then the router's softmax */
    int32_t *top;    /* [T, top_k] */
    float *weight;   /* [T, top_k] */
    int64_t *start;  /* [n_experts + 1]: where each expert's rows begin in rows */
    int64_t *fill;   /* [n_experts] */
    int64_t *rows;   /* [T, top_k]: the rows that picked each expert, expert by expert */
    float *wrow;     /* [T, top_k]: their weights for it */
    float *sg;       /* [T]: the shared expert's gate */
    float *x;        /* [T, hidden]: the rows of one expert, gathered */
    float *y;        /* [R, hidden]: an MLP's outputs */
    float *gate, *up; /* [R, widest] */
} scratch;

static size_t carve(const qw_moe *m, int64_t T, uint8_t *base, scratch *s) {
    int64_t R = expert_rows(m, T), I = widest(m), D = m->hidden;
    size_t at = 0;
#define TAKE(field, type, count)                                         \
    do {                                                                 \
        if (s) s->field = (type *)(base + at);                           \
        at += up64((size_t)(count) * sizeof(type));                      \
    } while (0)
    TAKE(logits, float, T * m->n_experts);
    TAKE(top, int32_t, T * m->top_k);
    TAKE(weight, float, T * m->top_k);
    TAKE(start, int64_t, m->n_experts + 1);
    TAKE(fill, int64_t, m->n_experts);
    TAKE(rows, int64_t, T * m->top_k);
    TAKE(wrow, float, T * m->top_k);
    TAKE(sg, float, T);
    TAKE(x, float, T * D);
    TAKE(y, float, R * D);
    TAKE(gate, float, R * I);
    TAKE(up, float, R * I);
#undef TAKE
    return at;
}

size_t qw_moe_scratch_bytes(const qw_moe *m, int64_t T) { return carve(m, T, NULL, NULL); }

void qw_moe_route(float *logits, int64_t T, int64_t E, int64_t k, int norm_topk, int32_t *top, float *weight) {
    qw_softmax(logits, T, E);
    for (int64_t t = 0; t < T; t++) {
        const float *p = logits + t * E;
        int32_t *idx = top + t * k;
        float *w = weight + t * k;
        int64_t n = 0;
        /* insertion into the sorted picks: an equal weight goes after the ones already there,
         * which have lower indices (a NaN weight, from NaN logits, is never picked) */
        for (int64_t e = 0; e < E; e++) {
            float v = p[e];
            int64_t i = n;
            while (i > 0 && v > w[i - 1]) i--;
            if (i >= k || !(v == v)) continue;
            int64_t last = n < k ? n : k - 1;
            for (int64_t j = last; j > i; j--) {
                w[j] = w[j - 1];
                idx[j] = idx[j - 1];
            }
            w[i] = v;
            idx[i] = (int32_t)e;
            if (n < k) n++;
        }
        /* rows of NaNs still get k distinct experts: the lowest not picked, at weight NaN */
        for (int64_t e = 0; n < k; e++) {
            int64_t j = 0;
            while (j < n && idx[j] != e) j++;
            if (j == n) {
                idx[n] = (int32_t)e;
                w[n++] = NAN;
            }
        }
        if (norm_topk) {
            float sum = 0.0f;
            for (int64_t j = 0; j < k; j++) sum += w[j];
            for (int64_t j = 0; j < k; j++) w[j] = w[j] / sum;
        }
    }
}

/* y[n, hidden] = down(silu(gate(x)) * up(x)) for the MLP (gate, up, down) of width I */
static int mlp(const qw_product *w, int64_t I, int64_t D, const float *x, int64_t n, int act, const scratch *s) {
    qw_product gu[2] = {w[0], w[1]}, down = w[2];
    gu[0].Y = s->gate;
    gu[1].Y = s->up;
    down.Y = s->y;
    if (qw_matmul_swiglu(gu, D, x, n, act)) return QW_ENOMEM;
    return qw_matmul_group(&down, 1, I, s->gate, n, act);
}

/* out[rows[i]] += y[i] * w[i], each row's add one float multiply and one float add */
static void add_rows(float *out, const float *y, const int64_t *rows, const float *w, int64_t n, int64_t D) {
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (n >= 2 && n * D >= 32768)
    for (int64_t i = 0; i < n; i++) {
        float *o = out + rows[i] * D;
        const float *yi = y + i * D;
        for (int64_t c = 0; c < D; c++) o[c] = o[c] + yi[c] * w[i];
    }
}

static void gather_rows(float *x, const float *h, const int64_t *rows, int64_t n, int64_t D) {
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (n >= 2 && n * D >= 32768)
    for (int64_t i = 0; i < n; i++) memcpy(x + i * D, h + rows[i] * D, (size_t)D * sizeof(float));
}

/* A lone row (a decode step): its experts' gate and up products in one parallel pass (they read
 * the same row), their down products one by one, the outputs added in expert order. */
static int lone_row(const qw_moe *m, const float *h, int act, const scratch *s, float *out) {
    int64_t k = m->top_k, I = m->inter, D = m->hidden;
    int32_t e[MAX_TOP_K];
    float w[MAX_TOP_K];
    for (int64_t j = 0; j < k; j++) { /* the picks in expert order */
        int64_t i = j;
        while (i > 0 && e[i - 1] > s->top[j]) {
            e[i] = e[i - 1];
            w[i] = w[i - 1];
            i--;
        }
        e[i] = s->top[j];
        w[i] = s->weight[j];
    }
    qw_product gu[2 * MAX_TOP_K] = {{0}};
    for (int64_t j = 0; j < k; j++) {
        gu[2 * j] = m->experts[3 * e[j]];
        gu[2 * j].Y = s->gate + j * I;
        gu[2 * j + 1] = m->experts[3 * e[j] + 1];
        gu[2 * j + 1].Y = s->up + j * I;
    }
    if (qw_matmul_group(gu, (int)(2 * k), D, h, 1, act)) return QW_ENOMEM;
    for (int64_t j = 0; j < k; j++) {
        qw_silu_mul(s->gate + j * I, s->up + j * I, I, s->gate + j * I);
        qw_product down = m->experts[3 * e[j] + 2];
        down.Y = s->y + j * D;
        if (qw_matmul_group(&down, 1, I, s->gate + j * I, 1, act)) return QW_ENOMEM;
    }
    const int64_t row = 0;
    for (int64_t j = 0; j < k; j++) add_rows(out, s->y + j * D, &row, w + j, 1, D);
    return 0;
}

int qw_moe_mlp(const qw_moe *m, const float *h, int64_t T, int act, void *scratch_bytes, float *out) {
    const int64_t D = m->hidden, E = m->n_experts, k = m->top_k;
    scratch s;
    carve(m, T, scratch_bytes, &s);
    qw_product router = m->router;
    router.Y = s.logits;
    if (qw_matmul_group(&router, 1, D, h, T, act)) return QW_ENOMEM;
    qw_moe_route(s.logits, T, E, k, m->norm_topk, s.top, s.weight);
    memset(out, 0, (size_t)(T * D) * sizeof(float));
    if (T == 1 && k <= MAX_TOP_K) {
        if (lone_row(m, h, act, &s, out)) return QW_ENOMEM;
    } else {
        /* each expert's rows in ascending order, by counting */
        memset(s.start, 0, (size_t)(E + 1) * sizeof(int64_t));
        for (int64_t i = 0; i < T * k; i++) s.start[s.top[i] + 1]++;
        for (int64_t e = 0; e < E; e++) {
            s.start[e + 1] += s.start[e];
            s.fill[e] = s.start[e];
        }
        for (int64_t i = 0; i < T * k; i++) {
            int64_t at = s.fill[s.top[i]]++;
            s.rows[at] = i / k;
            s.wrow[at] = s.weight[i];
        }
        for (int64_t e = 0; e < E; e++) {
            int64_t a = s.start[e], n = s.start[e + 1] - a;
            if (!n) continue;
            gather_rows(s.x, h, s.rows + a, n, D);
            if (mlp(m->experts + 3 * e, m->inter, D, s.x, n, act, &s)) return QW_ENOMEM;
            add_rows(out, s.y, s.rows + a, s.wrow + a, n, D);
        }
    }
    if (m->shared) { /* every row's shared expert, times the sigmoid of its gate */
        qw_product g = m->shared_gate;
        g.Y = s.sg;
        if (qw_matmul_group(&g, 1, D, h, T, act)) return QW_ENOMEM;
        if (mlp(m->shared, m->shared_inter, D, h, T, act, &s)) return QW_ENOMEM;
        for (int64_t t = 0; t < T; t++) {
            /* exp overflowing to inf is a gate of 0, as it should be */
            s.sg[t] = 1.0f / (1.0f + expf(-s.sg[t]));
            s.rows[t] = t; /* free again: each row adds its own */
        }
        add_rows(out, s.y, s.rows, s.sg, T, D);
    }
    return 0;
}
