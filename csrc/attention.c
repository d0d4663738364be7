#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "vecmath.h"

#if QW_HAVE_X86
#include <immintrin.h>
#endif

/* Most key slots per block the kernels take (scores of a block live on the stack). */
#define MAX_BS 256

void qw_kv_write(const float *k, const float *v, int64_t T, int64_t n_kv_heads, int64_t hd,
                 const int64_t *slots, int64_t bs, float *Kc, float *Vc) {
    for (int64_t t = 0; t < T; t++) {
        int64_t blk = slots[t] / bs, off = slots[t] % bs;
        for (int64_t h = 0; h < n_kv_heads; h++) {
            size_t dst = ((size_t)(blk * n_kv_heads + h) * bs + off) * hd;
            memcpy(Kc + dst, k + (t * n_kv_heads + h) * hd, (size_t)hd * sizeof(float));
            memcpy(Vc + dst, v + (t * n_kv_heads + h) * hd, (size_t)hd * sizeof(float));
        }
    }
}

/* ---------------------------------------------------------------- plain C
 *
 * One query row's G heads (one kv group) over n positions, block by block. Per head, m is the
 * largest score so far, l the sum of e^(s - m), acc the sum of e^(s - m) v; when a block raises
 * m, l and acc are first scaled by e^(m_old - m_new). */

static float dot_plain(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void attend_group_plain(const float *q, int64_t G, int64_t hd, const float *Kc, const float *Vc,
                               int64_t stride, int64_t bs, const int32_t *table, int64_t n, float scale,
                               float *acc, float *out) {
    float m[64], l[64], s[MAX_BS];
    for (int64_t g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(acc, 0, (size_t)(G * hd) * sizeof(float));
    for (int64_t b = 0; b * bs < n; b++) {
        int64_t nk = n - b * bs < bs ? n - b * bs : bs;
        const float *Kb = Kc + (size_t)table[b] * stride, *Vb = Vc + (size_t)table[b] * stride;
        for (int64_t g = 0; g < G; g++) {
            const float *qg = q + g * hd;
            float *a = acc + g * hd;
            float bm = -INFINITY;
            for (int64_t j = 0; j < nk; j++) {
                s[j] = dot_plain(qg, Kb + j * hd, hd) * scale;
                bm = s[j] > bm ? s[j] : bm;
            }
            if (bm > m[g]) {
                float corr = m[g] == -INFINITY ? 0.0f : expf(m[g] - bm);
                l[g] *= corr;
                for (int64_t i = 0; i < hd; i++) a[i] *= corr;
                m[g] = bm;
            }
            for (int64_t j = 0; j < nk; j++) {
                float p = expf(s[j] - m[g]);
                l[g] += p;
                const float *vj = Vb + j * hd;
                for (int64_t i = 0; i < hd; i++) a[i] += p * vj[i];
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float inv = 1.0f / l[g];
        for (int64_t i = 0; i < hd; i++) out[g * hd + i] = acc[g * hd + i] * inv;
    }
}

/* ---------------------------------------------------------------- AVX2 (hd a multiple of 8) */

#if QW_HAVE_X86
QW_TARGET_AVX2 static float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* scores s[0..nk) of one head against a block's keys: 4 keys per pass, their sums reduced together */
QW_TARGET_AVX2 static float block_scores_avx2(const float *qg, const float *Kb, int64_t nk, int64_t hd,
                                              float scale, float *s) {
    int64_t j = 0;
    __m128 m4 = _mm_set1_ps(-INFINITY);
    for (; j + 4 <= nk; j += 4) {
        const float *k0 = Kb + j * hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < hd; i += 8) {
            __m256 qv = _mm256_loadu_ps(qg + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hd + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hd + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hd + i), a3);
        }
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        s4 = _mm_mul_ps(s4, _mm_set1_ps(scale));
        _mm_storeu_ps(s + j, s4);
        m4 = _mm_max_ps(m4, s4);
    }
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float bm = _mm_cvtss_f32(m4);
    for (; j < nk; j++) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < hd; i += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), _mm256_loadu_ps(Kb + j * hd + i), a);
        s[j] = hsum8(a) * scale;
        bm = s[j] > bm ? s[j] : bm;
    }
    return bm;
}

QW_TARGET_AVX2 static void attend_group_avx2(const float *q, int64_t G, int64_t hd, const float *Kc,
                                             const float *Vc, int64_t stride, int64_t bs, const int32_t *table,
                                             int64_t n, float scale, float *acc, float *out) {
    float m[64], l[64];
    _Alignas(32) float s[MAX_BS + 8];
    for (int64_t g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(acc, 0, (size_t)(G * hd) * sizeof(float));
    for (int64_t b = 0; b * bs < n; b++) {
        int64_t nk = n - b * bs < bs ? n - b * bs : bs;
        const float *Kb = Kc + (size_t)table[b] * stride, *Vb = Vc + (size_t)table[b] * stride;
        for (int64_t g = 0; g < G; g++) {
            float *a = acc + g * hd;
            float bm = block_scores_avx2(q + g * hd, Kb, nk, hd, scale, s);
            float corr = 1.0f;
            if (bm > m[g]) {
                corr = m[g] == -INFINITY ? 0.0f : expf(m[g] - bm);
                l[g] *= corr;
                m[g] = bm;
            }
            /* p = e^(s - m), 8 at a time; slots past nk are zeroed, not left at e^-87 */
            __m256 vm = _mm256_set1_ps(m[g]), lsum = _mm256_setzero_ps();
            for (int64_t j = 0; j < nk; j += 8) {
                __m256 e = qw_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
                if (nk - j < 8) {
                    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nk - j)), idx);
                    e = _mm256_and_ps(e, _mm256_castsi256_ps(keep));
                }
                _mm256_storeu_ps(s + j, e);
                lsum = _mm256_add_ps(lsum, e);
            }
            l[g] += hsum8(lsum);
            __m256 vc = _mm256_set1_ps(corr);
            for (int64_t c = 0; c < hd; c += 64) {
                int64_t w = (hd - c < 64 ? hd - c : 64) / 8;
                __m256 r[8];
                for (int u = 0; u < w; u++) r[u] = _mm256_mul_ps(_mm256_loadu_ps(a + c + 8 * u), vc);
                for (int64_t j = 0; j < nk; j++) {
                    __m256 p = _mm256_set1_ps(s[j]);
                    const float *v = Vb + j * hd + c;
                    for (int u = 0; u < w; u++) r[u] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * u), r[u]);
                }
                for (int u = 0; u < w; u++) _mm256_storeu_ps(a + c + 8 * u, r[u]);
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        __m256 inv = _mm256_set1_ps(1.0f / l[g]);
        for (int64_t i = 0; i < hd; i += 8)
            _mm256_storeu_ps(out + g * hd + i, _mm256_mul_ps(_mm256_loadu_ps(acc + g * hd + i), inv));
    }
}
#endif

int qw_paged_attention(const float *q, int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                       const float *Kc, const float *Vc, int64_t bs, const int32_t *block_tables,
                       int64_t max_blocks, const int32_t *row_seq, const int64_t *row_pos, float scale,
                       float *out) {
    int64_t G = n_heads / n_kv_heads;
    int64_t stride = n_kv_heads * bs * hd; /* floats per block */
    if (G > 64 || bs > MAX_BS || bs < 1) return -1;
    int simd = qw_use_avx2() && hd % 8 == 0;
    (void)simd;
    int failed = 0;
#pragma omp parallel num_threads(qw_get_threads())
    {
        float *acc = malloc((size_t)(G * hd) * sizeof(float));
        if (!acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t t = 0; t < T; t++)
            for (int64_t kvh = 0; kvh < n_kv_heads; kvh++) {
                if (!acc) continue;
                const int32_t *table = block_tables + (size_t)row_seq[t] * max_blocks;
                const float *qg = q + (t * n_heads + kvh * G) * hd;
                float *og = out + (t * n_heads + kvh * G) * hd;
                const float *Kh = Kc + kvh * bs * hd, *Vh = Vc + kvh * bs * hd;
#if QW_HAVE_X86
                if (simd)
                    attend_group_avx2(qg, G, hd, Kh, Vh, stride, bs, table, row_pos[t] + 1, scale, acc, og);
                else
#endif
                    attend_group_plain(qg, G, hd, Kh, Vh, stride, bs, table, row_pos[t] + 1, scale, acc, og);
            }
        free(acc);
    }
    return failed ? -1 : 0;
}
