#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "vecmath.h"

#if QW_HAVE_X86
#include <immintrin.h>
#endif

static float dot_plain(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_plain(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

#if QW_HAVE_X86
QW_TARGET_AVX2 static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    float s = _mm_cvtss_f32(lo);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

#endif

/* One query row against kv head's keys/values for positions 0..len-1. */
static void attend_one_plain(const float *q, const float *Kh, const float *Vh, int64_t len, int64_t hd,
                             float scale, float *scores, float *out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; j++) {
        scores[j] = dot_plain(q, Kh + j * hd, hd) * scale;
        mx = scores[j] > mx ? scores[j] : mx;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < len; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    float inv = (float)(1.0 / sum);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t j = 0; j < len; j++) axpy_plain(scores[j] * inv, Vh + j * hd, out, hd);
}

#if QW_HAVE_X86
/* The same, vectorized where hd is a multiple of 8: scores 4 keys at a time (their 4 sums
 * reduced together), the exponentials 8 at a time, and the weighted sum of values 64 output
 * columns at a time, kept in registers across all keys. */
QW_TARGET_AVX2 static void attend_one_avx2(const float *q, const float *Kh, const float *Vh, int64_t len,
                                           int64_t hd, float scale, float *scores, float *out) {
    int64_t j = 0;
    __m128 m4 = _mm_set1_ps(-INFINITY);
    for (; j + 4 <= len; j += 4) {
        const float *k0 = Kh + j * hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < hd; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hd + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hd + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hd + i), a3);
        }
        /* [a0 a1 a2 a3] -> their 4 totals */
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        s4 = _mm_mul_ps(s4, _mm_set1_ps(scale));
        _mm_storeu_ps(scores + j, s4);
        m4 = _mm_max_ps(m4, s4);
    }
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float mx = _mm_cvtss_f32(m4);
    for (; j < len; j++) {
        scores[j] = dot_avx2(q, Kh + j * hd, hd) * scale;
        mx = scores[j] > mx ? scores[j] : mx;
    }
    __m256 vm = _mm256_set1_ps(mx);
    __m256d sum4 = _mm256_setzero_pd();
    j = 0;
    for (; j + 8 <= len; j += 8) {
        __m256 e = qw_exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vm));
        _mm256_storeu_ps(scores + j, e);
        sum4 = _mm256_add_pd(sum4, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        sum4 = _mm256_add_pd(sum4, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double parts[4];
    _mm256_storeu_pd(parts, sum4);
    double sum = (parts[0] + parts[1]) + (parts[2] + parts[3]);
    for (; j < len; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t c = 0; c < hd; c += 64) {
        int64_t w = hd - c < 64 ? hd - c : 64; /* a multiple of 8 */
        __m256 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
        for (int64_t k = 0; k < len; k++) {
            __m256 p = _mm256_set1_ps(scores[k] * inv);
            const float *v = Vh + k * hd + c;
            for (int u = 0; u < w / 8; u++) acc[u] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * u), acc[u]);
        }
        for (int u = 0; u < w / 8; u++) _mm256_storeu_ps(out + c + 8 * u, acc[u]);
    }
}
#endif

static void attend_one(const float *q, const float *Kh, const float *Vh, int64_t len, int64_t hd,
                       float scale, float *scores, float *out, int simd) {
#if QW_HAVE_X86
    if (simd && hd % 8 == 0) {
        attend_one_avx2(q, Kh, Vh, len, hd, scale, scores, out);
        return;
    }
#else
    (void)simd;
#endif
    attend_one_plain(q, Kh, Vh, len, hd, scale, scores, out);
}

void qw_attention(const float *q, const float *K, const float *V, int64_t T, int64_t start, int64_t n_heads,
                  int64_t n_kv_heads, int64_t hd, int64_t cap, float scale, float *out) {
    int64_t group = n_heads / n_kv_heads;
    int simd = qw_use_avx2();
#pragma omp parallel
    {
        float *scores = malloc((size_t)(start + T) * sizeof(float));
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < n_heads; h++) {
                if (!scores) continue;
                int64_t kvh = h / group;
                attend_one(q + (t * n_heads + h) * hd, K + kvh * cap * hd, V + kvh * cap * hd, start + t + 1,
                           hd, scale, scores, out + (t * n_heads + h) * hd, simd);
            }
        free(scores);
    }
}
