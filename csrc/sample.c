#include "sample.h"

#include <math.h>
#include <stdlib.h>

int64_t qw_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ---------------------------------------------------------------- top-k by a min-heap */

/* Heap order: smaller value first; on equal values the larger index is "smaller", so that among
 * ties the lowest indices survive (as a stable descending sort would keep them). */
static int heap_less(const float *val, const int32_t *idx, int64_t a, int64_t b) {
    return val[a] < val[b] || (val[a] == val[b] && idx[a] > idx[b]);
}

static void heap_swap(float *val, int32_t *idx, int64_t a, int64_t b) {
    float tv = val[a]; val[a] = val[b]; val[b] = tv;
    int32_t ti = idx[a]; idx[a] = idx[b]; idx[b] = ti;
}

static void sift_down(float *val, int32_t *idx, int64_t k, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < k && heap_less(val, idx, l, s)) s = l;
        if (r < k && heap_less(val, idx, r, s)) s = r;
        if (s == i) return;
        heap_swap(val, idx, i, s);
        i = s;
    }
}

/* Fill idx/val with the k largest logits (unordered). */
static void select_top_k(const float *logits, int64_t n, int64_t k, int32_t *idx, float *val) {
    for (int64_t i = 0; i < k; i++) {
        idx[i] = (int32_t)i;
        val[i] = logits[i];
    }
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(val, idx, k, i);
    for (int64_t i = k; i < n; i++) {
        if (logits[i] > val[0]) {
            val[0] = logits[i];
            idx[0] = (int32_t)i;
            sift_down(val, idx, k, 0);
        }
    }
}

/* ---------------------------------------------------------------- sorting candidates */

typedef struct {
    float v;
    int32_t i;
} cand_t;

/* A total order even over NaN (NaN last): qsort needs a consistent comparison. */
static int cand_desc(const void *pa, const void *pb) {
    const cand_t *a = pa, *b = pb;
    int an = isnan(a->v), bn = isnan(b->v);
    if (an != bn) return an - bn;
    if (!an && a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Allocations the tests make fail (qw_sample_fail_allocs), to prove the error path. */
static int fail_allocs;

void qw_sample_fail_allocs(int n) { fail_allocs = n; }

static void *scratch_alloc(size_t bytes) {
    if (fail_allocs > 0) {
        fail_allocs--;
        return NULL;
    }
    return malloc(bytes);
}

/* Sort candidates by descending logit (ties: lower id first). Returns 0, or -1 when the scratch
 * cannot be allocated (the candidates are then left as they were). */
static int sort_desc(int32_t *idx, float *val, int64_t c) {
    if (c < 2) return 0;
    cand_t *tmp = scratch_alloc((size_t)c * sizeof *tmp);
    if (!tmp) return -1;
    for (int64_t i = 0; i < c; i++) tmp[i] = (cand_t){val[i], idx[i]};
    qsort(tmp, (size_t)c, sizeof *tmp, cand_desc);
    for (int64_t i = 0; i < c; i++) {
        val[i] = tmp[i].v;
        idx[i] = tmp[i].i;
    }
    free(tmp);
    return 0;
}

/* ---------------------------------------------------------------- sampling */

int64_t qw_sample(float *logits, int64_t n, float temperature, int64_t top_k, float top_p, float min_p,
                  double u, int32_t *idx, float *val) {
    if (n <= 0) return QW_SAMPLE_EMPTY;
    if (temperature <= 0.0f) return qw_argmax(logits, n);
    float inv_t = 1.0f / temperature;
    for (int64_t i = 0; i < n; i++) logits[i] *= inv_t;

    int64_t best = qw_argmax(logits, n);
    float mx = logits[best];
    int64_t c; /* number of candidates in idx/val */
    double base;  /* softmax denominator the top-p cut is measured against */
    if (top_k > 0 && top_k < n) {
        select_top_k(logits, n, top_k, idx, val);
        c = top_k;
        base = 0.0;
        for (int64_t i = 0; i < c; i++) base += exp((double)(val[i] - mx));
    } else {
        base = 0.0;
        for (int64_t i = 0; i < n; i++) base += exp((double)(logits[i] - mx));
        /* A token with probability below (1 - top_p) / n can never enter the nucleus, and one
         * below min_p * p_max is cut by min-p: drop both before sorting what is left. */
        double thr = 0.0;
        if (top_p < 1.0f) thr = (1.0 - top_p) / (double)n;
        if (min_p > 0.0f && min_p / base > thr) thr = min_p / base;
        c = 0;
        for (int64_t i = 0; i < n; i++) {
            if (thr > 0.0 && exp((double)(logits[i] - mx)) / base < thr) continue;
            idx[c] = (int32_t)i;
            val[c] = logits[i];
            c++;
        }
    }
    /* The nucleus is a prefix of the candidates in descending order: unsorted, the cut below
     * would keep the wrong tokens, so no order means no draw. */
    if (top_p < 1.0f && sort_desc(idx, val, c) != 0) return QW_SAMPLE_NOMEM;

    /* val becomes unnormalised probabilities relative to the max. */
    for (int64_t i = 0; i < c; i++) val[i] = (float)exp((double)(val[i] - mx));

    if (top_p < 1.0f) {
        /* Keep the shortest prefix whose mass reaches top_p (at least one token). */
        double cum = 0.0, target = (double)top_p * base;
        int64_t keep = 0;
        while (keep < c) {
            cum += val[keep++];
            if (cum >= target) break;
        }
        c = keep;
    }
    if (min_p > 0.0f) {
        /* p_max is exp(0) = 1 in these units: keep p >= min_p. */
        int64_t w = 0;
        for (int64_t i = 0; i < c; i++)
            if (val[i] >= min_p) { /* the top token (1.0) always stays */
                val[w] = val[i];
                idx[w] = idx[i];
                w++;
            }
        c = w;
    }
    /* Only NaN logits (a model that produced NaN) leave no candidate: fall back to the first
     * maximum rather than read idx[-1]. */
    if (c == 0) return best;
    double total = 0.0;
    for (int64_t i = 0; i < c; i++) total += val[i];
    double r = u * total, acc = 0.0;
    for (int64_t i = 0; i < c; i++) {
        acc += val[i];
        if (r < acc) return idx[i];
    }
    return idx[c - 1];
}
