#include "ops.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "quant.h"
#include "vecmath.h"

/* One row's rmsnorm. The sum of squares is in double in 8 chains, value i in chain i % 8, the
 * chains then added pairwise: the same order on every path and machine (one chain in order was
 * a dependent double add a value, 1.4% of a 512-token prefill of the 1.5B model). */
static void rmsnorm_row(const float *xr, const float *w, float eps, int64_t D, float *o) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= D; i += 8)
        for (int j = 0; j < 8; j++) a[j] += (double)xr[i + j] * xr[i + j];
    for (int j = 0; i < D; i++, j++) a[j] += (double)xr[i] * xr[i];
    double ss = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    float inv = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    for (int64_t i = 0; i < D; i++) o[i] = w[i] * (xr[i] * inv);
}

void qw_rmsnorm(const float *x, const float *w, float eps, int64_t M, int64_t D, float *out) {
    /* split from a few thousand values (a batched decode step's rows) */
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (M >= 2 && M * D >= 4096)
    for (int64_t r = 0; r < M; r++) rmsnorm_row(x + r * D, w, eps, D, out + r * D);
}

void qw_add_rmsnorm(float *x, const float *y, const float *w, float eps, int64_t M, int64_t D, float *out) {
    /* the residual add on the norm's threads, row by row: alone it ran on one thread, reading
     * y from the cache of whichever core wrote it (0.8% of a 16-row decode step) */
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (M >= 2 && M * D >= 4096)
    for (int64_t r = 0; r < M; r++) {
        float *xr = x + r * D;
        for (int64_t i = 0; i < D; i++) xr[i] = xr[i] + y[r * D + i];
        rmsnorm_row(xr, w, eps, D, out + r * D);
    }
}

void qw_rope_table(int64_t T, int64_t hd, const int64_t *pos, const float *inv_freq, float mscale, float *cs) {
    int64_t half = hd / 2;
    for (int64_t t = 0; t < T; t++) {
        float p = (float)pos[t];
        for (int64_t i = 0; i < half; i++) {
            float angle = p * inv_freq[i];
            cs[t * hd + i] = (float)cos((double)angle) * mscale;
            cs[t * hd + half + i] = (float)sin((double)angle) * mscale;
        }
    }
}

void qw_rope_row(float *x, int64_t H, int64_t hd, const float *c) {
    const int64_t half = hd / 2;
    const float *s = c + half;
    for (int64_t h = 0; h < H; h++) {
        float *v = x + h * hd;
        for (int64_t i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * c[i] - b * s[i];
            v[i + half] = b * c[i] + a * s[i];
        }
    }
}

void qw_rope_apply(float *x, int64_t T, int64_t H, int64_t hd, const float *cs) {
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (T * H * hd > 65536)
    for (int64_t t = 0; t < T; t++) qw_rope_row(x + t * H * hd, H, hd, cs + t * hd);
}

static void silu_mul_plain(const float *gate, const float *up, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

#if QW_HAVE_X86
/* 8 values of silu(g) * u: every value on this path, the < 8 last ones padded, so that a value's
 * bits do not depend on where it lies in the array (a row alone, or in a batch's rows). */
QW_TARGET_AVX2 static inline void silu8(const float *gate, const float *up, float *out) {
    __m256 g = _mm256_loadu_ps(gate);
    __m256 e = qw_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), _mm256_loadu_ps(up)));
}

QW_TARGET_AVX2 static inline __attribute__((always_inline)) void silu_run(const float *gate, const float *up, int64_t n,
                                                                          float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) silu8(gate + i, up + i, out + i);
    if (i < n) {
        float g[8] = {0}, u[8] = {0}, o[8];
        memcpy(g, gate + i, (size_t)(n - i) * sizeof(float));
        memcpy(u, up + i, (size_t)(n - i) * sizeof(float));
        silu8(g, u, o);
        memcpy(out + i, o, (size_t)(n - i) * sizeof(float));
    }
}

QW_TARGET_AVX2 static void silu_mul_avx2(const float *gate, const float *up, int64_t n, float *out) {
    silu_run(gate, up, n, out);
}

QW_TARGET_AVX2 static void silu_mul_rows_avx2(const float *gate, int64_t ldg, const float *up, int64_t ldu,
                                              int64_t rows, int64_t cols, float *out, int64_t ldo) {
    for (int64_t m = 0; m < rows; m++) silu_run(gate + m * ldg, up + m * ldu, cols, out + m * ldo);
}

/* The same 16 at a time (silu8's steps, the same bits), the last < 16 of a row through silu_run:
 * the fused SwiGLU products hand over rows of 16 (8 lanes at a time were 2% of a 512-token
 * prefill of the 1.5B model). */
QW_TARGET_AVX512F static void silu_mul_rows_avx512(const float *gate, int64_t ldg, const float *up, int64_t ldu,
                                                 int64_t rows, int64_t cols, float *out, int64_t ldo) {
    const int64_t whole = cols / 16 * 16;
    for (int64_t m = 0; m < rows; m++) {
        const float *g = gate + m * ldg, *u = up + m * ldu;
        float *o = out + m * ldo;
        for (int64_t i = 0; i < whole; i += 16) {
            __m512 x = _mm512_loadu_ps(g + i);
            __m512 e = qw_exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                                                  _mm512_loadu_ps(u + i)));
        }
        if (whole < cols) silu_run(g + whole, u + whole, cols - whole, o + whole);
    }
}

QW_TARGET_AVX2 static void add_rows_avx2(const float *res, int64_t ld, const float *b, int64_t rows, int cols, float *y,
                                         int64_t ldy) {
    const int whole = cols / 8 * 8;
    for (int64_t i = 0; i < rows; i++) {
        const float *s = res + i * ld;
        float *o = y + i * ldy;
        for (int r = 0; r < whole; r += 8)
            _mm256_storeu_ps(o + r, _mm256_add_ps(_mm256_loadu_ps(s + r), _mm256_loadu_ps(b + r)));
        for (int r = whole; r < cols; r++) o[r] = s[r] + b[r];
    }
}
#endif

/* The integer products hand over their outputs in rows of 8 or 16 (a kernel's weight rows), each
 * of which goes to Y plus its bias: compiled for the baseline, those copies ran 4 floats at a time
 * or one by one (3% of a 512-token prefill of the 1.5B model). An add per value either way. */
void qw_add_rows(const float *res, int64_t ld, const float *b, int64_t rows, int cols, float *y, int64_t ldy) {
#if QW_HAVE_X86
    if (qw_use_avx2()) {
        add_rows_avx2(res, ld, b, rows, cols, y, ldy);
        return;
    }
#endif
    for (int64_t i = 0; i < rows; i++)
        for (int r = 0; r < cols; r++) y[i * ldy + r] = res[i * ld + r] + b[r];
}

void qw_silu_mul_rows(const float *gate, int64_t ldg, const float *up, int64_t ldu, int64_t rows, int64_t cols,
                      float *out, int64_t ldo) {
#if QW_HAVE_X86
    if (qw_use_avx512()) {
        silu_mul_rows_avx512(gate, ldg, up, ldu, rows, cols, out, ldo);
        return;
    }
    if (qw_use_avx2()) {
        silu_mul_rows_avx2(gate, ldg, up, ldu, rows, cols, out, ldo);
        return;
    }
#endif
    for (int64_t m = 0; m < rows; m++) silu_mul_plain(gate + m * ldg, up + m * ldu, cols, out + m * ldo);
}

/* Chunks of whole vectors; each thread takes a contiguous range. */
#define SILU_CHUNK 4096

void qw_silu_mul(const float *gate, const float *up, int64_t n, float *out) {
#if QW_HAVE_X86
    void (*f)(const float *, const float *, int64_t, float *) = qw_use_avx2() ? silu_mul_avx2 : silu_mul_plain;
#else
    void (*f)(const float *, const float *, int64_t, float *) = silu_mul_plain;
#endif
    int64_t chunks = (n + SILU_CHUNK - 1) / SILU_CHUNK;
    /* from 4 chunks: a batched decode step's 8 rows of the demo's 4,864 (38,912 values) took
     * about 20 us on one thread while the other waited */
#pragma omp parallel for num_threads(qw_get_threads()) schedule(static) if (chunks >= 4)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * SILU_CHUNK, len = n - i0 < SILU_CHUNK ? n - i0 : SILU_CHUNK;
        f(gate + i0, up + i0, len, out + i0);
    }
}

void qw_softmax(float *x, int64_t M, int64_t n) {
    for (int64_t r = 0; r < M; r++) {
        float *v = x + r * n;
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) mx = v[i] > mx ? v[i] : mx;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            v[i] = expf(v[i] - mx);
            sum += v[i];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) v[i] *= inv;
    }
}

int qw_embed(const void *E, int dtype, int64_t D, const int32_t *ids, int64_t T, float *out) {
    /* Refuse rather than widen: qw_dequant_row writes zeros for a type it has no kernel for, and
     * zero embeddings would run through the model as if they were real. */
    int bs = qw_block_size(dtype);
    if (bs == 0 || D % bs != 0) return -1;
    if (dtype >= QW_R8) { /* a tied head's repacked copy, the only one kept in memory */
        for (int64_t t = 0; t < T; t++) qw_dequant_matrix_row(dtype, E, D, ids[t], out + t * D);
        return 0;
    }
    size_t stride = qw_row_bytes(dtype, D);
    for (int64_t t = 0; t < T; t++)
        qw_dequant_row(dtype, (const uint8_t *)E + (size_t)ids[t] * stride, out + t * D, D);
    return 0;
}
