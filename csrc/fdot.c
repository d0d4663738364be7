/* The f32 mode's dot product in its one order (fdot.h), plain and AVX2. */
#include "fdot.h"

#include "cpu.h"

#if QW_HAVE_X86
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- plain */

static void step_plain(float *lane, const float *w, const float *x, int64_t n) {
    for (int64_t k = 0; k < n; k += 8)
        for (int u = 0; u < 8; u++) lane[u] = lane[u] + w[k + u] * x[k + u];
}

static float finish_plain(const float *lane, const float *w, const float *x, int64_t tail) {
    float s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (int64_t k = 0; k < tail; k++) s = s + w[k] * x[k];
    return s;
}

static float fdot_plain(const float *w, const float *x, int64_t K) {
    float lane[8] = {0};
    int64_t k8 = K & ~(int64_t)7;
    step_plain(lane, w, x, k8);
    return finish_plain(lane, w + k8, x + k8, K - k8);
}

static void tile_plain(const float *T, int64_t nb, int64_t K, const float *X, int64_t M, float *Y, int64_t ldy) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < nb; j++) Y[m * ldy + j] = fdot_plain(T + j * K, X + m * K, K);
}

/* ---------------------------------------------------------------- AVX2 */
#if QW_HAVE_X86

QW_TARGET_AVX2 static inline float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

QW_TARGET_AVX2 static inline float finish_avx2(__m256 acc, const float *w, const float *x, int64_t tail) {
    float s = hsum8(acc);
    for (int64_t k = 0; k < tail; k++) s = s + w[k] * x[k];
    return s;
}

QW_TARGET_AVX2 static float fdot_avx2(const float *w, const float *x, int64_t K) {
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), acc);
    return finish_avx2(acc, w + k, x + k, K - k);
}

/* 3 activation rows x 4 weight rows: 12 chains + 3 x loads + 1 w load = 16 ymm registers, each
 * loaded vector feeding 3 or 4 FMAs, so the loop runs near the FMA ports' limit. */
QW_TARGET_AVX2 static void kernel_3x4(const float *X, const float *T, int64_t K, float *Y, int64_t ldy) {
    const float *x0 = X, *x1 = X + K, *x2 = X + 2 * K;
    __m256 c[3][4];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) c[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 a0 = _mm256_loadu_ps(x0 + k), a1 = _mm256_loadu_ps(x1 + k), a2 = _mm256_loadu_ps(x2 + k);
        for (int j = 0; j < 4; j++) {
            __m256 w = _mm256_loadu_ps(T + j * K + k);
            c[0][j] = _mm256_fmadd_ps(w, a0, c[0][j]);
            c[1][j] = _mm256_fmadd_ps(w, a1, c[1][j]);
            c[2][j] = _mm256_fmadd_ps(w, a2, c[2][j]);
        }
    }
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) Y[i * ldy + j] = finish_avx2(c[i][j], T + j * K + k, X + i * K + k, K - k);
}

/* 2 activation rows x 4 weight rows (a tile's last two rows of X): 8 chains. */
QW_TARGET_AVX2 static void kernel_2x4(const float *X, const float *T, int64_t K, float *Y, int64_t ldy) {
    const float *x0 = X, *x1 = X + K;
    __m256 c[2][4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) c[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 a0 = _mm256_loadu_ps(x0 + k), a1 = _mm256_loadu_ps(x1 + k);
        for (int j = 0; j < 4; j++) {
            __m256 w = _mm256_loadu_ps(T + j * K + k);
            c[0][j] = _mm256_fmadd_ps(w, a0, c[0][j]);
            c[1][j] = _mm256_fmadd_ps(w, a1, c[1][j]);
        }
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) Y[i * ldy + j] = finish_avx2(c[i][j], T + j * K + k, X + i * K + k, K - k);
}

/* 1 activation row x 4 weight rows (decode): 4 independent chains share each x load. */
QW_TARGET_AVX2 static void kernel_1x4(const float *x, const float *T, int64_t K, float *y) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 a = _mm256_loadu_ps(x + k);
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(T + k), a, c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(T + K + k), a, c1);
        c2 = _mm256_fmadd_ps(_mm256_loadu_ps(T + 2 * K + k), a, c2);
        c3 = _mm256_fmadd_ps(_mm256_loadu_ps(T + 3 * K + k), a, c3);
    }
    y[0] = finish_avx2(c0, T + k, x + k, K - k);
    y[1] = finish_avx2(c1, T + K + k, x + k, K - k);
    y[2] = finish_avx2(c2, T + 2 * K + k, x + k, K - k);
    y[3] = finish_avx2(c3, T + 3 * K + k, x + k, K - k);
}

/* 3 activation rows x 1 weight row. */
QW_TARGET_AVX2 static void kernel_3x1(const float *X, const float *t, int64_t K, float *Y, int64_t ldy) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 w = _mm256_loadu_ps(t + k);
        c0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(X + k), c0);
        c1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(X + K + k), c1);
        c2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(X + 2 * K + k), c2);
    }
    Y[0] = finish_avx2(c0, t + k, X + k, K - k);
    Y[ldy] = finish_avx2(c1, t + k, X + K + k, K - k);
    Y[2 * ldy] = finish_avx2(c2, t + k, X + 2 * K + k, K - k);
}

QW_TARGET_AVX2 static void tile_avx2(const float *T, int64_t nb, int64_t K, const float *X, int64_t M, float *Y,
                                     int64_t ldy) {
    int64_t m = 0;
    for (; m + 3 <= M; m += 3) {
        int64_t j = 0;
        for (; j + 4 <= nb; j += 4) kernel_3x4(X + m * K, T + j * K, K, Y + m * ldy + j, ldy);
        for (; j < nb; j++) kernel_3x1(X + m * K, T + j * K, K, Y + m * ldy + j, ldy);
    }
    if (m + 2 == M) {
        int64_t j = 0;
        for (; j + 4 <= nb; j += 4) kernel_2x4(X + m * K, T + j * K, K, Y + m * ldy + j, ldy);
        for (; j < nb; j++)
            for (int64_t i = m; i < M; i++) Y[i * ldy + j] = fdot_avx2(T + j * K, X + i * K, K);
        return;
    }
    for (; m < M; m++) {
        int64_t j = 0;
        for (; j + 4 <= nb; j += 4) kernel_1x4(X + m * K, T + j * K, K, Y + m * ldy + j);
        for (; j < nb; j++) Y[m * ldy + j] = fdot_avx2(T + j * K, X + m * K, K);
    }
}

/* 4 chains of one activation row over 4 weight rows (kernel_1x4's loop on stored lanes). */
QW_TARGET_AVX2 static void steps_avx2(qw_fdot_acc *acc, const float *T, int64_t ldt, int64_t nb, const float *X,
                                      int64_t ldx, int64_t M, int64_t n) {
    for (int64_t m = 0; m < M; m++) {
        const float *x = X + m * ldx;
        qw_fdot_acc *a = acc + m * nb;
        int64_t j = 0;
        for (; j + 4 <= nb; j += 4) {
            const float *t0 = T + j * ldt, *t1 = t0 + ldt, *t2 = t1 + ldt, *t3 = t2 + ldt;
            __m256 c0 = _mm256_loadu_ps(a[j].lane), c1 = _mm256_loadu_ps(a[j + 1].lane);
            __m256 c2 = _mm256_loadu_ps(a[j + 2].lane), c3 = _mm256_loadu_ps(a[j + 3].lane);
            for (int64_t k = 0; k < n; k += 8) {
                __m256 v = _mm256_loadu_ps(x + k);
                c0 = _mm256_fmadd_ps(_mm256_loadu_ps(t0 + k), v, c0);
                c1 = _mm256_fmadd_ps(_mm256_loadu_ps(t1 + k), v, c1);
                c2 = _mm256_fmadd_ps(_mm256_loadu_ps(t2 + k), v, c2);
                c3 = _mm256_fmadd_ps(_mm256_loadu_ps(t3 + k), v, c3);
            }
            _mm256_storeu_ps(a[j].lane, c0);
            _mm256_storeu_ps(a[j + 1].lane, c1);
            _mm256_storeu_ps(a[j + 2].lane, c2);
            _mm256_storeu_ps(a[j + 3].lane, c3);
        }
        for (; j < nb; j++) {
            const float *t = T + j * ldt;
            __m256 c = _mm256_loadu_ps(a[j].lane);
            for (int64_t k = 0; k < n; k += 8) c = _mm256_fmadd_ps(_mm256_loadu_ps(t + k), _mm256_loadu_ps(x + k), c);
            _mm256_storeu_ps(a[j].lane, c);
        }
    }
}

QW_TARGET_AVX2 static void step_avx2(float *lane, const float *w, const float *x, int64_t n) {
    __m256 acc = _mm256_loadu_ps(lane);
    for (int64_t k = 0; k < n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), acc);
    _mm256_storeu_ps(lane, acc);
}

QW_TARGET_AVX2 static float finish_lanes_avx2(const float *lane, const float *w, const float *x, int64_t tail) {
    return finish_avx2(_mm256_loadu_ps(lane), w, x, tail);
}

#endif /* QW_HAVE_X86 */

/* ---------------------------------------------------------------- dispatch */

void qw_fdot_start(qw_fdot_acc *a) {
    for (int u = 0; u < 8; u++) a->lane[u] = 0.0f;
}

void qw_fdot_step(qw_fdot_acc *a, const float *w, const float *x, int64_t n) {
#if QW_HAVE_X86
    if (qw_use_avx2()) {
        step_avx2(a->lane, w, x, n);
        return;
    }
#endif
    step_plain(a->lane, w, x, n);
}

float qw_fdot_finish(const qw_fdot_acc *a, const float *w, const float *x, int64_t tail) {
#if QW_HAVE_X86
    if (qw_use_avx2()) return finish_lanes_avx2(a->lane, w, x, tail);
#endif
    return finish_plain(a->lane, w, x, tail);
}

void qw_fdot_steps(qw_fdot_acc *acc, const float *T, int64_t ldt, int64_t nb, const float *X, int64_t ldx, int64_t M,
                   int64_t n) {
#if QW_HAVE_X86
    if (qw_use_avx2()) {
        steps_avx2(acc, T, ldt, nb, X, ldx, M, n);
        return;
    }
#endif
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < nb; j++) step_plain(acc[m * nb + j].lane, T + j * ldt, X + m * ldx, n);
}

float qw_fdot(const float *w, const float *x, int64_t K) {
#if QW_HAVE_X86
    if (qw_use_avx2()) return fdot_avx2(w, x, K);
#endif
    return fdot_plain(w, x, K);
}

void qw_fdot_tile(const float *T, int64_t nb, int64_t K, const float *X, int64_t M, float *Y, int64_t ldy) {
#if QW_HAVE_X86
    if (qw_use_avx2()) {
        tile_avx2(T, nb, K, X, M, Y, ldy);
        return;
    }
#endif
    tile_plain(T, nb, K, X, M, Y, ldy);
}
