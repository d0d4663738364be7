#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

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

QW_TARGET_AVX2 static void axpy_avx2(float a, const float *x, float *y, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
#endif

/* One query row against kv head's keys/values for positions 0..len-1. */
static void attend_one(const float *q, const float *Kh, const float *Vh, int64_t len, int64_t hd,
                       float scale, float *scores, float *out, int simd) {
    float (*dot)(const float *, const float *, int64_t) = dot_plain;
    void (*axpy)(float, const float *, float *, int64_t) = axpy_plain;
#if QW_HAVE_X86
    if (simd) {
        dot = dot_avx2;
        axpy = axpy_avx2;
    }
#else
    (void)simd;
#endif
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; j++) {
        scores[j] = dot(q, Kh + j * hd, hd) * scale;
        mx = scores[j] > mx ? scores[j] : mx;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < len; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    float inv = (float)(1.0 / sum);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t j = 0; j < len; j++) axpy(scores[j] * inv, Vh + j * hd, out, hd);
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
