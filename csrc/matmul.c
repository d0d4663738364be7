#include "matmul.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "quant.h"

#if QW_HAVE_X86
#include <immintrin.h>
#endif

/* Below this many activation rows, widening weights into a tile costs more than it saves. */
#define SMALL_M 4
/* Bytes of widened weights per tile: sized to stay in a core's 512 KiB L2 beside the activations. */
#define TILE_BYTES (192 * 1024)
/* Fewest rows per work item in decode's matrix-vector products. */
#define ROW_CHUNK 32

/* ---------------------------------------------------------------- small M: fused row dots */

/* Integer paths (quant.h): each X row quantized once to 16-bit or 8-bit act rows, then every
 * weight row dotted with them on 8-bit integer multiplies. The act rows go to a buffer owned by
 * the calling thread and grown on demand, so decode allocates nothing per token. */
static _Thread_local uint8_t *act_buf;
static _Thread_local size_t act_cap;

/* X's M rows as act rows (one layout for every integer type), each on its own cache lines, in
 * the thread's buffer; *stride = bytes per row. NULL when out of memory. */
static const uint8_t *quantize_rows(int dtype, int bits, const float *X, int64_t M, int64_t K, size_t *stride) {
    size_t act = (qw_act_bytes(dtype, K, bits) + 63) & ~(size_t)63;
    if (act * (size_t)M > act_cap) {
        uint8_t *grown = aligned_alloc(64, act * (size_t)M);
        if (!grown) return NULL;
        free(act_buf);
        act_buf = grown;
        act_cap = act * (size_t)M;
    }
    for (int64_t m = 0; m < M; m++) qw_quantize_act(dtype, X + m * K, act_buf + (size_t)m * act, K, bits);
    *stride = act;
    return act_buf;
}

/* Decode-sized products of one or more matrices with the same X, as one parallel loop over all
 * their rows (q, k and v, or gate and up, in one pass: one fork/join and, on the integer paths,
 * one quantization of X). Each row's dot is the same computation as for the matrix alone. */
static void matmul_rows_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act) {
    int bits = act; /* QW_ACT_INT8 / QW_ACT_INT16 are the act rows' bits; QW_ACT_F32 is 0 */
    qw_dot_act_fn idot[QW_GROUP_MAX];
    size_t stride[QW_GROUP_MAX], xstride = 0;
    int64_t start[QW_GROUP_MAX + 1];
    const uint8_t *xq = NULL;
    start[0] = 0;
    for (int i = 0; i < count; i++) {
        idot[i] = bits ? qw_dot_act_kernel(p[i].dtype, bits) : NULL;
        if (idot[i] && !xq) {
            xq = quantize_rows(p[i].dtype, bits, X, M, K, &xstride);
            if (!xq) bits = 0; /* out of memory: the float path for all */
        }
        stride[i] = qw_row_bytes(p[i].dtype, K);
        start[i + 1] = start[i] + p[i].N;
    }
    if (!bits)
        for (int i = 0; i < count; i++) idot[i] = NULL;
    /* Chunks handed out on demand, so that on a shared machine a descheduled thread's rows get
     * done by the others instead of stalling the whole product; guided, so that the first
     * chunks are long runs of rows (half the rows over the threads, then smaller, down to
     * ROW_CHUNK): a thread streaming one long run keeps the hardware prefetchers ahead of it,
     * where short interleaved chunks left decode's products at half the memory bandwidth. */
#pragma omp parallel for num_threads(qw_get_threads()) schedule(guided, ROW_CHUNK)
    for (int64_t r = 0; r < start[count]; r++) {
        int i = 0;
        while (r >= start[i + 1]) i++;
        int64_t n = r - start[i];
        const uint8_t *row = (const uint8_t *)p[i].W + (size_t)n * stride[i];
        float b = p[i].bias ? p[i].bias[n] : 0.0f;
        for (int64_t m = 0; m < M; m++) {
            float v = idot[i] ? idot[i](row, xq + (size_t)m * xstride, K) : qw_dot_row(p[i].dtype, row, X + m * K, K);
            p[i].Y[m * p[i].N + n] = v + b;
        }
    }
}

/* ---------------------------------------------------------------- large M: widened tiles */

/* Y[m, n0 + j] = X[m] · T[j] for j < nb, all m. T is nb widened rows of K floats. */
static void tile_product_plain(const float *T, int64_t nb, int64_t K, const float *X, int64_t M,
                               float *Y, int64_t N, int64_t n0) {
    for (int64_t m = 0; m < M; m++) {
        const float *x = X + m * K;
        for (int64_t j = 0; j < nb; j++) {
            const float *t = T + j * K;
            float acc[8] = {0};
            int64_t k = 0;
            for (; k + 8 <= K; k += 8)
                for (int u = 0; u < 8; u++) acc[u] += t[k + u] * x[k + u];
            float s = 0;
            for (; k < K; k++) s += t[k] * x[k];
            for (int u = 0; u < 8; u++) s += acc[u];
            Y[m * N + n0 + j] = s;
        }
    }
}

#if QW_HAVE_X86
QW_TARGET_AVX2 static inline float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* 3 activation rows x 4 weight rows per step: 12 accumulators + 3 x loads + 1 w load = 16 ymm.
 * Each loaded vector feeds 3 or 4 FMAs, so the loop runs near the FMA ports' limit. */
QW_TARGET_AVX2 static void kernel_3x4(const float *x0, const float *x1, const float *x2,
                                      const float *T, int64_t K, float out[3][4]) {
    __m256 c[3][4];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) c[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 a0 = _mm256_loadu_ps(x0 + k), a1 = _mm256_loadu_ps(x1 + k), a2 = _mm256_loadu_ps(x2 + k);
        for (int j = 0; j < 4; j++) {
            __m256 w = _mm256_loadu_ps(T + j * K + k);
            c[0][j] = _mm256_fmadd_ps(a0, w, c[0][j]);
            c[1][j] = _mm256_fmadd_ps(a1, w, c[1][j]);
            c[2][j] = _mm256_fmadd_ps(a2, w, c[2][j]);
        }
    }
    const float *xs[3] = {x0, x1, x2};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            float s = hsum8(c[i][j]);
            for (int64_t r = k; r < K; r++) s += xs[i][r] * T[j * K + r];
            out[i][j] = s;
        }
}

QW_TARGET_AVX2 static float dot_avx2(const float *a, const float *b, int64_t K) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
    }
    for (; k + 8 <= K; k += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
    float s = hsum8(_mm256_add_ps(acc0, acc1));
    for (; k < K; k++) s += a[k] * b[k];
    return s;
}

QW_TARGET_AVX2 static void tile_product_avx2(const float *T, int64_t nb, int64_t K, const float *X,
                                             int64_t M, float *Y, int64_t N, int64_t n0) {
    int64_t m = 0;
    for (; m + 3 <= M; m += 3) {
        const float *x0 = X + m * K, *x1 = x0 + K, *x2 = x1 + K;
        int64_t j = 0;
        for (; j + 4 <= nb; j += 4) {
            float out[3][4];
            kernel_3x4(x0, x1, x2, T + j * K, K, out);
            for (int i = 0; i < 3; i++)
                for (int u = 0; u < 4; u++) Y[(m + i) * N + n0 + j + u] = out[i][u];
        }
        for (; j < nb; j++)
            for (int i = 0; i < 3; i++) Y[(m + i) * N + n0 + j] = dot_avx2(X + (m + i) * K, T + j * K, K);
    }
    for (; m < M; m++)
        for (int64_t j = 0; j < nb; j++) Y[m * N + n0 + j] = dot_avx2(X + m * K, T + j * K, K);
}
#endif

static void matmul_tiled(const uint8_t *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M,
                         float *Y, const float *bias) {
    size_t stride = qw_row_bytes(dtype, K);
    int64_t rows_per_tile = TILE_BYTES / (K * (int64_t)sizeof(float));
    rows_per_tile = rows_per_tile < 4 ? 4 : rows_per_tile - rows_per_tile % 4;
    int64_t n_tiles = (N + rows_per_tile - 1) / rows_per_tile;
    int simd = qw_use_avx2();
    (void)simd;
#pragma omp parallel num_threads(qw_get_threads())
    {
        float *T = malloc((size_t)rows_per_tile * (size_t)K * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tiles; t++) {
            int64_t n0 = t * rows_per_tile;
            int64_t nb = N - n0 < rows_per_tile ? N - n0 : rows_per_tile;
            if (!T) continue; /* out of memory: leave Y untouched rather than crash */
            for (int64_t j = 0; j < nb; j++) qw_dequant_row(dtype, W + (size_t)(n0 + j) * stride, T + j * K, K);
#if QW_HAVE_X86
            if (simd)
                tile_product_avx2(T, nb, K, X, M, Y, N, n0);
            else
#endif
                tile_product_plain(T, nb, K, X, M, Y, N, n0);
            if (bias)
                for (int64_t m = 0; m < M; m++)
                    for (int64_t j = 0; j < nb; j++) Y[m * N + n0 + j] += bias[n0 + j];
        }
        free(T);
    }
}

void qw_matmul(const void *W, int dtype, int64_t N, int64_t K, const float *X, int64_t M, float *Y,
               const float *bias, int act) {
    if (M <= SMALL_M) {
        qw_product p = {W, dtype, N, Y, bias};
        matmul_rows_group(&p, 1, K, X, M, act);
    } else {
        matmul_tiled(W, dtype, N, K, X, M, Y, bias);
    }
}

void qw_matmul_group(const qw_product *p, int count, int64_t K, const float *X, int64_t M, int act) {
    if (M <= SMALL_M && count <= QW_GROUP_MAX) {
        matmul_rows_group(p, count, K, X, M, act);
        return;
    }
    for (int i = 0; i < count; i++) qw_matmul(p[i].W, p[i].dtype, p[i].N, K, X, M, p[i].Y, p[i].bias, act);
}
