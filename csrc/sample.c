#include "sample.h"

#include "cpu.h"

#include <math.h>
#include <stdlib.h>

#if QW_HAVE_X86
#include <immintrin.h>
#endif

/* The scan `if (x[i] > x[best]) best = i` over [a, b), started at the first value that is not
 * NaN: the first index of the largest value that is not NaN, or -1 where all are NaN. */
static int64_t first_max_plain(const float *x, int64_t a, int64_t b) {
    while (a < b && x[a] != x[a]) a++;
    if (a == b) return -1;
    int64_t best = a;
    for (int64_t i = a + 1; i < b; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

#if QW_HAVE_X86
/* The same in two passes: the largest value that is not NaN (vmaxps returns its second operand
 * when the first is NaN), then the first place it lies (-0 and +0 compare equal, as in the scan). */
QW_TARGET_AVX2 static int64_t first_max_avx2(const float *x, int64_t a, int64_t b) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = a;
    for (; i + 8 <= b; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float lane[8], mx;
    _mm256_storeu_ps(lane, m);
    mx = lane[0];
    for (int k = 1; k < 8; k++) mx = lane[k] > mx ? lane[k] : mx;
    for (; i < b; i++) mx = x[i] > mx ? x[i] : mx;
    const __m256 want = _mm256_set1_ps(mx);
    for (i = a; i + 8 <= b; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), want, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < b; i++)
        if (x[i] == mx) return i;
    return -1;
}
#endif

static int64_t first_max(const float *x, int64_t a, int64_t b) {
#if QW_HAVE_X86
    if (qw_use_avx2()) return first_max_avx2(x, a, b);
#endif
    return first_max_plain(x, a, b);
}

/* Rows from this long are split between the threads in contiguous shares: a vocabulary's logits
 * were just written by the output head's threads, each share mostly into the cache of the core
 * that reads it here; one thread reading them all took 0.2 ms of a 17 ms decode step (151,936
 * logits). */
#define ARGMAX_SPLIT 32768
#define ARGMAX_MAX_THREADS 64

int64_t qw_argmax(const float *x, int64_t n) {
    if (x[0] != x[0]) return 0; /* the scan never leaves a NaN it starts from */
    int threads = qw_get_threads();
    threads = threads > ARGMAX_MAX_THREADS ? ARGMAX_MAX_THREADS : threads;
    if (n < ARGMAX_SPLIT || threads < 2) return first_max(x, 0, n);
    int64_t found[ARGMAX_MAX_THREADS];
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) found[t] = first_max(x, n * t / threads, n * (t + 1) / threads);
    /* the shares' winners in order, a later one only when strictly larger: the whole scan's */
    int64_t best = found[0];
    for (int t = 1; t < threads; t++)
        if (found[t] >= 0 && x[found[t]] > x[best]) best = found[t];
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
